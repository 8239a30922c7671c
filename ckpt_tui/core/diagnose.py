"""Inventory -> [Finding]. Pure: reads the facts the scan gathered, touches no file.

Each finding says what happened, why it matters and the exact next step. ``fix`` names
the repair or export that applies (the id ``ckpt-tui fix --only`` and the TUI take). Every code,
its severities, help line and fix id are registered in ``codes.CODES``.
"""

from __future__ import annotations

from typing import Optional, cast

from .codes import CODES  # noqa: F401  (diagnose.CODES, as before) every code raised here, registered once
from .facts import DcpFacts, DeepSpeedZeroFacts, DirFacts, TextFacts
from .formats.dcp_folder import merges_with_accelerate
from .names import step_of
from .types import SEVERITY_RANK, Finding, Inventory, Node
from .units import param_count


def diagnose(inv: Inventory) -> list[Finding]:
    out: list[Finding] = []
    root = inv.root
    for n in root.walk():
        out.extend(_node_findings(inv, n))
    if inv.layout == "unknown" and not any(f.severity == "error" for f in out):
        out.append(Finding("not-a-checkpoint", "error", ".",
                           f"{root.abspath} is not a checkpoint ckpt-tui recognises: no DCP .metadata/.distcp, no "
                           "DeepSpeed model/optim states, no safetensors or torch state dict. Point ckpt-tui at a "
                           "checkpoint folder (e.g. checkpoint-2000/) or a run folder that holds them."))
    out.sort(key=lambda f: (SEVERITY_RANK[f.severity], f.path, f.code))
    return out


def mark_complete(inv: Inventory, findings: list[Finding]) -> None:
    """Set ``complete`` on each checkpoint of a run folder: no error finding inside it."""
    for ck in inv.checkpoints:
        node = inv.node(ck["path"])
        ck["complete"] = not any(f.severity == "error" and node.contains(f.path) for f in findings)


def _node_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = n.facts
    out: list[Finding] = []
    p = n.path
    where = f"`{p}`" if p != "." else "this path"
    if f.get("special"):
        out.append(Finding("special-file", "warning", p, f"{where} is a {f['special']}, not a file; it was skipped "
                           "without being opened."))
    kind = f.get("error_kind")
    if kind:
        msg = f.get("error", "")
        if kind == "truncated":
            out.append(Finding("file-truncated", "error", p, f"{where} is truncated: {msg}. Copy it again from the "
                               "source or fall back to an earlier complete checkpoint." + _sibling_hint(inv, n)))
        elif kind == "corrupt":
            out.append(Finding("file-corrupt", "error", p, f"{where} is corrupt: {msg}. Copy it again from the "
                               "source or fall back to an earlier complete checkpoint." + _sibling_hint(inv, n)))
        elif kind == "permission":
            out.append(Finding("unreadable", "error", p, f"{where}: {msg}. Check its owner and mode (`ls -l`), or "
                               "run as a user who can read it."))
        elif kind in ("loop", "broken-link"):
            out.append(Finding("unreadable", "warning", p, f"{where}: {msg}."))
        elif kind in ("too-deep", "too-many", "too-large", "unreadable"):
            out.append(Finding("unreadable", "warning", p, f"{where}: {msg}."))
    if f.get("unsafe_globals"):
        g = ", ".join(f["unsafe_globals"][:6])
        sev = "info" if inv.trust_pickles else "error"
        out.append(Finding("unsafe-pickle", sev, p, f"{where} is a pickle that names code outside ckpt-tui's allowlist "
                           f"({g}). Loading it would run that code; ckpt-tui read it without running anything. "
                           "If you trust where it came from, pass --trust-pickles."))
    if n.format == "dcp":
        out.extend(_dcp_findings(inv, n))
    elif n.format == "deepspeed-zero":
        out.extend(_ds_findings(inv, n))
    elif n.format == "deepspeed-universal":
        if f.get("incomplete_params"):
            out.append(Finding("shard-missing", "error", p, f"universal checkpoint {where} has parameter folders "
                               f"without fp32.pt: {', '.join(f['incomplete_params'][:6])}. The conversion was "
                               "interrupted; run it again."))
    if n.is_dir:
        out.extend(_dir_findings(inv, n))
    if n.role == "marker" and not n.is_dir:
        out.extend(_marker_findings(inv, n))
    if not n.is_dir and n.role in ("model",) and n.format in ("safetensors", "torch-zip"):
        dts = [d for d in f.get("dtypes") or [] if d.startswith(("float", "bfloat"))]
        if len(dts) > 1:
            out.append(Finding("mixed-dtypes", "info", p, f"{where} mixes floating dtypes ({', '.join(dts)}); an "
                               "export must keep them as stored or cast deliberately."))
        if f.get("tied"):
            pairs = "; ".join(" = ".join(t) for t in f["tied"][:3])
            out.append(Finding("tied-weights", "info", p, f"{where} holds tensors that share storage ({pairs}). "
                               "safetensors refuses shared tensors (\"Some tensors share memory\"): write each tied "
                               "tensor once, as transformers' save_pretrained does.", "export"))
    return out


def _sibling_hint(inv: Inventory, n: Node) -> str:
    s = last_complete_sibling(inv, n)
    return f" The newest other checkpoint here is `{s}`." if s else ""


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
    pnode = inv.node(parent)
    if pnode is None:
        return None
    cands = []
    for c in pnode.children:
        if c.is_dir and c.path != mine and step_of(c.name) is not None and not _has_breakage(c):
            cands.append((step_of(c.name), c.path))
    return max(cands)[1] if cands else None


def _has_breakage(n: Node) -> bool:
    for x in n.walk():
        f = x.facts
        if f.get("error_kind") in ("truncated", "corrupt") or f.get("metadata_missing") or f.get("missing_files"):
            return True
    return False


def _dcp_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = cast(DcpFacts, n.facts)
    p = n.path
    out = []
    if f.get("metadata_missing"):
        ranks = f.get("ranks_present") or []
        out.append(Finding("dcp-metadata-missing", "error", p,
                           f"`{p}/` has {f.get('shard_files', 0)} .distcp shard file(s) (ranks {_ranks(ranks)}) but no "
                           ".metadata: the save was interrupted before rank 0 wrote it (or .metadata exists only on "
                           "another node's disk). Nothing can load this folder; copy .metadata from the node that "
                           "wrote it, or use an earlier complete checkpoint." + _sibling_hint(inv, n)
                           + (f" A complete .metadata.tmp may survive (the final rename was interrupted): "
                              f"`ckpt-tui fix {p} --only dcp-metadata`." if n.child(".metadata.tmp") is not None else ""),
                           "dcp-metadata" if n.child(".metadata.tmp") is not None else None))
    if f.get("missing_files"):
        miss = f["missing_files"]
        out.append(Finding("shard-missing", "error", p,
                           f"`{p}/.metadata` names {len(miss)} file(s) that are not here: {', '.join(miss[:6])}. "
                           "Copy them from the nodes that wrote them (each rank writes its own); without them the "
                           "tensors they hold cannot be loaded."))
    if f.get("unreferenced_files"):
        extra = f["unreferenced_files"]
        out.append(Finding("world-size-mismatch", "warning", p,
                           f"`{p}/` holds shard files that .metadata does not reference ({', '.join(extra[:6])}): "
                           "left over from a save with a different world size. They are ignored on load; remove "
                           "them to avoid confusion."))
    return out


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
    if stage in (1, 2) and f.get("universal_checkpoint_info") is False:
        out.append(Finding("universal-info-missing", "warning", p,
                           f"`{p}/mp_rank_00_model_states.pt` has no `universal_checkpoint_info`, so DeepSpeed's "
                           "ds_to_universal will stop with \"Required universal_checkpoint_info state is missing\". "
                           "The checkpoint resumes fine at the same world size. To change world size, convert it: "
                           f"`ckpt-tui universal {p}` (runs DeepSpeed's converter, supplies the info in memory, "
                           "leaves the source untouched and prints how to load the result). To add the key in "
                           f"place for other tools: `ckpt-tui fix {p} --only universal-info`.",
                           "universal-info"))
    if f.get("missing_files"):
        miss = f["missing_files"]
        ws = f.get("world_size")
        out.append(Finding("shard-missing", "error", p,
                           f"`{p}/` was saved by {ws} data-parallel rank(s) but {len(miss)} rank file(s) are "
                           f"missing: {', '.join(miss[:6])}. Copy them from the nodes that wrote them; the fp32 "
                           "weights and optimizer state cannot be rebuilt without every rank."))
    if f.get("extra_rank_files") or f.get("partition_mismatch"):
        extra = f.get("extra_rank_files") or []
        msg = f"`{p}/` records dp_world_size={f.get('world_size')}"
        if f.get("partition_mismatch"):
            msg += f" but its optimizer states were partitioned {f['partition_mismatch']} ways"
        if extra:
            msg += f" but also holds {', '.join(extra[:4])} from more ranks"
        out.append(Finding("world-size-mismatch", "error" if f.get("partition_mismatch") else "warning", p,
                           msg + ": files from two different runs are mixed. Keep only the files of one save."))
    frozen = f.get("frozen_params")
    if frozen:
        out.append(Finding("frozen-params", "info", p,
                           f"`{p}/` has {len(frozen)} frozen parameter(s) ({', '.join(frozen[:4])}) with no "
                           "optimizer state. zero_to_fp32 rebuilds them from frozen_param_fragments; a universal checkpoint restores only "
                           "optimizer-tracked parameters, so frozen ones keep what the model was built with.",
                           "export"))
    elif f.get("frozen_params_unrecorded"):
        out.append(Finding("frozen-params", "info", p,
                           f"`{p}/` holds {param_count(f['frozen_params_unrecorded'])} frozen parameter values that ZeRO-{stage} "
                           "did not record: DeepSpeed's zero_to_fp32 drops them silently. Their values are only in "
                           "the model-states `module` weights (in the training dtype).", "export"))
    if f.get("shared_params"):
        pairs = "; ".join(f"{a} = {b}" for a, b in list(f["shared_params"].items())[:3])
        out.append(Finding("tied-weights", "info", p,
                           f"`{p}/` has tied weights ({pairs}). zero_to_fp32 --safe_serialization fails on these "
                           "(\"Some tensors share memory\"); its get_fp32_state_dict_from_zero_checkpoint still returns "
                           "both names, so write each tied tensor once when saving.",
                           "export"))
    if f.get("pipeline") or f.get("moe"):
        what = "pipeline-parallel" if f.get("pipeline") else "mixture-of-experts"
        out.append(Finding("world-size-mismatch", "info", p,
                           f"`{p}/` is a {what} DeepSpeed checkpoint; export and universal conversion of this "
                           "layout are not supported by ckpt-tui yet."))
    return out


def _dir_findings(inv: Inventory, n: Node) -> list[Finding]:
    out = []
    p = n.path
    names = {c.name for c in n.children}
    dcp_children = [c for c in n.children if c.is_dir and c.format == "dcp"]
    if dcp_children and n.format != "dcp" and step_of(dcp_children[0].name) is None:
        out.append(_dcp_components_finding(inv, n, dcp_children))
    tags = inv.deepspeed_tags(n)
    if tags and "latest" not in names:
        out.append(Finding("latest-missing", "warning", p,
                           f"{'`' + p + '/`' if p != '.' else 'This folder'} has DeepSpeed tag folder(s) "
                           f"({', '.join(t.name for t in tags[:4])}) but no `latest` file, so "
                           "engine.load_checkpoint(dir) and zero_to_fp32 without a tag will not find them. "
                           f"Write the newest tag's name into it: `echo {sorted(t.name for t in tags)[-1]} > {'' if p == '.' else p + '/'}latest`, "
                           f"or run `ckpt-tui fix {p} --only latest` (picks the newest complete tag).", "latest"))
    unis = inv.deepspeed_tags(n, universal=True)
    if unis and "latest_universal" not in names and not tags:
        out.append(Finding("latest-missing", "warning", p,
                           f"universal checkpoint folder(s) {', '.join(u.name for u in unis[:3])} have no "
                           "`latest_universal` beside them, so load_checkpoint with load_universal will not find them.",
                           "latest"))
    if "adapter_config.json" in names and not any(
            c.name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json") for c in n.children):
        out.append(Finding("adapter-only", "info", p,
                           f"{'`' + p + '/`' if p != '.' else 'This folder'} holds only a PEFT adapter "
                           "(adapter_config.json + adapter weights), not the full model: load the base model named in "
                           "adapter_config.json and apply the adapter, or merge it (peft's merge_and_unload)."))
    f = cast(DirFacts, n.facts)
    if f.get("index_missing_files") or f.get("index_missing_tensors") or f.get("index_unlisted_tensors") or f.get("index_outside"):
        bits = []
        if f.get("index_missing_files"):
            bits.append(f"names missing file(s) {', '.join(f['index_missing_files'][:4])}")
        if f.get("index_outside"):
            bits.append(f"points outside the folder ({', '.join(f['index_outside'][:3])})")
        if f.get("index_missing_tensors"):
            bits.append(f"maps {len(f['index_missing_tensors'])} tensor(s) to files that do not hold them "
                        f"(e.g. {f['index_missing_tensors'][0]})")
        if f.get("index_unlisted_tensors"):
            bits.append(f"leaves out {len(f['index_unlisted_tensors'])} tensor(s) the shards hold "
                        f"(e.g. {f['index_unlisted_tensors'][0]})")
        out.append(Finding("index-mismatch", "error", p,
                           f"The safetensors index in {'`' + p + '/`' if p != '.' else 'this folder'} "
                           + "; ".join(bits) + ". from_pretrained will fail or load partial weights; rebuild the "
                           "index from the shards' headers.", "index"))
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
    where = f"`{inv.shown(p, slash=True)}`" if p != "." else "This folder"
    msg = f"{where} holds torch.distributed.checkpoint folders rather than being one: " + "; ".join(parts) + "."
    target = model[0] if model else (both[0] if both else None)
    command = None
    if target is not None:
        command = f"ckpt-tui export {inv.shown(p)} --out DIR"
        if merges_with_accelerate(target):
            t = inv.shown(target.path)
            msg += (" Tools that need a single DCP folder (accelerate merge-weights, torch dcp_to_torch) must be "
                    f"given `{t}`, e.g. `accelerate merge-weights {t} {inv.shown(target.path + '_merged')}`;")
        else:
            msg += (f" accelerate merge-weights cannot merge `{inv.shown(target.path, slash=True)}`: it works only on "
                    "a DCP holding the model's tensors and nothing else (here it stops with \"Key ... is invalid\");")
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
    ok = bool(target) and "/" not in target and "\\" not in target and target not in (".", "..") and \
        target.isprintable() and parent.child(target) is not None and parent.child(target).is_dir
    if ok:
        return []
    shown = tag if tag.isprintable() and len(tag) <= 80 else repr(tag[:80])
    tags = [c.name for c in parent.children if c.is_dir and (c.format in ("deepspeed-zero", "deepspeed-universal")
                                                             or step_of(c.name) is not None)]
    newest = sorted(tags, key=lambda t: (step_of(t) or -1, t))[-1] if tags else None
    hint = f" The newest tag here is `{newest}`: write that name into `{n.name}`, or run `ckpt-tui fix {parent_path} --only latest` (picks the newest complete tag)." if newest else ""
    return [Finding("latest-dangling", "error", n.path,
                    f"`{n.path}` names `{shown}`, which is not a folder beside it: loaders that follow it will fail."
                    + hint, "latest" if newest else None)]
