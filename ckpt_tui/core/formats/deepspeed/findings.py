"""What diagnose reports about DeepSpeed tag folders and universal checkpoints: missing or mismatched states
files, the universal conversion and how to load it."""

from __future__ import annotations

from typing import Optional, cast

from ...advice import export_command, has_breakage
from ...dtypes import short_dtype
from ...facts import (
    DeepSpeedUniversalFacts,
    DeepSpeedZeroFacts,
    TensorFacts,
    TextFacts,
)
from ...types import Finding, Inventory, Node, numel
from ...units import param_count
from .moe import EXPERT_FILE_RE, experts_words
from .reader import OPTIM_STATES_RE


def universal_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = cast(DeepSpeedUniversalFacts, n.facts)
    p = n.path
    if not f.get("incomplete_params"):
        return []
    return [
        Finding(
            "shard-missing",
            "error",
            p,
            f"universal checkpoint `{inv.shown(p, slash=True)}` has "
            f"parameter folders without fp32.pt: {', '.join(f['incomplete_params'][:6])}. The "
            "conversion was interrupted; run it again.",
        )
    ]


def tag_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = cast(DeepSpeedZeroFacts, n.facts)
    p = n.path
    out = []
    stage = f.get("zero_stage")
    # BF16_Optimizer, stage 0 and pipeline tags: ds_to_universal fails on them whatever the info says
    if f.get("moe"):  # and on a mixture of experts: no conversion, no fix to offer (ZeRO-3 MoE: not read)
        if stage in (1, 2) and f.get("ds_layout", "zero") == "zero" and not tag_broken(n):
            out.append(moe_resume_finding(inv, n))
    elif stage in (1, 2) and f.get("universal_checkpoint_info") is False and f.get("ds_layout", "zero") == "zero":
        out.append(universal_info_finding(inv, n))  # it says the world size a resume needs, and the way round
    elif stage in (1, 2, 3) and f.get("ds_layout", "zero") == "zero" and not tag_broken(n):
        world = f.get("dp_world_size") or f.get("world_size")
        uni, _ = universal_beside(inv, n)
        if world and uni is None:
            cmd = f"ckpt-tui universal {inv.shown(p)}"
            out.append(
                Finding(
                    "resume-world-size",
                    "info",
                    p,
                    f"`{inv.shown(p, slash=True)}` resumes on exactly {world} data-parallel rank(s): each rank "
                    f"loads its own ZeRO-{stage} partition of the optimizer state, and DeepSpeed's load_checkpoint "
                    f"refuses another count. To resume on another number of ranks, convert it: `{cmd}` writes a "
                    "universal checkpoint, loadable at any world size (with load_universal), and prints how.",
                    command=cmd,
                )
            )
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
        elif f.get("moe"):
            shown = [_expert_said(m) for m in miss[:6]]
            msg = (
                f"`{inv.shown(p, slash=True)}` is a mixture-of-experts checkpoint ({experts_words(f)}, {ws} "
                f"data-parallel rank(s)) but {len(miss)} of its file(s) are missing: {', '.join(shown)}. Copy them "
                "from the nodes that wrote them: DeepSpeed's load_checkpoint reads every expert's file and every "
                "rank's optimizer states, and fails without them."
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
    export = None if tag_broken(n) else export_command(inv, p)  # an export of a broken tag refuses
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
    if f.get("pipeline") and f.get("ranks_present"):  # pipeline + ZeRO-1/BF16_Optimizer: masters in optim files
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


# why there is no universal conversion of a DeepSpeed MoE tag (`ckpt-tui universal` refuses it for the same reason)
MOE_UNIVERSAL = (
    "ckpt-tui's universal command does not convert (DeepSpeed's ds_to_universal fails on expert-parallel ones, joining "
    "different ranks' experts as one tensor, and a universal MoE checkpoint loading back is unproven)"
)


def _expert_said(name: str) -> str:
    """A missing file's name, and which expert it holds where it is an expert's."""
    m = EXPERT_FILE_RE.match(name)
    if m is None or m.group(1) is None:
        return name
    return f"{name} (expert {m.group(2)} of MoE layer {m.group(1)})"


def moe_resume_finding(inv: Inventory, tag: Node) -> Finding:
    """A DeepSpeed mixture-of-experts tag: how it resumes and what ckpt-tui does with it. Neither DeepSpeed's
    ds_to_universal nor `ckpt-tui universal` converts it (the former fails on its expert groups, the latter
    refuses it), and adding universal_checkpoint_info would not change that: no conversion and no fix offered."""
    f = cast(DeepSpeedZeroFacts, tag.facts)
    p = tag.path
    world = f.get("dp_world_size") or f.get("world_size")
    missing = f.get("universal_checkpoint_info") is False and f.get("zero_stage") in (1, 2)
    export = export_command(inv, p)
    head = (
        f"`{inv.shown(p + '/mp_rank_00_model_states.pt')}` has no `universal_checkpoint_info`, which DeepSpeed's "
        f"ds_to_universal needs; but this is a mixture-of-experts checkpoint, which {MOE_UNIVERSAL}, so adding the "
        "key offers no way to another world size. "
        if missing
        else f"`{inv.shown(p, slash=True)}` is a mixture-of-experts checkpoint, which {MOE_UNIVERSAL}. "
    )
    return Finding(
        "universal-info-missing" if missing else "resume-world-size",
        "info",
        p,
        head + f"It resumes on exactly {world or 'its'} data-parallel rank(s) with the same expert-parallel "
        f"layout ({experts_words(f)}). `{export}` writes the fp32 weights of every expert (global expert ids, as "
        "DeepSpeed's layer_*_expert_* files name them), `--component optimizer` their optimizer state.",
        command=export,
    )


def universal_info_finding(inv: Inventory, tag: Node) -> Finding:
    """A ZeRO-1/2 tag without universal_checkpoint_info: a warning that says how to convert it, or,
    where its universal checkpoint is already beside it and complete, an info that says how to load it."""
    p = tag.path
    uni, why_not = universal_beside(inv, tag)
    if uni is not None:
        # the tag itself as SRC (the one converted, whichever `latest` names), and --out where it is not the default
        again_cmd = f"ckpt-tui universal {inv.shown(p)}"
        if uni.name != f"{tag.name}_universal":
            again_cmd += f" --out {inv.shown(uni.path)}"
        from ...convert.universal.instructions import FROZEN_FILE
        from .reader import TagFacts

        tf = inv.parsed.get(tag, TagFacts)
        kept = list(cast(DeepSpeedZeroFacts, tag.facts).get("frozen_params") or []) + list(tf.buffers if tf else [])
        ck = uni.path.rsplit("/", 1)[0] if "/" in uni.path else "."
        frozen_rel = f"{ck}/{FROZEN_FILE}" if ck != "." else FROZEN_FILE
        frozen = f" `{again_cmd}` prints the steps to load it again."
        command = again_cmd
        if kept and inv.node(frozen_rel) is not None:
            frozen = (
                f" Its {len(kept)} frozen parameter(s) / buffer(s), which load_universal does not restore, are in "
                f"`{inv.shown(frozen_rel)}`." + frozen
            )
        elif kept:
            command = f"{again_cmd} --export-frozen"
            frozen = (
                f" Its {len(kept)} frozen parameter(s) / buffer(s) are not restored by load_universal and are not "
                f"beside it: `{command}` writes them ({FROZEN_FILE}; the universal folder is not converted "
                "again) and prints the steps to load both."
            )
        return Finding(
            "universal-info-missing",
            "info",
            p,
            f"`{inv.shown(p, slash=True)}` has no `universal_checkpoint_info`, which DeepSpeed's "
            "ds_to_universal needs, but it has been converted already: "
            f"`{inv.shown(uni.path, slash=True)}` is its universal checkpoint ({uni.facts.get('param_folders')} "
            "parameters, every state file there), loadable at any world size with "
            '`"checkpoint": {"load_universal": true}` in the DeepSpeed config.' + frozen,
            command=command,
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
    return bool(has_breakage(tag) or f.get("missing_files") or f.get("partition_mismatch"))


def universal_beside(inv: Inventory, tag: Node) -> tuple[Optional[Node], Optional[tuple[str, str]]]:
    """The universal checkpoint ``ckpt-tui universal`` writes for ``tag`` (``<tag>_universal/`` beside
    it, named by ``latest_universal``) when it is there and complete, from the scan's facts (headers
    only): (it, None); else (None, (the path of an unusable one, why)) or (None, None) when there is none."""
    if tag.path == ".":
        return None, None  # its folder was not scanned
    parent = inv.node(tag.path.rsplit("/", 1)[0] if "/" in tag.path else ".")
    if parent is None:
        return None, None
    uni = parent.child(f"{tag.name}_universal")
    if uni is None or not uni.is_dir:
        return None, None
    lu = parent.child("latest_universal")
    named = (cast(TextFacts, lu.facts).get("names") or "").strip() if lu is not None else None
    why = universal_unusable(inv, tag, uni, named)
    return (None, why) if why else (uni, None)


def universal_unusable(inv: Inventory, tag: Node, uni: Node, named: Optional[str]) -> Optional[tuple[str, str]]:
    """Why ``uni`` (a scanned folder, of ``inv`` or of a scan of its own folder) is not a complete universal
    checkpoint of ``tag`` that ``load_checkpoint(load_universal=True)`` would load, ``named`` being what the
    `latest_universal` beside it holds (None: there is none): (its path, why), or None where it is. The one
    check both inspect's finding and ``ckpt-tui universal`` (converted already?) make."""
    from .reader import UNIVERSAL_STATES, TagFacts

    if uni.format != "deepspeed-universal":
        return (uni.path, "holds no universal checkpoint (no zero/<parameter>/fp32.pt)")
    if named != uni.name:  # load_checkpoint(load_universal) follows latest_universal: it would not load this one
        return (uni.path, "`latest_universal` " + ("is missing" if named is None else "does not name it"))
    uf = cast(DeepSpeedUniversalFacts, uni.facts)
    if uf.get("incomplete_params"):
        return (uni.path, f"incomplete (no fp32.pt in {', '.join(uf['incomplete_params'][:3])})")
    if not uf.get("model_state_files"):
        return (uni.path, "incomplete (no *_model_states.pt)")
    broken = next((x.path for x in uni.walk() if x.facts.get("error_kind")), None)
    if broken:
        damaged = cast(Node, uni.find(broken))  # a node of uni's walk
        return (uni.path, f"damaged (`{inv.shown(broken)}`: {damaged.facts.get('error')})")
    tf = inv.parsed.get(tag, TagFacts)
    zero = uni.child("zero")
    # ds_to_universal (DeepSpeed 0.19.8) writes no per-parameter step.pt for a ZeRO-3 tag; load_universal loads it so
    states = [s for s in UNIVERSAL_STATES if not (s == "step" and tag.facts.get("zero_stage") == 3)]
    for name, shape in tf.param_shapes.items() if tf is not None else ():
        folder = zero.child(name) if zero is not None else None
        missing = [s for s in states if folder is None or folder.child(s + ".pt") is None]
        if missing:
            return (uni.path, f"incomplete ({name}: no {', '.join(m + '.pt' for m in missing)})")
        fp32_node = cast(Node, cast(Node, folder).child("fp32.pt"))  # not missing: the folder holds it
        fp32 = cast(TensorFacts, fp32_node.facts)
        if fp32.get("param_count") is not None and fp32["param_count"] != numel(shape):
            return (
                uni.path,
                f"not of this checkpoint ({name} holds {fp32['param_count']} values, the tag {numel(shape)})",
            )
    return None
