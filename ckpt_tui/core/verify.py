"""verify OUT --against SRC: every exported tensor against the source read by an independent
reference path (torch's DCP loader, DeepSpeed's zero_to_fp32, torch.load, safetensors).

The reference tools unpickle without restriction, so they run only on a checkpoint whose pickles
our restricted reader screened (no ``unsafe-pickle`` finding), or with ``trust_pickles``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union, cast

from .export.api import screened_model, source_for
from .export.prefix import choose
from .export.sources import strip_names
from .export.to_hf import hf_references, is_hf_export, is_megatron_gpt, is_torchtitan_llama
from .export.write import ExportError  # where it is defined: api imports it, and does not export it
from .formats import screen
from .formats.format import NotExportable
from .formats.registry import format_of
from .jsondoc import JsonFields
from .progress import OnProgress, Progress, check_cancel
from .storage import LocationLike, download, is_url
from .types import Node

if TYPE_CHECKING:
    import torch

    from .export.plan import ExportPlan

# (name, tensor) pairs, a tensor at a time: what a reference loader yields
References = Iterator[tuple[str, "torch.Tensor"]]


@dataclass
class VerifyResult(JsonFields):
    json_keys = (
        "ok",
        "compared",
        "mismatches",
        "missing_in_output",
        "not_in_reference",
        "reference",
        "stripped_prefix",
        "problems",
    )

    compared: int = 0
    mismatches: list[str] = field(default_factory=list)
    missing_in_output: list[str] = field(default_factory=list)
    not_in_reference: list[str] = field(default_factory=list)
    reference: str = ""
    stripped_prefix: Optional[str] = None  # removed from the source's names before comparing, as export does
    note: str = ""  # what was decided about the prefix, said to the user
    problems: list[str] = field(default_factory=list)  # an optimizer export's optimizer_config.json, where it is wrong

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.missing_in_output and not self.problems


def _output_tensors(out: Union[str, os.PathLike[str]], stem: Optional[str] = None) -> dict[str, tuple[Path, str]]:
    """name -> (file, safetensors dtype) of an export folder or file (``stem``: only ``stem.safetensors``
    and its shards ``stem-0000k-of-0000n.safetensors``)."""
    from .formats.safetensors import header as stfmt

    out = Path(out)
    files = [out] if out.is_file() else sorted(out.glob("*.safetensors"))
    if stem is not None:
        files = [f for f in files if f.name == f"{stem}.safetensors" or f.name.startswith(f"{stem}-")]
    if not files:
        raise ExportError(f"{out}: no .safetensors files")
    res: dict[str, tuple[Path, str]] = {}
    for f in files:
        for t in stfmt.read_header(f).tensors:
            res[t.name] = (f, t.dtype)
    return res


def _reference(node: Node, strip_prefix: Optional[str], trust_pickles: bool = False) -> References:
    """Yields (name, tensor) from the reference loader of the node's format, a tensor at a time, once every file
    that loader reads passed the screen as it will read them (screen.require: a ScreenError otherwise)."""
    fmt = format_of(node)
    try:
        screen.require(fmt.loader_files(node), trust_pickles=trust_pickles, loader=reference_name(node))
        yield from fmt.reference_tensors(node, strip_prefix)
    except NotExportable as e:
        raise ExportError(str(e)) from None


def reference_name(node: Node) -> str:
    fmt = format_of(node)
    return fmt.reference_for(node) or node.format


def _prefix(
    node: Node,
    names: list[str],
    outs: Mapping[str, object],
    strip_prefix: Optional[str],
    keep_prefix: bool,
) -> tuple[Optional[str], str]:
    """The prefix export would strip from ``names`` by default (a Lightning source's one attribute),
    unless the output shows the export kept it (``--keep-prefix``): more of its names match the
    source's own names than the stripped ones."""
    choice = choose(node, names, strip_prefix=strip_prefix, keep_prefix=keep_prefix)
    p = choice.strip
    if not p or strip_prefix:
        return p, ""
    stripped = {n[len(p) :] for n in names}
    if len(outs.keys() & set(names)) > len(outs.keys() & stripped):
        return None, f"the export kept the LightningModule attribute prefix `{p}`: compared under the source's names"
    return p, f"compared without the LightningModule attribute prefix `{p}`, as export strips it"


def compare_each(
    refs: Iterable[tuple[str, torch.Tensor]],
    outs: dict[str, tuple[Path, str]],
    res: VerifyResult,
    *,
    cancel: Optional[threading.Event] = None,
    on_progress: Optional[OnProgress] = None,
    not_missing: Set[str] = frozenset(),
) -> set[str]:
    """Compare each ``(name, reference tensor)`` with the output tensor of that name, bit for bit after the
    export's cast (a float reference in the output's dtype); count into ``res``. A reference name with no
    output is missing unless in ``not_missing`` (tied aliases written once). Returns the names compared."""
    import torch
    from safetensors import safe_open

    seen: set[str] = set()
    handles: dict[Path, Any] = {}  # open safe_open handles (safetensors' stub types none of their methods)
    try:
        for name, ref in refs:
            check_cancel(cancel)
            if name not in outs:
                if name not in not_missing:
                    res.missing_in_output.append(name)
                continue
            seen.add(name)
            path, _ = outs[name]
            if path not in handles:
                # safetensors' stub (safetensors/__init__.pyi) leaves safe_open.__enter__ unannotated
                handles[path] = safe_open(str(path), framework="pt").__enter__()  # type: ignore[no-untyped-call]
            got = handles[path].get_tensor(name)
            want = ref.to(got.dtype) if ref.is_floating_point() and got.is_floating_point() else ref
            res.compared += 1
            if (
                tuple(got.shape) != tuple(want.shape)
                or got.dtype != want.dtype
                or not torch.equal(got.reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8))
            ):
                res.mismatches.append(name)
            if on_progress:
                on_progress(Progress(len(seen), len(outs), "files", name))
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    return seen


def verify(
    out: Union[str, os.PathLike[str]],
    against: LocationLike,
    *,
    trust_pickles: bool = False,
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
) -> VerifyResult:
    """Every tensor of the export ``out`` against ``against`` read by its reference loader. The
    source's names get the prefix decision of export (a Lightning checkpoint loses its one
    LightningModule attribute prefix): ``strip_prefix`` / ``keep_prefix`` as given to export."""
    if is_url(against):  # the reference loaders read local files: a temp copy of the source, removed after
        import tempfile

        from .fsutil import owned_temp, remove_temp
        from .leftovers import VERIFY_TEMP

        tmp = owned_temp(tempfile.gettempdir(), VERIFY_TEMP)  # a killed verify's is swept by the next
        try:
            local = download(against, Path(tmp), cancel)
            return verify(
                out,
                str(local),
                trust_pickles=trust_pickles,
                strip_prefix=strip_prefix,
                keep_prefix=keep_prefix,
                on_progress=on_progress,
                cancel=cancel,
            )
        finally:
            remove_temp(tmp)

    if is_optimizer_export(Path(out)):
        return verify_optimizer(
            out,
            against,
            trust_pickles=trust_pickles,
            strip_prefix=strip_prefix,
            keep_prefix=keep_prefix,
            on_progress=on_progress,
            cancel=cancel,
        )
    _, node, _ = screened_model(
        against, trust_pickles=trust_pickles, why="refusing to hand this checkpoint to the reference loaders"
    )
    outs = _output_tensors(Path(out))
    source = source_for(node, trust_pickles=trust_pickles)
    strip_prefix, note = _prefix(node, [t.name for t in source.tensors], outs, strip_prefix, keep_prefix)
    res = VerifyResult(reference=reference_name(node), stripped_prefix=strip_prefix, note=note)
    # tied aliases the reference returns under both names are written once, as save_pretrained does
    aliases = {t.name for t in strip_names(source, strip_prefix).tensors if t.tied_to}
    # stripped here: not every reference loader applies it
    refs: Iterator[tuple[str, Any]] = (
        (n[len(strip_prefix) :] if strip_prefix and n.startswith(strip_prefix) else n, ref)
        for n, ref in _reference(node, None, trust_pickles)
    )
    names = [t.name for t in source.tensors]
    hf_cfg = is_hf_export(Path(out)) if Path(out).is_dir() else None
    if hf_cfg is not None and (is_megatron_gpt(names) or is_torchtitan_llama(names)):
        refs = hf_references(refs, hf_cfg)  # a --to hf export: the source's tensors as HF's, mapped afresh
        res.note = "compared under the Hugging Face names export --to hf maps the source's to"
    seen = compare_each(refs, outs, res, cancel=cancel, on_progress=on_progress, not_missing=aliases)
    res.not_in_reference = sorted(set(outs) - seen)
    # tied aliases the reference returns twice are written once: not a miss
    return res


def is_optimizer_export(out: Path) -> bool:
    """An ``--component optimizer`` output: optimizer_config.json beside optimizer*.safetensors, no model."""
    from .formats.deepspeed.optim import CONFIG_FILE

    return (
        out.is_dir()
        and (out / CONFIG_FILE).is_file()
        and any(out.glob("optimizer*.safetensors"))
        and not any(out.glob("model*.safetensors"))
    )


def _config_problems(cfg: object, planned: dict[str, Any], outs: Mapping[str, object]) -> list[str]:
    """What is wrong with an export's optimizer_config.json: not the step and param groups the source has,
    or a parameter whose tensors are exported but that no param group names (or the reverse)."""
    from .formats.deepspeed.optim import CONFIG_FILE

    if not isinstance(cfg, dict) or not isinstance(cfg.get("param_groups"), list):
        return [f"{CONFIG_FILE} has no param_groups list"]
    out = []
    if cfg.get("step") != planned.get("step"):
        out.append(f"{CONFIG_FILE}: step {cfg.get('step')!r}, the source's is {planned.get('step')!r}")
    ours = [{k: v for k, v in g.items()} for g in cfg["param_groups"] if isinstance(g, dict)]
    if ours != planned["param_groups"]:
        out.append(f"{CONFIG_FILE}: the param groups (hyper-parameters or parameter names) differ from the source's")
    named = {n for g in ours for n in (g.get("params") or [])}
    with_tensors = {n.rsplit(".", 1)[0] for n in outs}
    if with_tensors - named:
        out.append(
            f"{CONFIG_FILE}: {len(with_tensors - named)} exported parameter(s) in no param group, e.g. "
            f"{sorted(with_tensors - named)[0]}"
        )
    return out


def verify_optimizer(
    out: Union[str, os.PathLike[str]],
    against: LocationLike,
    *,
    trust_pickles: bool = False,
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
) -> VerifyResult:
    """An optimizer export ``out`` against ``against``: every tensor bit-exact with torch's own reader of
    the source (the DCP loader, ``torch.load``), named by the param groups the export's
    optimizer_config.json records (so its names are checked too), and that config against the source's
    step and param groups. A DeepSpeed tag's state is re-read through ckpt-tui's partition map (DeepSpeed
    has no per-parameter reader short of ds_to_universal: ``ckpt-tui universal``)."""
    import json

    from .export.api import plan_export
    from .formats.deepspeed.optim import CONFIG_FILE

    out = Path(out)
    plan, _ = plan_export(
        against,
        out / ".ckpt-tui-verify",
        component="optimizer",
        strip_prefix=strip_prefix,
        keep_prefix=keep_prefix,
        trust_pickles=trust_pickles,
    )
    outs = _output_tensors(out, "optimizer")
    planned = json.loads(dict(plan.extra_files)[CONFIG_FILE])
    try:
        cfg = json.loads((out / CONFIG_FILE).read_text())
    except (OSError, ValueError) as e:
        cfg = None
        problems = [f"{CONFIG_FILE} cannot be read: {e}"]
    else:
        problems = _config_problems(cfg, planned, outs)
    res = VerifyResult(stripped_prefix=plan.prefix.strip if plan.prefix else None, problems=problems)
    refs = _optimizer_reference(plan, cfg if not problems else planned, res, trust_pickles)
    seen = compare_each(refs, outs, res, cancel=cancel, on_progress=on_progress)
    res.not_in_reference = sorted(set(outs) - seen)
    return res


def _optimizer_reference(plan: ExportPlan, cfg: dict[str, Any], res: VerifyResult, trust_pickles: bool) -> References:
    """(exported name, tensor) of the source's optimizer state, read by torch where torch can."""
    kind = plan.source.kind
    strip = plan.prefix.strip if plan.prefix else None
    if kind == "torch-file-optimizer":
        import torch

        from .formats.torch_save.optim import find_optimizer_state

        res.reference = "torch.load" + ("" if trust_pickles else "(weights_only=True)")
        screen.require([plan.source.path], trust_pickles=trust_pickles, loader="torch.load")
        obj = torch.load(plan.source.path, map_location="cpu", mmap=True, weights_only=not trust_pickles)
        sd, _, _ = find_optimizer_state(obj)
        if sd is None:  # the plan found it with ckpt-tui's reader; torch.load of the same file does not
            raise ExportError(f"{plan.source.path}: torch.load finds no optimizer state in it")
        state = sd["state"]
        for g_ref, g_cfg in zip(sd["param_groups"], cfg["param_groups"]):
            for idx, name in zip(g_ref["params"], g_cfg["params"]):
                for leaf, t in (state.get(idx) or {}).items():
                    if leaf != "step" and isinstance(t, torch.Tensor):
                        yield f"{name}.{leaf}", t
    elif kind == "dcp-optimizer":
        from .formats.dcp.optim import reference_tensors

        res.reference = "torch DCP loader"
        screen.require(
            screen.dcp_metadata_files(plan.source.path), trust_pickles=trust_pickles, loader="torch's DCP reader"
        )
        for name, t in reference_tensors(cast(Path, plan.source.path)):  # local: a remote SRC was downloaded
            yield (name[len(strip) :] if strip and name.startswith(strip) else name), t
    elif kind == "verl-optimizer":
        from .formats.verl.source import optimizer_reference_tensors

        res.reference = "torch.load of every rank's optim file, joined as verl's model merger joins shards"
        folder = Path(cast("os.PathLike[str]", plan.source.path))  # local: verify downloads a remote SRC first
        screen.require(
            sorted(folder.glob("optim_world_size_*_rank_*.pt")), trust_pickles=trust_pickles, loader="torch.load"
        )
        shapes = {t.name: tuple(t.shape) for f in plan.files for t in f.tensors}
        yield from optimizer_reference_tensors(plan.source.path, cfg, shapes)
    else:
        from .export.sources import to_torch

        res.reference = "ckpt-tui's ZeRO partition map (DeepSpeed's ds_to_universal: `ckpt-tui universal`)"
        for f in plan.files:
            for t in f.tensors:
                yield t.name, to_torch(t.src)
