"""export(SRC, OUT): pick the model component the inspector found, plan, write, verify."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Union, cast

from ..facts import DeepSpeedZeroFacts, TensorFacts, TextFacts
from ..formats import FormatError
from ..formats.deepspeed.reader import OPTIM_STATES_RE
from ..formats.format import NotExportable
from ..formats.registry import format_of, optimizer_sources
from ..fsutil import StrPath
from ..names import step_of
from ..progress import CancelToken, OnProgress
from ..report import Report, inspect
from ..storage import Location, LocationLike
from ..types import Finding, Inventory, Node
from ..whole import empty_weights, weights_recovery
from .plan import ExportPlan, make_plan
from .prefix import choose
from .sources import Source, strip_names
from .write import ExportError, ExportResult, execute

MODULE_STATES_FILE = "mp_rank_00_model_states.pt"
# what an unreadable optimizer-states file of a tag looks like to the inspector
_OPTIM_FILE_CODES = ("file-corrupt", "file-truncated", "unreadable")


def _given(src: LocationLike) -> str:
    """SRC as the user typed it (a str or a local path; a RemotePath has no os.fspath: TypeError, as before)."""
    return os.fspath(cast(StrPath, src))


def resolve(report: Report, tag: Optional[str] = None, *, verb: str = "exporting") -> tuple[Node, list[str]]:
    """The node holding the model weights, and what was decided on the way and why (said to the
    user). Never guesses silently: a DeepSpeed `latest` that names no tag folder is refused unless
    ``tag`` names one."""
    inv = report.inventory
    said: list[str] = []
    root = inv.root
    if inv.layout == "run-folder":
        complete = [c for c in inv.checkpoints if c["complete"]]
        if not complete:
            raise ExportError(
                f"no complete checkpoint in {inv.shown(slash=True)}: "
                + "; ".join(_broken(report, c["path"]) for c in inv.checkpoints[:4])
                + ". Point ckpt-tui at one checkpoint folder to see its findings"
            )
        ck = complete[0]
        newer = [c for c in inv.checkpoints if not c["complete"] and (c["step"] or -1) > (ck["step"] or -1)]
        said.append(
            f"{verb} the newest complete checkpoint `{inv.shown(ck['path'], slash=True)}` (step {ck['step']})"
            + (": skipped newer " + "; ".join(_broken(report, c["path"]) for c in newer[:4]) if newer else "")
        )
        node = inv.model_node(ck["path"])
    else:
        rel = inv.model_path()
        node = inv.node(rel) if rel else None
    if node is None:
        raise ExportError(f"no model weights found in {inv.shown(slash=root.is_dir)} ({inv.summary})")
    if node is not root and empty_weights(node, inv):
        # the layout's pick holds no whole weights (saved without gathering): the tag or DCP beside it does
        src = weights_recovery(inv, node)
        if src is not None:
            said.append(
                f"`{inv.shown(node.path)}` holds no whole weights (weights-empty): reading them from "
                f"`{inv.shown(src.path, slash=True)}` beside it"
            )
            node = src
    if format_of(node).tag:
        node, why = _choose_tag(report, node, tag)
        if why:
            said.append(
                ("the model is" if verb == "exporting" else verb) + f" `{inv.shown(node.path, slash=True)}` ({why})"
            )
    elif tag:
        raise ExportError(
            f"--tag names a DeepSpeed tag folder, but the model in {inv.shown(node.path)} is "
            f"{node.format or 'not DeepSpeed'}"
        )
    elif node is not root:
        said.append(f"the model is `{inv.shown(node.path, slash=node.is_dir)}`")
    return node, said


def _broken(report: Report, rel: str) -> str:
    """`checkpoint-3/` (latest-dangling, ...): a checkpoint and the codes of its error findings."""
    node = report.inventory.node(rel)
    codes = sorted(
        {f.code for f in report.findings if f.severity == "error" and node is not None and node.contains(f.path)}
    )
    return f"`{report.inventory.shown(rel, slash=True)}` ({', '.join(codes) or 'incomplete'})"


def _tag_names(inv: Inventory, folder: Node) -> str:
    tags = sorted(inv.deepspeed_tags(folder), key=lambda t: (step_of(t.name) or -1, t.name), reverse=True)
    return ", ".join(t.name for t in tags) or "none"


def _choose_tag(report: Report, node: Node, tag: Optional[str]) -> tuple[Node, Optional[str]]:
    """Which tag folder beside ``node`` (the layout's pick) to read, and why; refuses to guess."""
    inv = report.inventory
    if node is inv.root:  # SRC is the tag folder itself: the user chose it
        if tag and tag != node.name:
            raise ExportError(
                f"{inv.shown()} is itself the tag folder `{node.name}`; to read tag `{tag}`, give the "
                "folder that holds the tags"
            )
        return node, None
    parent = cast(Node, inv.node(node.path.rsplit("/", 1)[0] if "/" in node.path else "."))  # node's folder
    where = inv.shown(parent.path, slash=True)
    if tag:
        alt = parent.child(tag)
        if alt is None or not alt.is_dir or not format_of(alt).tag:
            raise ExportError(
                f"--tag {tag}: no DeepSpeed tag folder `{tag}` in {where}; its tags: {_tag_names(inv, parent)}"
            )
        return alt, f"--tag {tag}"
    latest = parent.child("latest")
    if latest is None or latest.is_dir:
        return node, f"no `latest` file in {where}: the newest tag" + (
            f", step {step_of(node.name)}" if step_of(node.name) is not None else ""
        )
    named = (cast(TextFacts, latest.facts).get("names") or "").strip()
    if named == node.name:
        return node, f"`latest` names {named}"
    dangling = any(f.code == "latest-dangling" and f.path == latest.path for f in report.findings)
    shown = named if named.isprintable() and len(named) <= 80 else repr(named[:80])
    what = "which is not a folder beside it" if dangling else "which is not a DeepSpeed tag folder"
    raise ExportError(
        f"{inv.shown(latest.path)} names `{shown}`, {what}, so ckpt-tui will not guess which tag "
        f"you mean. Tags in {where}: {_tag_names(inv, parent)}. Name one with --tag "
        f"(e.g. --tag {node.name}), or give the tag folder itself ({inv.shown(node.path)})."
    )


def _blocking_findings(report: Report, node: Node, trust: bool) -> list[Finding]:
    return [
        f
        for f in report.findings
        if node.contains(f.path) and f.severity == "error" and not (f.code == "unsafe-pickle" and trust)
    ]


def _optimizer_side(node: Node, f: Finding) -> bool:
    """Is ``f`` about the optimizer states of tag ``node`` only (what --from-module-states does not read)?"""
    if f.code == "shard-missing" and f.path == node.path:
        miss = cast(DeepSpeedZeroFacts, node.facts).get("missing_files") or []
        return bool(miss) and all(OPTIM_STATES_RE.match(m) for m in miss)
    name = f.path.rsplit("/", 1)[-1]
    parent = f.path.rsplit("/", 1)[0] if "/" in f.path else "."
    return parent == node.path and f.code in _OPTIM_FILE_CODES and bool(OPTIM_STATES_RE.match(name))


def module_states_problem(report: Report, node: Node) -> Optional[str]:
    """Why the module weights of tag ``node`` cannot be exported (--from-module-states), or None."""
    inv = report.inventory
    if not format_of(node).tag:
        return (
            f"--from-module-states reads the module weights of a DeepSpeed ZeRO-1/2 tag folder; "
            f"{inv.shown(node.path)} is {node.format or 'not one'}"
        )
    f = cast(DeepSpeedZeroFacts, node.facts)
    if f.get("zero_stage") == 3:
        return (
            f"{inv.shown(node.path, slash=True)} is ZeRO-3: its model-states files hold only each rank's "
            "partition of the module, not whole module weights, so --from-module-states has nothing to "
            "export. The weights can only be rebuilt from every rank's optimizer states"
        )
    ms = node.child(MODULE_STATES_FILE)
    if ms is None:
        return f"{inv.shown(node.path, slash=True)} has no {MODULE_STATES_FILE}: there are no module weights to export"
    bad = [x for x in report.findings if x.path == ms.path and x.severity == "error"]
    if bad or "error" in ms.facts:
        return (
            f"{inv.shown(ms.path)} cannot be read either ({bad[0].code if bad else ms.facts.get('error')}): "
            "there are no intact module weights to export"
        )
    return None


def module_states_command(report: Report, node: Node) -> str:
    """The export line that recovers the module weights of tag ``node``."""
    return f"ckpt-tui export {report.inventory.shown(node.path)} --from-module-states --out DIR"


def screened_model(
    src: LocationLike,
    *,
    tag: Optional[str] = None,
    trust_pickles: bool = False,
    why: str = "cannot read the weights",
    from_module_states: bool = False,
    verb: str = "exporting",
    report: Optional[Report] = None,
) -> tuple[Report, Node, list[str]]:
    """Inspect ``src``, pick the node holding the model weights, and refuse (ExportError) if an
    error finding inside it — unsafe pickles above all — says it must not be read. Every path that
    reads weights (export, verify, stats, diff) starts here.

    ``from_module_states``: a DeepSpeed ZeRO-1/2 tag is read from its module weights only, so
    broken optimizer-states files do not block it. Where they block a normal read but the module
    weights are intact, the refusal names that option. ``report``: ``src`` inspected already."""
    report = report if report is not None else inspect(src, trust_pickles=trust_pickles)
    inv = report.inventory
    node, said = resolve(report, tag, verb=verb)
    blocking = _blocking_findings(report, node, trust_pickles)
    if from_module_states:
        problem = module_states_problem(report, node)
        if problem:
            raise ExportError(problem)
        blocking = [f for f in blocking if not _optimizer_side(node, f)]
    if blocking:
        msg = f"{why}:\n  " + "\n  ".join(f"{f.code} at {inv.shown(f.path)}: {f.message}" for f in blocking)
        if (
            not from_module_states
            and format_of(node).tag
            and all(_optimizer_side(node, f) for f in blocking)
            and module_states_problem(report, node) is None
        ):
            dt = cast(DeepSpeedZeroFacts, node.facts).get("train_dtype")
            msg += (
                "\nThe fp32 master weights cannot be rebuilt without every rank's optimizer states, but the module "
                f"weights in {inv.shown(node.path + '/' + MODULE_STATES_FILE)} are intact. To export those instead "
                f"({'half precision, ' + _short(dt) if dt else 'the training dtype'} — NOT the fp32 masters), run:\n  "
                + module_states_command(report, node)
            )
        raise ExportError(msg)
    return report, node, said


def _short(dtype: str) -> str:
    from ..dtypes import short_dtype

    return short_dtype(dtype)


def source_for(
    node: Node,
    *,
    strip_prefix: Optional[str] = None,
    exclude_frozen: bool = False,
    trust_pickles: bool = False,
    from_module_states: bool = False,
) -> Source:
    """``node``'s model weights as an export source, opened by its format (``from_module_states``:
    a DeepSpeed tag's module weights instead of its fp32 masters)."""
    if from_module_states:
        from ..formats.deepspeed.module_states import module_states_source
        from .sources import strip_names

        try:
            return strip_names(module_states_source(node.abspath, exclude_frozen=exclude_frozen), strip_prefix)
        except ValueError as e:
            raise ExportError(str(e)) from None
    fmt = format_of(node)
    try:
        return fmt.source(node, strip_prefix=strip_prefix, exclude_frozen=exclude_frozen, trust_pickles=trust_pickles)
    except NotExportable as e:
        raise ExportError(str(e)) from None


def config_dirs(node: Node, report: Report) -> list[Location]:
    """Beside the checkpoint and in the run's output folder above it (HF Trainer writes no
    config.json into sharded-FSDP checkpoints)."""
    p = node.abspath if node.is_dir else node.abspath.parent
    dirs = [p, p.parent, p.parent.parent]
    sub = format_of(node).config_subdir  # verl keeps the config and tokenizer in huggingface/ beside its rank files
    if sub:
        dirs.insert(0, p / sub)
    if p.parent.name.startswith("checkpoint-") or p.name.startswith("checkpoint-"):
        dirs.append(p.parent.parent.parent)
    seen: set[Location] = set()
    out: list[Location] = []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


COMPONENTS = ("model", "optimizer")  # what ``component`` may ask for
OPTIMIZER_VERB = "exporting the optimizer state of"  # what --component optimizer says it picked


def _refuse_optimizer(report: Report) -> ExportError:
    """Exporting the optimizer state of this source is not supported yet: say so, naming the optimizer component
    that exists -- the one :func:`optimizer_component` picks, so the refusal names what an export would read."""
    inv = report.inventory
    node = optimizer_component(report)
    if node is None:
        return ExportError(
            f"no optimizer component in {inv.shown()} ({inv.summary}); --component model exports the model weights"
        )
    f = cast(TensorFacts, node.facts)  # any format's node: those holding tensors declare these keys
    bits = [node.format]
    if f.get("tensor_count"):
        bits.append(f"{f['tensor_count']} tensors")
    if f.get("dtypes"):
        bits.append("/".join(f["dtypes"]))
    return ExportError(
        f"the optimizer component is {inv.shown(node.path, slash=node.is_dir)} ({', '.join(bits)}); "
        f"exporting the optimizer state of {node.format or 'this format'} to safetensors is not "
        f"supported yet (only of {optimizer_sources()}). --component model (the "
        "default) exports the model weights; the optimizer state resumes from the checkpoint as it is"
    )


def optimizer_component(report: Report) -> Optional[Node]:
    """The node holding the optimizer state (of the newest complete checkpoint of a run folder), as the
    inspector's components name it; None where there is none. A DeepSpeed tag is its own."""
    inv = report.inventory
    comps = inv.components
    if inv.layout == "run-folder" and inv.checkpoints:
        complete = [c for c in inv.checkpoints if c["complete"]] or inv.checkpoints
        comps = inv.checkpoint_components.get(complete[0]["path"], {})
    rel = comps.get("optimizer") or comps.get("model+optimizer")
    return inv.node(rel) if rel else None


def optimizer_exportable(report: Report) -> Optional[str]:
    """Where ``--component optimizer`` would read from (a relative path), or None where this checkpoint
    has no optimizer state of a format it reads. Decided from the inventory only (no file is read): the
    plan says in full what is read, or why not. The TUI's export wizard asks this."""
    inv = report.inventory
    if inv.deepspeed_tags():
        try:
            node, _ = resolve(report, verb=OPTIMIZER_VERB)
        except ExportError:
            return None
        return node.path if format_of(node).tag else None
    opt = optimizer_component(report)
    if opt is None:
        return None
    if format_of(opt).optimizer is not None:
        return opt.path
    return None


def plan_export(
    src: LocationLike,
    out: StrPath,
    *,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = "50GB",
    exclude_frozen: bool = False,
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
    config: Optional[StrPath] = None,
    tag: Optional[str] = None,
    trust_pickles: bool = False,
    from_module_states: bool = False,
    component: Optional[str] = None,
    merge: bool = False,
    base: Optional[StrPath] = None,
    adapter_config: Optional[StrPath] = None,
    to: Optional[str] = None,
    true_vocab_size: Optional[int] = None,
    tokenizer: Optional[StrPath] = None,
) -> tuple[ExportPlan, list[str]]:
    """The export plan. A Lightning checkpoint whose names all start with one LightningModule
    attribute (``model.``) loses it by default (``keep_prefix`` keeps it, ``strip_prefix`` forces
    one): see :mod:`.prefix`. ``component``: "model" (the default) or "optimizer" (the role to export
    where a checkpoint has several; a DCP holding both exports its model part as the model). A LoRA adapter
    exports as PEFT saves it, or merged into its base (``merge``; ``base``: its folder where the adapter's
    record does not find it; ``adapter_config``: the adapter_config.json of a save that wrote none)."""
    if (merge or base is not None or adapter_config is not None) and component == "optimizer":
        raise ExportError("--merge, --base and --adapter-config export a LoRA adapter's weights, not an optimizer")
    if to is not None and to not in TO:
        raise ValueError(f"to must be one of {', '.join(TO)}, not {to!r}")
    if to != "hf" and (true_vocab_size is not None or tokenizer is not None):
        raise ExportError(
            ("--true-vocab-size" if true_vocab_size is not None else "--tokenizer") + " goes with --to hf"
        )
    if to == "hf" and (component == "optimizer" or merge or from_module_states):
        raise ExportError(
            "--to hf writes the model's weights: not with --component optimizer, --merge or --from-module-states"
        )
    if component is not None and component not in COMPONENTS:
        raise ValueError(f"component must be one of {', '.join(COMPONENTS)}, not {component!r}")
    if component == "optimizer":
        if from_module_states:
            raise ExportError(
                "--from-module-states exports a tag's module weights: it does not go with --component optimizer"
            )
        plan, said = _plan_optimizer(
            src,
            out,
            dtype=dtype,
            max_shard_size=max_shard_size,
            strip_prefix=strip_prefix,
            keep_prefix=keep_prefix,
            tag=tag,
            trust_pickles=trust_pickles,
        )
        plan.out_given, plan.src_given = str(out), _given(src)
        _refuse_source_out(plan)
        return plan, said
    report, node, said = screened_model(
        src,
        tag=tag,
        trust_pickles=trust_pickles,
        from_module_states=from_module_states,
        why="the checkpoint has problems an export cannot work around",
    )
    adapter = _adapter_plan(
        report,
        node,
        out,
        merge=merge,
        base=base,
        adapter_config=adapter_config,
        dtype=dtype,
        max_shard_size=max_shard_size,
        trust_pickles=trust_pickles,
        said=said,
    )
    if adapter is not None:
        adapter.out_given, adapter.src_given = str(out), _given(src)
        _refuse_source_out(adapter)
        return adapter, said
    plan = _plan(
        report,
        node,
        out,
        dtype=dtype,
        max_shard_size=max_shard_size,
        exclude_frozen=exclude_frozen,
        strip_prefix=strip_prefix,
        keep_prefix=keep_prefix,
        config=config,
        trust_pickles=trust_pickles,
        from_module_states=from_module_states,
        to=to,
        true_vocab_size=true_vocab_size,
        tokenizer=tokenizer,
    )
    plan.out_given, plan.src_given = str(out), _given(src)
    _refuse_source_out(plan)
    return plan, said


def _adapter_plan(
    report: Report,
    node: Node,
    out: StrPath,
    *,
    merge: bool,
    base: Optional[StrPath],
    adapter_config: Optional[StrPath],
    dtype: str,
    max_shard_size: Union[int, str],
    trust_pickles: bool,
    said: list[str],
) -> Optional[ExportPlan]:
    """The plan of a LoRA adapter's export (:mod:`.adapter`), or None where ``node`` holds no adapter."""
    from ..adapters.found import adapter_info
    from .adapter import plan_adapter, plan_merge

    inv = report.inventory
    if adapter_config is None and inv.adapter is not None and inv.adapter.node is node:
        info = inv.adapter  # found by the inspection
    else:
        info = adapter_info(inv, node, config_path=Path(adapter_config) if adapter_config is not None else None)
    if info is None:
        if merge or base is not None or adapter_config is not None:
            raise ExportError(
                f"--merge, --base and --adapter-config are for a LoRA adapter; {inv.shown(node.path)} holds "
                f"no LoRA tensors ({inv.summary})"
            )
        return None
    if info.layout.problems:  # unpaired or mismatched lora_A/lora_B, another adapter's name: never half an adapter
        raise ExportError(
            f"`{inv.shown(node.path)}` holds LoRA tensors that do not make one adapter:\n  "
            + "\n  ".join(info.layout.problems[:8])
        )
    if adapter_config is not None and info.config is None:
        raise ExportError(f"--adapter-config {adapter_config}: {info.config_error or 'not found'}")
    try:
        source = source_for(node, trust_pickles=trust_pickles)
    except FormatError as e:
        raise ExportError(f"`{inv.shown(node.path)}`: {e}") from None
    given = f"`{inv.shown(node.path, slash=node.is_dir)}`"
    other = _saved_adapter_beside(inv, node)
    if other is not None:
        said.append(other)
    if not merge:
        said.append(f"the model is a {info.what()} in {given}: written as PEFT saves it (adapter_model.safetensors)")
        return plan_adapter(info, source, Path(out).absolute(), dtype=dtype, given=given)
    said.append(f"the model is a {info.what()} in {given}: merging it into its base model")
    return plan_merge(
        info,
        source,
        Path(out).absolute(),
        read_base=lambda folder: _base_source(folder, trust_pickles),
        base=Path(base) if base is not None else None,
        dtype=dtype,
        max_shard_size=max_shard_size,
        given=given,
    )


def _saved_adapter_beside(inv: Inventory, node: Node) -> Optional[str]:
    """Which adapter is taken where a DeepSpeed tag and the Trainer's adapter_model.safetensors are both there,
    and why: the tag's fp32 masters are what the run trained; the file beside it holds the module's copy in the
    training dtype (ZeRO-3 under transformers 5 gathers a whole one; older ones saved an empty file)."""
    if not format_of(node).tag:
        return None
    parent = inv.node(node.path.rsplit("/", 1)[0] if "/" in node.path else ".")
    saved = parent.child("adapter_model.safetensors") if parent is not None and parent is not node else None
    if saved is None:
        return None
    f = cast(TensorFacts, saved.facts)
    dts = "/".join(f.get("dtypes") or [])
    held = f"{f.get('tensor_count') or 0} tensors" + (f", {dts}" if dts else "")
    return (
        f"taking the DeepSpeed tag {inv.shown(node.path, slash=True)} (the fp32 master weights the run trained), "
        f"not {inv.shown(saved.path)} beside it ({held}: the module's copy the Trainer saved"
        + ("" if f.get("tensor_count") else ", empty: an ungathered ZeRO-3 save")
        + ")"
    )


def _base_source(folder: Path, trust_pickles: bool) -> Source:
    """A merge's base model: its weights, screened as every export's source is."""
    _, node, _ = screened_model(folder, trust_pickles=trust_pickles, why="the base model has problems")
    return source_for(node, trust_pickles=trust_pickles)


def _refuse_source_out(plan: ExportPlan) -> None:
    """Refuse now (the dry run and the TUI's wizard say it too) an OUT that is, holds or lies inside a source."""
    from ..fsutil import OutputError
    from .write import check_out_vs_sources, refusal

    try:
        check_out_vs_sources(plan)
    except OutputError as e:
        raise ExportError(refusal(e, plan)) from None


def _plan_optimizer(
    src: LocationLike,
    out: StrPath,
    *,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = "50GB",
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
    tag: Optional[str] = None,
    trust_pickles: bool = False,
    report: Optional[Report] = None,
) -> tuple[ExportPlan, list[str]]:
    """The plan of ``--component optimizer``: exp_avg, exp_avg_sq (and fp32 masters where the run kept them
    apart) per parameter into ``optimizer.safetensors``, the step and param groups into
    ``optimizer_config.json``; names as the model export of the same checkpoint has them. Reads DeepSpeed
    ZeRO tags, torch DCP optimizer folders and torch files with an optimizer state dict; others are
    refused, saying so. ``report``: ``src`` inspected already."""

    report = report if report is not None else inspect(src, trust_pickles=trust_pickles)
    node: Optional[Node]
    try:
        node, said = resolve(report, tag, verb=OPTIMIZER_VERB)
    except ExportError:
        if report.inventory.deepspeed_tags() or tag:
            raise
        node, said = None, []
    if node is None or not format_of(node).optimizer_with_model:
        return _plan_torch_optimizer(
            report,
            node,
            said,
            out,
            dtype=dtype,
            max_shard_size=max_shard_size,
            strip_prefix=strip_prefix,
            keep_prefix=keep_prefix,
            trust_pickles=trust_pickles,
        )
    report, node, said = screened_model(
        src,
        tag=tag,
        trust_pickles=trust_pickles,
        report=report,
        verb=OPTIMIZER_VERB,
        why="the checkpoint has problems an export cannot work around",
    )
    try:
        source, config, names = format_of(node).optimizer_source(node, trust_pickles=trust_pickles)
        model_names = names or []
    except ValueError as e:
        raise ExportError(f"`{report.inventory.shown(node.path)}`: {e}") from None
    except FormatError as e:
        raise ExportError(f"`{report.inventory.shown(node.path)}`: {e}") from None
    return _optimizer_plan(
        node,
        source,
        config,
        model_names,
        out,
        dtype=dtype,
        max_shard_size=max_shard_size,
        strip_prefix=strip_prefix,
        keep_prefix=keep_prefix,
    ), said


def _optimizer_plan(
    node: Node,
    source: Source,
    config: dict[str, Any],
    model_names: list[str],
    out: StrPath,
    *,
    dtype: str,
    max_shard_size: Union[int, str],
    strip_prefix: Optional[str],
    keep_prefix: bool,
) -> ExportPlan:
    """The plan of an optimizer ``source``: the model export's prefix decision (``node``: the model's
    node, ``model_names``: its names) applied to the tensors and to ``config``, which goes beside them."""
    from ..formats.deepspeed.optim import CONFIG_FILE, strip_config

    prefix = choose(node, model_names, strip_prefix=strip_prefix, keep_prefix=keep_prefix)
    strip_names(source, prefix.strip)
    config = strip_config(config, prefix.strip)
    if prefix.note:
        source.notes.append(prefix.note)
    plan = make_plan(source, Path(out).absolute(), dtype=dtype, max_shard_size=max_shard_size, stem="optimizer")
    plan.prefix = prefix
    if dtype in ("bf16", "fp16"):
        plan.notes.append(
            f"--dtype {dtype} casts the optimizer state too: every master, exp_avg and exp_avg_sq "
            f"is written in {dtype}, losing the precision a resumed run needs (--dtype keep writes "
            "them as the run kept them)"
        )
    config["dtype"] = dtype
    plan.extra_files = [(CONFIG_FILE, json.dumps(config, indent=2) + "\n")]
    return plan


def _plan_torch_optimizer(
    report: Report,
    model: Optional[Node],
    said: list[str],
    out: StrPath,
    *,
    dtype: str,
    max_shard_size: Union[int, str],
    strip_prefix: Optional[str],
    keep_prefix: bool,
    trust_pickles: bool,
) -> tuple[ExportPlan, list[str]]:
    """``--component optimizer`` of a torch DCP optimizer folder or a torch file's optimizer state dict;
    ``model``: the checkpoint's model node (its names decide the optimizer's, and their prefix)."""
    inv = report.inventory
    opt = optimizer_component(report)
    if opt is None and model is not None and format_of(model).holds_optimizer(model):  # Lightning FSDP: one DCP
        opt = model
    if opt is None or format_of(opt).optimizer is None or format_of(opt).optimizer_with_model:
        raise _refuse_optimizer(report)
    blocking = _blocking_findings(report, opt, trust_pickles)
    if blocking:
        raise ExportError(
            "the checkpoint has problems an export cannot work around:\n  "
            + "\n  ".join(f"{f.code} at {inv.shown(f.path)}: {f.message}" for f in blocking)
        )
    if opt is not model:
        said = said + [f"the optimizer state is `{inv.shown(opt.path, slash=opt.is_dir)}`"]
    model_tensors: Optional[list[tuple[str, tuple[int, ...]]]] = None
    model_what = ""
    if model is not None:
        try:
            msrc = source_for(model, trust_pickles=trust_pickles)
            if msrc.kind == "safetensors":
                model_what = (
                    f"the model beside it, {inv.shown(model.path)}, is safetensors: it keeps no parameter order"
                )
            else:
                model_tensors = [
                    (t.name, tuple(t.shape))
                    for t in msrc.tensors
                    if t.tied_to is None and t.dtype.startswith(("float", "bfloat"))
                ]
        except (ExportError, FormatError) as e:
            model_what = f"the model's names cannot be read: {e}"
    try:
        source, config, _ = format_of(opt).optimizer_source(
            opt, model_tensors=model_tensors, model_what=model_what, trust_pickles=trust_pickles
        )
    except FormatError as e:
        raise ExportError(f"`{inv.shown(opt.path)}`: {e}") from None
    names = (
        [n for n, _ in model_tensors]
        if model_tensors is not None
        else [t.name for t in source.tensors if not t.name.startswith("param_")]
    )
    plan = _optimizer_plan(
        model or opt,
        source,
        config,
        names,
        out,
        dtype=dtype,
        max_shard_size=max_shard_size,
        strip_prefix=strip_prefix,
        keep_prefix=keep_prefix,
    )
    return plan, said


def _plan(
    report: Report,
    node: Node,
    out: StrPath,
    *,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = "50GB",
    exclude_frozen: bool = False,
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
    config: Optional[StrPath] = None,
    trust_pickles: bool = False,
    from_module_states: bool = False,
    to: Optional[str] = None,
    true_vocab_size: Optional[int] = None,
    tokenizer: Optional[StrPath] = None,
) -> ExportPlan:
    """The export plan of ``node`` (a model component of the scanned ``report``), without scanning again.
    ``to="hf"``: a Hugging Face model (:mod:`.to_hf`; ``tokenizer``: the folder its tokenizer is copied from)."""
    try:
        source = source_for(
            node, exclude_frozen=exclude_frozen, trust_pickles=trust_pickles, from_module_states=from_module_states
        )
    except FormatError as e:
        raise ExportError(f"`{report.inventory.shown(node.path)}`: {e}") from None
    prefix = choose(node, [t.name for t in source.tensors], strip_prefix=strip_prefix, keep_prefix=keep_prefix)
    strip_names(source, prefix.strip)
    if prefix.note:
        source.notes.append(prefix.note)
    if to == "hf":
        return _plan_hf(
            report,
            node,
            source,
            out,
            dtype=dtype,
            max_shard_size=max_shard_size,
            config=config,
            true_vocab_size=true_vocab_size,
            tokenizer=tokenizer,
        )
    if true_vocab_size is not None or tokenizer is not None:
        raise ExportError(
            ("--true-vocab-size" if true_vocab_size is not None else "--tokenizer") + " goes with --to hf"
        )
    plan = make_plan(
        source,
        Path(out).absolute(),
        dtype=dtype,
        max_shard_size=max_shard_size,
        exclude_frozen=exclude_frozen,
        config_dirs=config_dirs(node, report),
        config_path=Path(config) if config else None,
    )
    plan.prefix = prefix
    return plan


TO = ("safetensors", "hf")  # what --to may ask for


def _plan_hf(
    report: Report,
    node: Node,
    source: Source,
    out: StrPath,
    *,
    dtype: str,
    max_shard_size: Union[int, str],
    config: Optional[StrPath],
    true_vocab_size: Optional[int],
    tokenizer: Optional[StrPath] = None,
) -> ExportPlan:
    """``--to hf``: the model as a Hugging Face LlamaForCausalLM folder (names mapped, fused tensors split, its
    config.json written, the tokenizer and generation_config.json copied: :mod:`.hf_folder`), refused where the
    checkpoint is not a Llama-family Megatron-Core GPT model or torchtitan Llama."""
    from .hf_folder import add_hf_side_files, run_tokenizer_dir, torchtitan_assets_dir
    from .to_hf import (
        find_torchtitan_job_config,
        is_megatron_gpt,
        is_torchtitan_llama,
        megatron_to_hf,
        torchtitan_to_hf,
    )

    inv = report.inventory
    names = [t.name for t in source.tensors]
    config_path = Path(config) if config is not None else None
    dcp = format_of(node).torch_dcp
    recorded: Optional[tuple[Path, str]] = None  # the tokenizer folder the run recorded
    recorded_note: Optional[str] = None
    if dcp and is_megatron_gpt(names):
        from ..formats.dcp.format import megatron_args

        args = megatron_args(node)
        hf, cfg, notes = megatron_to_hf(source, args, config_path=config_path, true_vocab_size=true_vocab_size)
        found, recorded_note = run_tokenizer_dir(args)
        if found is not None:
            recorded = (found, "the run's --tokenizer-model")
    elif dcp and is_torchtitan_llama(names):
        step_dir = node.abspath if isinstance(node.abspath, Path) else None
        hf, cfg, notes = torchtitan_to_hf(
            source,
            step_dir,
            config_path=config_path,
            true_vocab_size=true_vocab_size,
        )
        job = find_torchtitan_job_config(step_dir) if step_dir is not None else None
        if job is not None:
            found, recorded_note = torchtitan_assets_dir(job)
            if found is not None:
                recorded = (found, "torchtitan's hf_assets_path")
    else:
        raise ExportError(
            f"--to hf reads Megatron-Core torch_dist GPT checkpoints and torchtitan Llama step-N checkpoints; "
            f"{inv.shown(node.path, slash=node.is_dir)} is "
            f"{inv.framework or node.format or 'not one'} (tensors {', '.join(names[:3])}"
            + (", ..." if len(names) > 3 else "")
            + "). The plain export (without --to hf) writes it under its own names"
        )
    plan = make_plan(hf, Path(out).absolute(), dtype=dtype, max_shard_size=max_shard_size)
    if dtype != "keep":
        cfg["dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    else:
        dts = {t.dtype for t in hf.tensors}
        if len(dts) == 1:
            cfg["dtype"] = dts.pop()
    plan.missing_config = []
    plan.extra_files = [("config.json", json.dumps(cfg, indent=2) + "\n")]
    plan.notes.extend(notes)
    add_hf_side_files(
        plan,
        tokenizer=Path(tokenizer) if tokenizer is not None else None,
        config_path=config_path,
        recorded=recorded,
        dirs=config_dirs(node, report),
        shown=inv.user_form,
        recorded_note=recorded_note,
    )
    return plan


def export_needs(
    report: Report,
    node: Node,
    *,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = "50GB",
    exclude_frozen: bool = False,
    from_module_states: bool = False,
    config: Optional[StrPath] = None,
    component: Optional[str] = None,
    merge: bool = False,
    to: Optional[str] = None,
    true_vocab_size: Optional[int] = None,
    tokenizer: Optional[StrPath] = None,
) -> int:
    """The bytes an export of ``node`` (an ``Inventory.export_candidates`` path of the scanned ``report``)
    writes with these options -- the model's tensors in the output dtype, safetensors headers, the index,
    the copied config files, never the optimizer states -- as ``export`` checks free space for
    (``ExportPlan.output_bytes``). ``component="optimizer"``: what ``--component optimizer`` of the scanned
    checkpoint writes instead (``node`` is not used). Reads headers (a DeepSpeed tag: every rank's
    optimizer-states pickle), never tensor data: call it off the UI thread. ``to="hf"``: what ``--to hf``
    writes (split and renamed tensors, ``true_vocab_size``'s rows, config.json, the tokenizer and generation
    config it copies). Raises ExportError (not exportable, unreadable; ``to="hf"`` without the configuration it
    needs: ``NeedsConfig``), ValueError (a bad dtype or size)."""
    # OUT is only planned, never written, and its place changes no size: beside a local checkpoint; for one in
    # object storage (a RemotePath, deliberately no os.PathLike, which make_plan's Path() refused) a local name
    where = report.inventory.path
    out: StrPath = (
        Path(os.fspath(where), ".ckpt-tui-needs") if isinstance(where, os.PathLike) else Path(".ckpt-tui-needs")
    )
    if component == "optimizer":
        plan, _ = _plan_optimizer(
            report.inventory.path,
            out,
            dtype=dtype,
            max_shard_size=max_shard_size,
            trust_pickles=report.inventory.trust_pickles,
            report=report,
        )
        return plan.output_bytes
    inv = report.inventory
    if inv.adapter is not None and inv.adapter.node is node:  # a LoRA adapter: what its export writes
        adapter = _adapter_plan(
            report,
            node,
            out,
            merge=merge,
            base=None,
            adapter_config=None,
            dtype=dtype,
            max_shard_size=max_shard_size,
            trust_pickles=inv.trust_pickles,
            said=[],
        )
        if adapter is not None:
            return adapter.output_bytes
    plan = _plan(
        report,
        node,
        out,
        dtype=dtype,
        max_shard_size=max_shard_size,
        exclude_frozen=exclude_frozen,
        config=config,
        trust_pickles=report.inventory.trust_pickles,
        from_module_states=from_module_states,
        to=to,
        true_vocab_size=true_vocab_size,
        tokenizer=tokenizer,
    )
    return plan.output_bytes


def export(
    src: LocationLike,
    out: StrPath,
    *,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = "50GB",
    jobs: int = 1,
    exclude_frozen: bool = False,
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
    config: Optional[StrPath] = None,
    tag: Optional[str] = None,
    overwrite: bool = False,
    verify: bool = True,
    trust_pickles: bool = False,
    from_module_states: bool = False,
    component: Optional[str] = None,
    merge: bool = False,
    base: Optional[StrPath] = None,
    adapter_config: Optional[StrPath] = None,
    to: Optional[str] = None,
    true_vocab_size: Optional[int] = None,
    tokenizer: Optional[StrPath] = None,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
) -> ExportResult:
    plan, said = plan_export(
        src,
        out,
        dtype=dtype,
        max_shard_size=max_shard_size,
        exclude_frozen=exclude_frozen,
        strip_prefix=strip_prefix,
        keep_prefix=keep_prefix,
        config=config,
        tag=tag,
        trust_pickles=trust_pickles,
        from_module_states=from_module_states,
        component=component,
        merge=merge,
        base=base,
        adapter_config=adapter_config,
        to=to,
        true_vocab_size=true_vocab_size,
        tokenizer=tokenizer,
    )
    res = execute(plan, jobs=jobs, overwrite=overwrite, verify=verify, on_progress=on_progress, cancel=cancel)
    res.notes = said + res.notes
    return res
