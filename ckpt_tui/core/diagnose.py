"""Inventory -> [Finding]. Pure: reads the facts the scan gathered, touches no file.

Each finding says what happened, why it matters and the exact next step. ``fix`` names
the repair or export that applies (the id ``ckpt-tui fix --only`` and the TUI take). Every code,
its severities, help line and fix id are registered in ``codes.CODES``.
"""

from __future__ import annotations

import re
import shlex
from contextvars import ContextVar
from typing import Callable, Optional, TypeVar, cast

from .codes import CODES  # noqa: F401  (diagnose.CODES, as before) every code raised here, registered once
from .dtypes import short_dtype
from .facts import (
    DcpFacts,
    DeepSpeedUniversalFacts,
    DeepSpeedZeroFacts,
    DirFacts,
    LeftoverFacts,
    TensorFacts,
    TextFacts,
    VerlFacts,
)
from .formats.dcp.format import merges_with_accelerate
from .formats.deepspeed.reader import OPTIM_STATES_RE
from .names import step_of
from .storage import is_url
from .types import SEVERITY_RANK, Finding, Inventory, Node, numel, shell_path, user_path
from .units import param_count

_T = TypeVar("_T")
# what one diagnose() call has already worked out about the tree (keyed by kind and node path), so a question
# asked once per file (is the checkpoint beside it intact?) costs one walk of the tree, not one per file
_MEMO: ContextVar[Optional[dict]] = ContextVar("diagnose_memo", default=None)


def _memo(key: tuple, compute: Callable[[], _T]) -> _T:
    memo = _MEMO.get()
    if memo is None:  # called outside diagnose (a repair's plan): nothing to share
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def diagnose(inv: Inventory) -> list[Finding]:
    out: list[Finding] = []
    root = inv.root
    token = _MEMO.set({"root": root})
    try:
        for n in root.walk():
            out.extend(_node_findings(inv, n))
    finally:
        _MEMO.reset(token)
    if inv.layout == "unknown" and not any(f.severity == "error" for f in out):
        out.append(
            Finding(
                "not-a-checkpoint",
                "error",
                ".",
                f"{inv.shown()} is not a checkpoint ckpt-tui recognises: no DCP .metadata/.distcp, no "
                "DeepSpeed model/optim states, no safetensors or torch state dict. Point ckpt-tui at a "
                "checkpoint folder (e.g. checkpoint-2000/) or a run folder that holds them.",
            )
        )
    if is_url(inv.given):  # object storage: repairs, universal and convert write beside the checkpoint
        out = [_read_only(f) for f in out]
    out.sort(key=lambda f: (SEVERITY_RANK[f.severity], f.path, f.code))
    return out


def _read_only(f: Finding) -> Finding:
    """``f`` without the repair or the command that would write beside a checkpoint in object storage (they
    refuse a URL); an export command stays (it reads the URL and writes a local OUT)."""
    from dataclasses import replace

    keep = f.command is not None and f.command.startswith("ckpt-tui export ")
    return replace(f, fix=f.fix if f.fix == "export" else None, command=f.command if keep else None)


def mark_complete(inv: Inventory, findings: list[Finding]) -> None:
    """Set ``complete`` on each checkpoint of a run folder: no error finding inside it."""
    broken = set()  # every folder at or above an error: one pass over the findings, not one per checkpoint
    for f in findings:
        if f.severity == "error":
            parts = f.path.split("/")
            broken.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    errors_at_root = any(f.severity == "error" for f in findings)
    for ck in inv.checkpoints:
        ck["complete"] = not (errors_at_root if ck["path"] == "." else ck["path"] in broken)


def _node_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = n.facts
    out: list[Finding] = []
    p = n.path
    where = f"`{inv.shown(p)}`"
    if f.get("special"):
        out.append(
            Finding(
                "special-file",
                "warning",
                p,
                f"{where} is a {f['special']}, not a file; it was skipped without being opened.",
            )
        )
    if n.format == "leftover":
        out.append(_leftover_finding(inv, n))
    kind = f.get("error_kind")
    if kind:
        msg = f.get("error", "")
        if kind == "truncated":
            out.append(
                Finding(
                    "file-truncated",
                    "error",
                    p,
                    f"{where} is truncated: {msg}. Copy it again from the "
                    "source or fall back to an earlier complete checkpoint." + _sibling_hint(inv, n),
                )
            )
        elif kind == "corrupt":
            out.append(
                Finding(
                    "file-corrupt",
                    "error",
                    p,
                    f"{where} is corrupt: {msg}. Copy it again from the "
                    "source or fall back to an earlier complete checkpoint." + _sibling_hint(inv, n),
                )
            )
        elif kind == "permission":
            out.append(
                Finding(
                    "unreadable",
                    "error",
                    p,
                    f"{where}: {msg}. Check its owner and mode (`ls -l`), or run as a user who can read it.",
                )
            )
        elif kind in ("loop", "broken-link"):
            out.append(Finding("unreadable", "warning", p, f"{where}: {msg}."))
        elif kind in ("too-deep", "too-many", "too-large", "unreadable"):
            out.append(Finding("unreadable", "warning", p, f"{where}: {msg}."))
    if f.get("unsafe_globals"):
        g = ", ".join(f["unsafe_globals"][:6])
        sev = "info" if inv.trust_pickles else "error"
        out.append(
            Finding(
                "unsafe-pickle",
                sev,
                p,
                f"{where} is a pickle that names code outside ckpt-tui's allowlist "
                f"({g}). Loading it would run that code; ckpt-tui read it without running anything. "
                "If you trust where it came from, pass --trust-pickles.",
            )
        )
    if n.format == "dcp":
        out.extend(_dcp_findings(inv, n))
    elif n.format == "deepspeed-zero":
        out.extend(_ds_findings(inv, n))
    elif n.format == "verl-fsdp":
        out.extend(_verl_findings(inv, n))
    elif n.format == "deepspeed-universal":
        if f.get("incomplete_params"):
            out.append(
                Finding(
                    "shard-missing",
                    "error",
                    p,
                    f"universal checkpoint `{inv.shown(p, slash=True)}` has "
                    f"parameter folders without fp32.pt: {', '.join(f['incomplete_params'][:6])}. The "
                    "conversion was interrupted; run it again.",
                )
            )
    if n.is_dir:
        out.extend(_dir_findings(inv, n))
    if n.role == "marker" and not n.is_dir:
        out.extend(_marker_findings(inv, n))
    if not n.is_dir and n.role in ("model",) and n.format in ("safetensors", "torch-zip"):
        dts = [d for d in f.get("dtypes") or [] if d.startswith(("float", "bfloat"))]
        if len(dts) > 1:
            out.append(
                Finding(
                    "mixed-dtypes",
                    "info",
                    p,
                    f"{where} mixes floating dtypes ({', '.join(dts)}); an "
                    "export must keep them as stored or cast deliberately.",
                )
            )
        if f.get("tied"):
            pairs = "; ".join(" = ".join(t) for t in f["tied"][:3])
            export = _export_command(inv, p)
            out.append(
                Finding(
                    "tied-weights",
                    "info",
                    p,
                    f"{where} holds tensors that share storage ({pairs}). "
                    'safetensors refuses shared tensors ("Some tensors share memory"): write each tied '
                    f"tensor once, as transformers' save_pretrained does (`{export}` does).",
                    "export",
                    export,
                )
            )
    return out


_LEFTOVER_WHAT = {
    "temp-folder": "temp folder",
    "staging-folder": "staging folder",
    "old-output": "old output folder",
    "lock": "lock file",
    "temp-file": "temp file",
}


def _leftover_finding(inv: Inventory, n: Node) -> Finding:
    """``leftover-temp``: what a killed ckpt-tui run left (facts from leftovers.recognise); how to be rid of it."""
    from .units import naturalsize

    f = cast(LeftoverFacts, n.facts)
    p = n.path
    where = f"`{inv.shown(p)}`"
    what = _LEFTOVER_WHAT.get(f.get("leftover_kind", ""), "temp entry")
    command = f.get("leftover_of", "ckpt-tui")
    files = f.get("leftover_files", 0)
    size = naturalsize(n.size) + (f", {files:,} file{'s' if files != 1 else ''}" if n.is_dir else "")
    parent = p.rsplit("/", 1)[0] if "/" in p else "."
    if f.get("leftover_held"):
        return Finding(
            "leftover-temp",
            "info",
            p,
            f"{where} is the {what} of a {command} still running ({size}; it "
            "holds its lock): leave it, it goes when that run ends.",
        )
    if command == "ckpt-tui export":
        out = f.get("leftover_out", "")
        nxt = f"the next ckpt-tui export into {shell_path(inv.given, f'{parent}/{out}' if parent != '.' else out)}"
    elif command == "ckpt-tui fix":
        nxt = f"the next ckpt-tui fix that rewrites {f.get('leftover_out', '')} beside it"
    else:
        nxt = f"the next {command} writing its output in {shell_path(inv.given, parent)}"
    if f.get("leftover_restores"):
        back = shell_path(inv.given, f"{parent}/{f['leftover_restores']}" if parent != "." else f["leftover_restores"])
        return Finding(
            "leftover-temp",
            "warning",
            p,
            f"{where} is the previous output an --overwrite was replacing "
            f"when it was killed ({size}), and {back} is gone: {nxt} renames it back, or do it now: "
            f"`mv -- {shell_path(inv.given, p)} {back}`.",
        )
    rm = f"rm -rf -- {shell_path(inv.given, p)}" if n.is_dir else f"rm -- {shell_path(inv.given, p)}"
    return Finding(
        "leftover-temp",
        "warning",
        p,
        f"{where} is a {what} a killed {command} left ({size}); "
        f"{'its partial files were' if n.is_dir else 'it was'} not read. {nxt[0].upper()}{nxt[1:]} sweeps it, or remove it now: `{rm}`.",
    )


def _export_command(inv: Inventory, rel: str) -> str:
    """The export line for the weights at ``rel`` (``DIR``: the user's choice of output folder)."""
    return f"ckpt-tui export {inv.shown(rel)} --out DIR"


def _sibling_hint(inv: Inventory, n: Node) -> str:
    s = last_complete_sibling(inv, n)
    return f" The newest other checkpoint here is `{inv.shown(s, slash=True)}`." if s else ""


def _checkpoint_of(n: Node) -> Optional[str]:
    parts = n.path.split("/")
    for i in range(len(parts), 0, -1):
        if step_of(parts[i - 1]) is not None:
            return "/".join(parts[:i])
    return None


def last_complete_sibling(inv: Inventory, n: Node) -> Optional[str]:
    """The newest other checkpoint beside the one holding ``n`` with no sign of breakage."""
    mine = _checkpoint_of(n)
    if mine is None:
        return None
    parent = mine.rsplit("/", 1)[0] if "/" in mine else "."
    newest = _memo(("intact", parent), lambda: _two_newest_intact(inv, parent))
    return next((path for _, path in newest if path != mine), None)


def _two_newest_intact(inv: Inventory, parent: str) -> list[tuple[int, str]]:
    """The two newest checkpoints in ``parent`` with no sign of breakage, newest first: the newest other
    than any one of them is among these two (one question per folder, not per checkpoint in it)."""
    pnode = inv.node(parent)
    if pnode is None:
        return []
    cands = []
    for c in pnode.children:
        step = step_of(c.name) if c.is_dir else None
        if step is not None and not _has_breakage(c):
            cands.append((step, c.path))
    return sorted(cands, reverse=True)[:2]


def _has_breakage(n: Node) -> bool:
    """Is a file or folder at or below ``n`` truncated, corrupt or missing files? (Within diagnose: from one
    walk of the whole tree.)"""
    memo = _MEMO.get()
    if memo is None:
        return any(_broken_here(x) for x in n.walk())
    if "breakage" not in memo:
        memo["breakage"] = broken = set()

        def visit(x: Node) -> bool:
            bad = _broken_here(x)
            for c in x.children:
                bad = visit(c) or bad
            if bad:
                broken.add(id(x))
            return bad

        visit(memo["root"])
    return id(n) in memo["breakage"]


def _broken_here(x: Node) -> bool:
    f = x.facts
    return bool(f.get("error_kind") in ("truncated", "corrupt") or f.get("metadata_missing") or f.get("missing_files"))


def _dcp_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = cast(DcpFacts, n.facts)
    p = n.path
    out = []
    if f.get("metadata_missing"):
        ranks = f.get("ranks_present") or []
        tmp = n.child(".metadata.tmp") is not None
        cmd = f"ckpt-tui fix {inv.shown(p)} --only dcp-metadata" if tmp else None
        out.append(
            Finding(
                "dcp-metadata-missing",
                "error",
                p,
                f"`{inv.shown(p, slash=True)}` has {f.get('shard_files', 0)} .distcp shard file(s) (ranks "
                f"{_ranks(ranks)}) but no .metadata: the save was interrupted before rank 0 wrote it (or "
                ".metadata exists only on another node's disk). Nothing can load this folder; copy .metadata "
                "from the node that wrote it, or use an earlier complete checkpoint."
                + _sibling_hint(inv, n)
                + (
                    f" A complete .metadata.tmp may survive (the final rename was interrupted): `{cmd}`." if tmp else ""
                ),
                "dcp-metadata" if tmp else None,
                cmd,
            )
        )
    if f.get("missing_files"):
        miss = f["missing_files"]
        out.append(
            Finding(
                "shard-missing",
                "error",
                p,
                f"`{inv.shown(p + '/.metadata')}` names {len(miss)} file(s) that are not here: {', '.join(miss[:6])}. "
                "Copy them from the nodes that wrote them (each rank writes its own); without them the "
                "tensors they hold cannot be loaded.",
            )
        )
    meta = f"`{inv.shown(p + '/' + ((f.get('metadata_files') or ['.metadata'])[0]))}`"
    if f.get("chunk_gaps"):
        names = ", ".join(f["chunk_gaps"])
        out.append(
            Finding(
                "dcp-chunk-gap",
                "error",
                p,
                f"{meta} gives tensors chunks that leave part of them unwritten ({names}): no file holds "
                "those values, and torch's DCP loader would leave them as whatever memory held. A rank's "
                "chunk records are missing from the metadata; use an earlier complete checkpoint."
                + _sibling_hint(inv, n),
            )
        )
    if f.get("chunk_overlaps"):
        names = ", ".join(f["chunk_overlaps"])
        out.append(
            Finding(
                "dcp-chunk-overlap",
                "warning",
                p,
                f"{meta} gives tensors chunks that overlap ({names}): two records hold the same "
                "elements, and which one a load keeps is the loader's order. ckpt-tui exports them as "
                "torch's DCP loader reads them; compare the result with what you expect.",
            )
        )
    lost = _megatron_files_missing(inv, n)
    if lost:
        them = "it" if len(lost) == 1 else "them"
        out.append(
            Finding(
                "megatron-files-missing",
                "error",
                p,
                f"`{inv.shown(p, slash=True)}` is a Megatron-Core torch_dist checkpoint without "
                f"{' and '.join(lost)}: rank 0 writes {them} beside .metadata, and megatron's "
                "dist_checkpointing.load refuses the folder without "
                f"{them} (metadata.json says it is a distributed checkpoint; common.pt holds the "
                "iteration, the args and every non-tensor state). Copy "
                f"{them} from rank 0's node, or use an earlier complete checkpoint.",
            )
        )
    if f.get("unreferenced_files"):
        extra = f["unreferenced_files"]
        out.append(
            Finding(
                "world-size-mismatch",
                "warning",
                p,
                f"`{inv.shown(p, slash=True)}` holds shard files that .metadata does not reference ({', '.join(extra[:6])}): "
                "left over from a save with a different world size. They are ignored on load; remove "
                "them to avoid confusion.",
            )
        )
    return out


def _verl_findings(inv: Inventory, n: Node) -> list[Finding]:
    """A verl actor folder: every rank's model/optim/extra_state file of its world size, and one world size."""
    f = cast(VerlFacts, n.facts)
    p = n.path
    out = []
    where = f"`{inv.shown(p, slash=True)}`"
    world = f.get("world_size")
    if f.get("missing_files"):
        miss = f["missing_files"]
        out.append(
            Finding(
                "shard-missing",
                "error",
                p,
                f"{where} lacks {len(miss)} rank file(s) of its world size {world}: {', '.join(miss[:6])}. "
                "Each rank saves its own shard: without every rank's model file the full weights cannot be "
                "rebuilt (verl's model merger fails too). Copy them from the nodes that wrote them, or use an "
                "earlier complete checkpoint." + _sibling_hint(inv, n),
            )
        )
    worlds = f.get("rank_file_worlds") or []
    if len(worlds) > 1:
        out.append(
            Finding(
                "world-size-mismatch",
                "error",
                p,
                f"{where} mixes rank files of world sizes {', '.join(map(str, worlds))}: a save from a run "
                "with another number of ranks was left here. verl loads model_world_size_<its world "
                "size>_rank_*.pt; remove the stale files.",
            )
        )
    cw = f.get("config_world_size")
    if cw is not None and world is not None and cw != world:
        out.append(
            Finding(
                "world-size-mismatch",
                "error",
                p,
                f"{where}: fsdp_config.json says world_size {cw} but the rank files are named for world size "
                f"{world}. verl's model merger reads the world size from fsdp_config.json and would look for "
                f"model_world_size_{cw}_rank_*.pt; the config or the files are from another save.",
            )
        )
    return out


def _megatron_files_missing(inv: Inventory, n: Node) -> list[str]:
    """The files Megatron-Core's dist_checkpointing.save writes beside a DCP (rank 0 only) that are not there,
    for a DCP folder that megatron wrote: it has one of them, or it is an ``iter_N/`` of a Megatron run."""
    names = {c.name for c in n.children}
    ours = {"metadata.json", "common.pt"} & names
    mcore_json = "metadata.json" in ours and bool(cast(DcpFacts, n.facts).get("tensor_parallel"))
    parent = inv.root.find(n.path.rsplit("/", 1)[0] if "/" in n.path else ".") if n.path != "." else None
    in_run = (
        re.match(r"^iter_\d+$", n.name) is not None
        and parent is not None
        and parent.child("latest_checkpointed_iteration.txt") is not None
    )
    if not (mcore_json or "common.pt" in ours or in_run):
        return []
    return [f for f in ("metadata.json", "common.pt") if f not in names]


def _ranks(rs) -> str:
    if not rs:
        return "none"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"{rs[0]}–{rs[-1]}"
    return ", ".join(str(r) for r in rs)


def _ds_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = cast(DeepSpeedZeroFacts, n.facts)
    p = n.path
    out = []
    stage = f.get("zero_stage")
    # BF16_Optimizer, stage 0 and pipeline tags: ds_to_universal fails on them whatever the info says
    if stage in (1, 2) and f.get("universal_checkpoint_info") is False and f.get("ds_layout", "zero") == "zero":
        out.append(_universal_info_finding(inv, n))
    if f.get("missing_files"):
        miss = f["missing_files"]
        ws = f.get("world_size")
        if f.get("ds_layout") == "pipeline":
            shape = (
                f" of {f['pipeline_stages']} stages ({f.get('dp_world_size') or '?'} data-parallel rank(s) each)"
                if f.get("pipeline_stages")
                else ""
            )
            msg = (
                f"`{inv.shown(p, slash=True)}` is a pipeline{shape} but {len(miss)} of its file(s) are "
                f"missing: {', '.join(miss[:6])}. Copy them from the nodes that wrote them; the model and "
                "optimizer state cannot be rebuilt without every stage's and every layer's file."
            )
        else:
            msg = (
                f"`{inv.shown(p, slash=True)}` was saved by {ws} data-parallel rank(s) but {len(miss)} rank file(s) "
                f"are missing: {', '.join(miss[:6])}. Copy them from the nodes that wrote them; the fp32 "
                "weights and optimizer state cannot be rebuilt without every rank."
            )
        command = None
        ms = n.child("mp_rank_00_model_states.pt")
        if (
            stage in (1, 2)
            and ms is not None
            and "error" not in ms.facts
            and all(OPTIM_STATES_RE.match(m) for m in miss)
        ):
            command = f"ckpt-tui export {inv.shown(p)} --from-module-states --out DIR"
            dt = f.get("train_dtype")
            msg += (
                f" The module weights in {inv.shown(ms.path)} are intact: `{command}` exports those "
                f"({'half precision, ' + short_dtype(dt) if dt else 'the training dtype'}, NOT the fp32 masters)."
            )
        out.append(Finding("shard-missing", "error", p, msg, command=command))
    if f.get("extra_rank_files") or f.get("partition_mismatch"):
        extra = f.get("extra_rank_files") or []
        msg = f"`{inv.shown(p, slash=True)}` records dp_world_size={f.get('world_size')}"
        if f.get("partition_mismatch"):
            msg += f" but its optimizer states were partitioned {f['partition_mismatch']} ways"
        if extra:
            msg += f" but also holds {', '.join(extra[:4])} from more ranks"
        out.append(
            Finding(
                "world-size-mismatch",
                "error" if f.get("partition_mismatch") else "warning",
                p,
                msg + ": files from two different runs are mixed. Keep only the files of one save.",
            )
        )
    frozen = f.get("frozen_params")
    export = None if tag_broken(n) else _export_command(inv, p)  # an export of a broken tag refuses
    if frozen:
        out.append(
            Finding(
                "frozen-params",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` has {len(frozen)} frozen parameter(s) ({', '.join(frozen[:4])}) "
                "with no optimizer state. zero_to_fp32 rebuilds them from frozen_param_fragments; a universal "
                "checkpoint restores only optimizer-tracked parameters, so frozen ones keep what the model was "
                "built with." + (f" `{export}` writes them beside the trained ones." if export else ""),
                "export",
                export,
            )
        )
    elif f.get("frozen_params_unrecorded"):
        out.append(
            Finding(
                "frozen-params",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` holds {param_count(f['frozen_params_unrecorded'])} frozen "
                f"parameter values that ZeRO-{stage} did not record: DeepSpeed's zero_to_fp32 drops them "
                "silently. Their values are only in the model-states `module` weights (in the training "
                "dtype)" + (f"; `{export}` takes them from there." if export else "."),
                "export",
                export,
            )
        )
    if f.get("shared_params"):
        pairs = "; ".join(f"{a} = {b}" for a, b in list(f["shared_params"].items())[:3])
        out.append(
            Finding(
                "tied-weights",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` has tied weights ({pairs}). zero_to_fp32 --safe_serialization "
                'fails on these ("Some tensors share memory"); its get_fp32_state_dict_from_zero_checkpoint '
                "still returns both names."
                + (f" `{export}` writes each tied tensor once, as save_pretrained does." if export else ""),
                "export",
                export,
            )
        )
    if f.get("moe"):
        out.append(
            Finding(
                "world-size-mismatch",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` is a mixture-of-experts DeepSpeed checkpoint; export and universal "
                "conversion of this layout are not supported by ckpt-tui yet.",
            )
        )
    elif f.get("pipeline") and f.get("ranks_present"):  # pipeline + ZeRO-1/BF16_Optimizer: masters in optim files
        out.append(
            Finding(
                "world-size-mismatch",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` is a pipeline-parallel DeepSpeed checkpoint with ZeRO "
                "optimizer-states files; ckpt-tui exports its layer files' weights, not the fp32 masters "
                "or optimizer state in those files, and universal conversion of this layout is not "
                "supported by ckpt-tui yet.",
            )
        )
    return out


def _universal_info_finding(inv: Inventory, tag: Node) -> Finding:
    """A ZeRO-1/2 tag without universal_checkpoint_info: a warning that says how to convert it, or,
    where its universal checkpoint is already beside it and complete, an info that says how to load it."""
    p = tag.path
    uni, why_not = universal_beside(inv, tag)
    if uni is not None:
        return Finding(
            "universal-info-missing",
            "info",
            p,
            f"`{inv.shown(p, slash=True)}` has no `universal_checkpoint_info`, which DeepSpeed's "
            "ds_to_universal needs, but it has been converted already: "
            f"`{inv.shown(uni.path, slash=True)}` is its universal checkpoint ({uni.facts.get('param_folders')} "
            "parameters, every state file there), loadable at any world size.\n" + _load_instructions(inv, tag, uni),
        )
    again = (
        f" `{inv.shown(why_not[0], slash=True)}` is there but {why_not[1]}: remove it "
        f"(`rm -r {inv.shown(why_not[0])}`) before converting again."
        if why_not
        else ""
    )
    fix = f"ckpt-tui fix {inv.shown(p)} --only universal-info"
    head = (
        f"`{inv.shown(p + '/mp_rank_00_model_states.pt')}` has no `universal_checkpoint_info`, so "
        "DeepSpeed's ds_to_universal will stop with \"Required universal_checkpoint_info state is "
        'missing". '
    )
    if tag_broken(tag):  # the converter needs every rank's files whole: no command that would fail
        return Finding(
            "universal-info-missing",
            "warning",
            p,
            head + "Converting it to a universal checkpoint needs every rank's files whole: fix the "
            f"errors in `{inv.shown(p, slash=True)}` first (ckpt-tui universal converts it then). To add "
            f"the key in place for other tools: `{fix}`.",
            "universal-info",
            command=fix,
        )
    return Finding(
        "universal-info-missing",
        "warning",
        p,
        head + "The checkpoint resumes fine at the same world size. To change world size, convert "
        f"it: `ckpt-tui universal {inv.shown(p)}` (runs DeepSpeed's converter, supplies the info in memory, "
        "leaves the source untouched and prints how to load the result)." + again + " To add the key in "
        f"place for other tools: `{fix}`.",
        "universal-info",
        command=f"ckpt-tui universal {inv.shown(p)}",
    )


def tag_broken(tag: Node) -> bool:
    """Is a file of this DeepSpeed tag missing, truncated or corrupt (so no conversion or fp32 export
    of it can work)?"""
    f = cast(DeepSpeedZeroFacts, tag.facts)
    return bool(_has_breakage(tag) or f.get("missing_files") or f.get("partition_mismatch"))


def universal_beside(inv: Inventory, tag: Node) -> tuple[Optional[Node], Optional[tuple[str, str]]]:
    """The universal checkpoint ``ckpt-tui universal`` writes for ``tag`` (``<tag>_universal/`` beside
    it, named by ``latest_universal``) when it is there and complete, from the scan's facts (headers
    only): (it, None); else (None, (the path of an unusable one, why)) or (None, None) when there is none."""
    from .formats.deepspeed.reader import UNIVERSAL_STATES, TagFacts

    if tag.path == ".":
        return None, None  # its folder was not scanned
    parent = inv.node(tag.path.rsplit("/", 1)[0] if "/" in tag.path else ".")
    uni = parent.child(f"{tag.name}_universal") if parent is not None else None
    if uni is None or not uni.is_dir:
        return None, None
    if uni.format != "deepspeed-universal":
        return None, (uni.path, "holds no universal checkpoint (no zero/<parameter>/fp32.pt)")
    lu = parent.child("latest_universal")
    named = (cast(TextFacts, lu.facts).get("names") or "").strip() if lu is not None else None
    if named != uni.name:  # load_checkpoint(load_universal) follows latest_universal: it would not load this one
        return None, (uni.path, "`latest_universal` " + ("is missing" if lu is None else "does not name it"))
    uf = cast(DeepSpeedUniversalFacts, uni.facts)
    if uf.get("incomplete_params"):
        return None, (uni.path, f"incomplete (no fp32.pt in {', '.join(uf['incomplete_params'][:3])})")
    if not uf.get("model_state_files"):
        return None, (uni.path, "incomplete (no *_model_states.pt)")
    broken = next((x.path for x in uni.walk() if x.facts.get("error_kind")), None)
    if broken:
        return None, (uni.path, f"damaged (`{inv.shown(broken)}`: {uni.find(broken).facts.get('error')})")
    tf = inv.parsed.get(tag, TagFacts)
    zero = uni.child("zero")
    for name, shape in tf.param_shapes.items() if tf is not None else ():
        folder = zero.child(name) if zero is not None else None
        missing = [s for s in UNIVERSAL_STATES if folder is None or folder.child(s + ".pt") is None]
        if missing:
            return None, (uni.path, f"incomplete ({name}: no {', '.join(m + '.pt' for m in missing)})")
        fp32 = cast(TensorFacts, folder.child("fp32.pt").facts)
        if fp32.get("param_count") is not None and fp32["param_count"] != numel(shape):
            return None, (
                uni.path,
                f"not of this checkpoint ({name} holds {fp32['param_count']} values, the tag {numel(shape)})",
            )
    return uni, None


def _load_instructions(inv: Inventory, tag: Node, uni: Node) -> str:
    """The load instructions ``ckpt-tui universal`` prints, for ``uni`` found beside ``tag``."""
    from .convert.universal.instructions import FROZEN_FILE, UniversalLoad, load_instructions
    from .formats.deepspeed.reader import TagFacts

    f = cast(DeepSpeedZeroFacts, tag.facts)
    tf = inv.parsed.get(tag, TagFacts)
    ck = uni.path.rsplit("/", 1)[0] if "/" in uni.path else "."
    given = inv.given or str(inv.root.abspath)
    ckdir = inv.node(ck)
    frozen_rel = f"{ck}/{FROZEN_FILE}" if ck != "." else FROZEN_FILE
    return load_instructions(
        UniversalLoad(
            out_shown=inv.shown(uni.path),
            out_name=uni.name,
            ckdir_shown=inv.shown(ck),
            ckdir_code=user_path(given, ck),
            ckdir_name=ckdir.abspath.name if ckdir is not None else ck,
            stage=f.get("zero_stage") or 2,
            global_step=f.get("global_step"),
            frozen=f.get("frozen_params") or [],
            buffers=list(tf.buffers) if tf is not None else [],
            framework=tag.framework or inv.framework,
            frozen_code=user_path(given, frozen_rel),
            frozen_exported=inv.node(frozen_rel) is not None,
            tag_shown=inv.shown(tag.path),
        )
    )


def _dir_findings(inv: Inventory, n: Node) -> list[Finding]:
    out = []
    p = n.path
    names = {c.name for c in n.children}
    dcp_children = [c for c in n.children if c.is_dir and c.format == "dcp"]
    if dcp_children and n.format != "dcp" and step_of(dcp_children[0].name) is None:
        out.append(_dcp_components_finding(inv, n, dcp_children))
    tags = inv.deepspeed_tags(n)
    if tags and "latest" not in names:
        cmd = f"ckpt-tui fix {inv.shown(p)} --only latest"
        newest = sorted(t.name for t in tags)[-1]
        out.append(
            Finding(
                "latest-missing",
                "warning",
                p,
                f"`{inv.shown(p, slash=True)}` has DeepSpeed tag folder(s) "
                f"({', '.join(t.name for t in tags[:4])}) but no `latest` file, so "
                "engine.load_checkpoint(dir) and zero_to_fp32 without a tag will not find them. "
                f"Write the newest tag's name into it: `echo {shlex.quote(newest)} > "
                f"{inv.shown(p + '/latest' if p != '.' else 'latest')}`, or run `{cmd}` (picks the newest "
                "complete tag).",
                "latest",
                cmd,
            )
        )
    unis = inv.deepspeed_tags(n, universal=True)
    if unis and "latest_universal" not in names and not tags:
        cmd = f"ckpt-tui fix {inv.shown(p)} --only latest"
        out.append(
            Finding(
                "latest-missing",
                "warning",
                p,
                f"universal checkpoint folder(s) {', '.join(u.name for u in unis[:3])} in "
                f"`{inv.shown(p, slash=True)}` have no `latest_universal` beside them, so load_checkpoint "
                f"with load_universal will not find them: `{cmd}` writes it.",
                "latest",
                cmd,
            )
        )
    if "adapter_config.json" in names and not any(
        c.name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json") for c in n.children
    ):
        out.append(
            Finding(
                "adapter-only",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` holds only a PEFT adapter "
                "(adapter_config.json + adapter weights), not the full model: load the base model named in "
                "adapter_config.json and apply the adapter, or merge it (peft's merge_and_unload).",
            )
        )
    f = cast(DirFacts, n.facts)
    if (
        f.get("index_missing_files")
        or f.get("index_missing_tensors")
        or f.get("index_unlisted_tensors")
        or f.get("index_outside")
    ):
        bits = []
        if f.get("index_missing_files"):
            bits.append(f"names missing file(s) {', '.join(f['index_missing_files'][:4])}")
        if f.get("index_outside"):
            bits.append(f"points outside the folder ({', '.join(f['index_outside'][:3])})")
        if f.get("index_missing_tensors"):
            bits.append(
                f"maps {len(f['index_missing_tensors'])} tensor(s) to files that do not hold them "
                f"(e.g. {f['index_missing_tensors'][0]})"
            )
        if f.get("index_unlisted_tensors"):
            bits.append(
                f"leaves out {len(f['index_unlisted_tensors'])} tensor(s) the shards hold "
                f"(e.g. {f['index_unlisted_tensors'][0]})"
            )
        out.append(
            Finding(
                "index-mismatch",
                "error",
                p,
                f"The safetensors index in `{inv.shown(p, slash=True)}` "
                + "; ".join(bits)
                + ". from_pretrained will fail or load partial weights; rebuild the "
                "index from the shards' headers.",
                "index",
            )
        )
    return out


def _dcp_components_finding(inv: Inventory, n: Node, dcps: list[Node]) -> Finding:
    """A folder holding DCP folders: which is the model (a model-only DCP before one holding model and
    optimizer together), the peer tool's command only where it works, and the export that picks it."""
    p = n.path
    model = [c for c in dcps if c.role == "model"]
    both = [c for c in dcps if c.role == "model+optimizer"]
    optim = [c for c in dcps if c.role == "optimizer"]
    names = lambda cs: ", ".join(f"`{inv.shown(c.path, slash=True)}`" for c in cs)
    parts = []
    if model:
        parts.append(f"the model is in {names(model)}")
    if optim:
        parts.append(f"the optimizer in {names(optim)}")
    if both:
        parts.append(f"model and optimizer together in {names(both)}")
    where = f"`{inv.shown(p, slash=True)}`"
    msg = f"{where} holds torch.distributed.checkpoint folders rather than being one: " + "; ".join(parts) + "."
    target = model[0] if model else (both[0] if both else None)
    command = None
    if target is not None and _has_breakage(target):  # nothing reads it until it is whole: no command that fails
        msg += (
            f" `{inv.shown(target.path, slash=True)}` is damaged (see the errors in it): no tool can read it "
            "until it is whole again."
        )
    elif target is not None:
        command = f"ckpt-tui export {inv.shown(p)} --out DIR"
        if merges_with_accelerate(target):
            t = inv.shown(target.path)
            msg += (
                " Tools that need a single DCP folder (accelerate merge-weights, torch's dcp_to_torch_save) "
                "must be "
                f"given `{t}`, e.g. `accelerate merge-weights {t} {inv.shown(target.path + '_merged')}`;"
            )
        else:
            msg += (
                f" accelerate merge-weights cannot merge `{inv.shown(target.path, slash=True)}`: it works only on "
                'a DCP holding the model\'s tensors and nothing else (here it stops with "Key ... is invalid");'
            )
        msg += f" `{command}` picks it for you and writes its model weights as safetensors."
    else:
        msg += " None of them holds model weights."
    return Finding("dcp-components", "info", p, msg, "export", command)


def _marker_findings(inv: Inventory, n: Node) -> list[Finding]:
    tag = (cast(TextFacts, n.facts).get("names") or "").strip()
    parent_path = n.path.rsplit("/", 1)[0] if "/" in n.path else "."
    parent = inv.node(parent_path)
    if parent is None:
        return []
    name = n.name
    if name == "latest_checkpointed_iteration.txt":
        if tag == "release":
            target = "release"
        else:
            try:
                target = f"iter_{int(tag):07d}"
            except ValueError:
                target = None
    else:
        target = tag
    ok = (
        bool(target)
        and "/" not in target
        and "\\" not in target
        and target not in (".", "..")
        and target.isprintable()
        and parent.child(target) is not None
        and parent.child(target).is_dir
    )
    if ok:
        return []
    shown = tag if tag.isprintable() and len(tag) <= 80 else repr(tag[:80])
    tags = [
        c.name
        for c in parent.children
        if c.is_dir and (c.format in ("deepspeed-zero", "deepspeed-universal") or step_of(c.name) is not None)
    ]
    newest = sorted(tags, key=lambda t: (step_of(t) or -1, t))[-1] if tags else None
    cmd = f"ckpt-tui fix {inv.shown(parent_path)} --only latest" if newest else None
    hint = (
        f" The newest tag here is `{newest}`: write that name into `{inv.shown(n.path)}`, or run `{cmd}` (picks "
        "the newest complete tag)."
        if newest
        else ""
    )
    return [
        Finding(
            "latest-dangling",
            "error",
            n.path,
            f"`{inv.shown(n.path)}` names `{shown}`, which is not a folder beside it: loaders that follow it "
            "will fail." + hint,
            "latest" if newest else None,
            cmd,
        )
    ]
