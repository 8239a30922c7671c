"""ZeRO stage 0: no optimizer-states files; the optimizer (and any fp32 masters) inside ``mp_rank_00_model_states.pt``."""

from __future__ import annotations

from typing import Any, Optional

from ...dtypes import short_dtype
from ...export.sources import Source, SourceTensor
from ...storage import Location, LocationLike, as_path
from ..unpickle import TensorRef, iter_tensors
from .module_states import MODULE_NOTE
from .reader import (
    MODEL_STATES_RE,
    inline_optimizer,
    module_param_names,
    stage_value,
)
from .states import StatesFile, check_model_states, config_train_dtype, ref_ranges, tag_names

STAGE0_NOTE = (
    "ZeRO stage 0: no *_optim_states.pt; the optimizer is inside mp_rank_00_model_states.pt "
    "(zero_to_fp32 rejects this checkpoint: it has no optimizer-states files and no param_shapes)"
)


def open_stage0(tag_dir: Location) -> tuple[StatesFile, dict[str, Any], Optional[str]]:
    """A stage-0 tag's model-states file, its object and the optimizer kind inside it."""
    names = tag_names(tag_dir)
    ms = [n for n in names if MODEL_STATES_RE.match(n)]
    if ms != ["mp_rank_00_model_states.pt"]:
        raise ValueError(
            f"ZeRO stage 0 expects one mp_rank_00_model_states.pt in {tag_dir.name}, found {ms or 'none'}"
            " (tensor or pipeline parallelism?)"
        )
    mf = StatesFile(tag_dir / ms[0])
    m0 = check_model_states(mf.obj, mf.path.name)
    kind = inline_optimizer(m0)
    cfg = m0.get("ds_config")
    zo = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
    stage = stage_value(zo.get("stage")) if isinstance(zo, dict) else None
    if kind is None and stage in (1, 2, 3):
        raise ValueError(
            f"no *_optim_states.pt in {tag_dir}: the fp32 master weights of this ZeRO-{stage} "
            "checkpoint live there (saved without optimizer states?)"
        )
    if not isinstance(m0.get("module"), dict) or not m0["module"]:
        raise ValueError(f"{mf.path.name} holds no module weights (saved with exclude_frozen_parameters?)")
    return mf, m0, kind


def stage0_masters(m0: dict[str, Any], name: str) -> list[tuple[str, TensorRef]]:
    """FP16_UnfusedOptimizer's fp32 masters (``fp32_groups``, flattened in order) paired with the module's
    parameters in ``named_parameters()`` order -- DeepSpeed records no names here: the pairing holds when
    count, order and every shape agree (the engine built its optimizer from ``model.parameters()``), and is
    refused otherwise (frozen or reordered parameters)."""
    module = m0["module"]
    params = module_param_names(module, m0.get("buffer_names"))
    masters = [t for g in m0["optimizer"]["fp32_groups"] if isinstance(g, (list, tuple)) for t in g]
    if len(masters) != len(params):
        raise ValueError(
            f"{name}: FP16_UnfusedOptimizer holds {len(masters)} fp32 masters but the module has "
            f"{len(params)} parameters (frozen parameters, or param groups of their own); DeepSpeed "
            "records no names for them, so which master is which is unknown. Export the module "
            "weights (training dtype) instead: --from-module-states"
        )
    out = []
    for p, t in zip(params, masters):
        if not isinstance(t, TensorRef) or tuple(t.shape) != tuple(module[p].shape) or t.dtype != "float32":
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, TensorRef) else type(t).__name__
            raise ValueError(
                f"{name}: the fp32 master in the place of {p} is {got}, the parameter "
                f"{tuple(module[p].shape)}: the optimizer's order is not the module's"
            )
        out.append((p, t))
    return out


def stage0_source(tag_dir: LocationLike, *, exclude_frozen: bool = False) -> Source:
    """ZeRO stage 0 (no ZeRO): bf16/fp16 runs have FP16_UnfusedOptimizer's fp32 masters in the model states
    (``optimizer.fp32_groups``): each parameter is its master; fp32 runs keep the plain torch optimizer there and
    the module weights are the masters. Buffers as stored; tied names written once."""
    tag = as_path(tag_dir)
    mf, m0, kind = open_stage0(tag)
    module = m0["module"]
    buffer_names = {str(b) for b in (m0.get("buffer_names") or [])}
    masters = dict(stage0_masters(m0, mf.path.name)) if kind == "fp16-unfused" else {}
    params = set(module_param_names(module, buffer_names))
    out: list[SourceTensor] = []
    first_by_view: dict[tuple[object, ...], str] = {}
    for name, t in iter_tensors(module):
        if t.storage is None:
            raise ValueError(f"{mf.path.name}: module weight {name} has no storage (a tensor subclass?)")
        view = (t.storage.key, t.offset, tuple(t.shape), t.stride)
        first_name = first_by_view.setdefault(view, name)
        tied = first_name if first_name != name else None
        if tied is not None:
            first = next(x for x in out if x.name == tied)
            out.append(SourceTensor(name, first.shape, first.dtype, first.ranges, tied_to=tied, note=first.note))
            continue
        if name in masters:
            m = masters[name]
            out.append(SourceTensor(name, tuple(m.shape), m.dtype, ref_ranges(mf, m, name)))
        else:
            note = "" if name in buffer_names or name not in params or not masters else MODULE_NOTE
            out.append(SourceTensor(name, tuple(t.shape), t.dtype, ref_ranges(mf, t, name), note=note))
    notes = [STAGE0_NOTE]
    train = config_train_dtype(m0)
    if kind == "fp16-unfused":
        notes.append(
            f"FP16_UnfusedOptimizer: each parameter is its fp32 master from optimizer.fp32_groups, paired with "
            f"the module's parameters by order and shape ({len(masters)} of them)"
        )
    elif train in ("bfloat16", "float16"):
        notes.append(
            f"HALF PRECISION: no fp32 masters in this checkpoint; the module weights ({short_dtype(train)}) are written"
        )
    else:
        notes.append(
            "fp32 training: the module weights are the masters (the plain torch optimizer keeps no separate "
            "fp32 copy): they are written as stored"
        )
    return Source("deepspeed", tag, out, train_dtype=train, notes=notes)
