"""Inventory -> [Finding]. Pure: reads the facts the scan gathered, touches no file.

Each finding says what happened, why it matters and the exact next step. ``fix`` names
the repair or export that applies (the id ``ckpt-tui fix --only`` and the TUI take). Every code,
its severities, help line and fix id are registered in ``codes.CODES``.
"""

from __future__ import annotations

import shlex
from typing import Optional, cast

from .advice import MEMO, export_command, has_breakage, sibling_hint
from .codes import CODES as CODES  # diagnose.CODES, as before: every code raised here, registered once
from .facts import (
    DcpFacts,
    DirFacts,
    PickleFacts,
    SpecialFacts,
    TensorFacts,
    TextFacts,
    TorchZipFacts,
)
from .formats.dcp.format import merges_with_accelerate
from .formats.registry import format_of
from .names import MODEL_FILE_RE, step_of
from .prune import marker_findings
from .storage import is_url
from .types import SEVERITY_RANK, Finding, Inventory, Node
from .whole import optimizer_gap_finding, trainer_findings, weights_empty_finding


def diagnose(inv: Inventory) -> list[Finding]:
    out: list[Finding] = []
    root = inv.root
    token = MEMO.set({"root": root})
    try:
        for n in root.walk():
            out.extend(_node_findings(inv, n))
            for extra in (weights_empty_finding(inv, n), optimizer_gap_finding(inv, n)):
                if extra is not None:
                    out.append(extra)
        out.extend(trainer_findings(inv))
        out = marker_findings(inv, out)  # a prune's marker: half pruned (never complete), or pruned (model only)
    finally:
        MEMO.reset(token)
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
    if inv.adapter is not None:
        out.append(_adapter_finding(inv))
    if is_url(inv.given):  # object storage: repairs, universal and convert write beside the checkpoint
        out = [_read_only(f) for f in out]
    out.sort(key=lambda f: (SEVERITY_RANK[f.severity], f.path, f.code))
    return out


def _adapter_finding(inv: Inventory) -> Finding:
    """``adapter-only``: a LoRA adapter, what it needs, and the export that writes what the user deploys."""
    from .adapters.config import UNREADABLE
    from .adapters.found import AdapterInfo

    info = cast(AdapterInfo, inv.adapter)
    node = info.node
    # the checkpoint holding it: the folder of adapter_model.safetensors, of a DeepSpeed tag, of a DCP folder
    ck = node.path.rsplit("/", 1)[0] if "/" in node.path else "."
    if node is inv.root:
        ck = "."
    where = inv.shown(ck, slash=True)
    src = inv.shown(ck)
    adapter_cmd = f"ckpt-tui export {src} --out DIR"
    merge_cmd = f"ckpt-tui export {src} --merge --out DIR"
    msg = f"`{where}` holds a {info.what()}, not a whole model"
    command: Optional[str]
    if info.config is None:
        msg += (
            f"{info.base_text()}. This save wrote no adapter_config.json, and the tensors do not tell "
            f"{', '.join(UNREADABLE[:-1])} or the base: an export needs the run's adapter_config.json."
        )
        command = None
    elif info.base is not None and info.base.found is not None:
        msg += (
            f"{info.base_text()}. `{merge_cmd}` writes the merged model (a Hugging Face folder: what you deploy); "
            f"`{adapter_cmd}` writes the adapter as PEFT loads it."
        )
        command = merge_cmd
    else:
        msg += (
            f"{info.base_text()}. `{adapter_cmd}` writes the adapter as PEFT loads it; to merge it, add --merge "
            "and --base with the base model's folder."
        )
        command = adapter_cmd
    return Finding("adapter-only", "info", ck, msg, command=command)


def _read_only(f: Finding) -> Finding:
    """``f`` without the repair or the command that would write beside a checkpoint in object storage (they
    refuse a URL); an export command stays (it reads the URL and writes a local OUT)."""
    from dataclasses import replace

    keep = f.command is not None and f.command.startswith("ckpt-tui export ")
    return replace(f, fix=f.fix if f.fix == "export" else None, command=f.command if keep else None)


def mark_complete(inv: Inventory, findings: list[Finding]) -> None:
    """Set ``complete`` on each checkpoint of a run folder: no error finding inside it."""
    broken: set[str] = set()  # every folder at or above an error: one pass over the findings, not one per checkpoint
    for f in findings:
        if f.severity == "error":
            parts = f.path.split("/")
            broken.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    errors_at_root = any(f.severity == "error" for f in findings)
    for ck in inv.checkpoints:
        ck["complete"] = not (errors_at_root if ck["path"] == "." else ck["path"] in broken)


def _node_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = n.facts
    fmt = format_of(n)
    out: list[Finding] = []
    p = n.path
    where = f"`{inv.shown(p)}`"
    special = cast(SpecialFacts, f).get("special")  # any node's facts: these keys where its format has them
    if special:
        out.append(
            Finding(
                "special-file",
                "warning",
                p,
                f"{where} is a {special}, not a file; it was skipped without being opened.",
            )
        )
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
                    "source or fall back to an earlier complete checkpoint." + sibling_hint(inv, n),
                )
            )
        elif kind == "corrupt":
            out.append(
                Finding(
                    "file-corrupt",
                    "error",
                    p,
                    f"{where} is corrupt: {msg}. Copy it again from the "
                    "source or fall back to an earlier complete checkpoint." + sibling_hint(inv, n),
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
    unsafe = cast(PickleFacts, f).get("unsafe_globals")
    if unsafe:
        g = ", ".join(unsafe[:6])
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
    out.extend(fmt.findings(inv, n))
    if n.is_dir:
        out.extend(_dir_findings(inv, n))
    if n.role == "marker" and not n.is_dir:
        out.extend(_marker_findings(inv, n))
    if not n.is_dir and n.role in ("model",) and fmt.weights_as_saved:
        dts = [d for d in cast(TensorFacts, f).get("dtypes") or [] if d.startswith(("float", "bfloat"))]
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
        tied = cast(TorchZipFacts, f).get("tied")
        if tied:
            pairs = "; ".join(" = ".join(t) for t in tied[:3])
            export = export_command(inv, p)
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


def _dir_findings(inv: Inventory, n: Node) -> list[Finding]:
    out = []
    p = n.path
    names = {c.name for c in n.children}
    dcp_children = [c for c in n.children if c.is_dir and format_of(c).components_apart]
    # torch's HuggingFaceStorageWriter(enable_consolidation=True): the consolidated model files beside the per-rank
    # shards (sharded/) they were made from: the folder is a Hugging Face model, the shards its source
    consolidated = all(cast(DcpFacts, c.facts).get("storage") == "safetensors" for c in dcp_children) and any(
        MODEL_FILE_RE.match(c.name) for c in n.children
    )
    if (
        dcp_children
        and not consolidated
        and not format_of(n).components_apart
        and step_of(dcp_children[0].name) is None
    ):
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
    if (
        inv.adapter is None
        and "adapter_config.json" in names
        and not any(
            c.name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json") for c in n.children
        )
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
        from .layout import whole_hf_shards

        shards = whole_hf_shards(n, [c for c in n.children if c.is_dir and format_of(c).torch_dcp])
        if shards is not None:
            # HuggingFaceStorageWriter(enable_consolidation=True) stopped before the consolidated files were whole
            export = f"ckpt-tui export {inv.shown(p)} --out DIR"
            out.append(
                Finding(
                    "index-mismatch",
                    "error",
                    p,
                    f"The safetensors index in `{inv.shown(p, slash=True)}` " + "; ".join(bits) + ": the "
                    "consolidation torch's HuggingFaceStorageWriter runs after the save did not finish. The per-rank "
                    f"shards it consolidates, `{inv.shown(shards.path, slash=True)}`, are whole: `{export}` exports "
                    "the model from them.",
                    "export",
                    export,
                )
            )
            return out
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

    def names(cs: list[Node]) -> str:
        return ", ".join(f"`{inv.shown(c.path, slash=True)}`" for c in cs)

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
    adapter = inv.adapter
    fix: Optional[str] = "export"
    if target is not None and target.role == "model" and not target.facts.get("tensor_count"):
        # an HF Trainer + FSDP1 + PEFT save: the model folder has no tensor entries, the weights were not written
        msg += (
            f" `{inv.shown(target.path, slash=True)}` holds no tensors: the save did not write the model's weights "
            "(no export can recover them from it)."
        )
        target, fix = None, None
    elif target is not None and adapter is not None and adapter.node is target and adapter.config is None:
        # a LoRA adapter saved without adapter_config.json: the export needs the run's (the adapter-only finding)
        msg += (
            f" `{inv.shown(target.path, slash=True)}` holds a LoRA adapter saved without its adapter_config.json: "
            "ckpt-tui export writes it as PEFT loads it once given the run's config (--adapter-config PATH)."
        )
        target, fix = None, None
    if fix is None:
        pass  # said above: no command to give
    elif target is not None and has_breakage(target):  # nothing reads it until it is whole: no command that fails
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
    return Finding("dcp-components", "info", p, msg, fix, command)


def _marker_findings(inv: Inventory, n: Node) -> list[Finding]:
    tag = (cast(TextFacts, n.facts).get("names") or "").strip()
    parent_path = n.path.rsplit("/", 1)[0] if "/" in n.path else "."
    parent = inv.node(parent_path)
    if parent is None:
        return []
    name = n.name
    target: Optional[str]
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
    ok = False
    if target and "/" not in target and "\\" not in target and target not in (".", "..") and target.isprintable():
        found = parent.child(target)
        ok = found is not None and found.is_dir
    if ok:
        return []
    shown = tag if tag.isprintable() and len(tag) <= 80 else repr(tag[:80])
    tags = [
        c.name
        for c in parent.children
        if c.is_dir and (format_of(c).tag or format_of(c).universal or step_of(c.name) is not None)
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
