"""A tag's model-states ``module`` weights (training dtype) as the export, when no fp32 master is wanted or read."""

from __future__ import annotations

from typing import Any, Optional

from ...dtypes import short_dtype
from ...export.sources import Source, SourceTensor
from ...storage import LocationLike, as_path
from ..unpickle import iter_tensors
from .moe import expected_expert_files, num_experts
from .reader import (
    MODEL_STATES_RE,
    module_param_names,
    stage_value,
)
from .states import StatesFile, check_model_states, ref_ranges, shapes_of, tag_names

MODULE_NOTE = "module weights (training dtype), not an fp32 master"


ZERO3_MODULE_REFUSAL = (
    "ZeRO-3 partitions the parameters themselves: its zero_pp_rank_*_model_states.pt files hold "
    "empty placeholders for the module weights, not whole weights, so there are no module "
    "weights to export; they can only be rebuilt from every rank's optimizer states"
)


def module_states_source(tag_dir: LocationLike, *, exclude_frozen: bool = False) -> Source:
    """The ``module`` state dict of a ZeRO-1/2 tag's ``mp_rank_00_model_states.pt``, as byte ranges.

    These are the weights the model computed with, in the training dtype (bf16/fp16): what is left
    when the fp32 masters cannot be rebuilt (an optimizer-states file missing or corrupt). Nothing
    from the optimizer-states files is read. Tied aliases (one storage, or ``shared_params``) are
    written once; frozen params are flagged so ``--exclude-frozen`` leaves them out.
    """
    tag = as_path(tag_dir)
    names = tag_names(tag)
    matches = [m for m in map(MODEL_STATES_RE.match, names) if m]
    if any(m.group(1) is not None for m in matches):
        raise ValueError(ZERO3_MODULE_REFUSAL)
    if any(int(m.group(2)) != 0 for m in matches):
        raise ValueError("model-parallel checkpoints (mp_rank > 0 files) are not supported")
    if "mp_rank_00_model_states.pt" not in names:
        raise ValueError(f"no mp_rank_00_model_states.pt in {tag.name}: there are no module weights to export")
    mf = StatesFile(tag / "mp_rank_00_model_states.pt")
    m0 = check_model_states(mf.obj, mf.path.name)
    cfg = m0.get("ds_config")
    zo = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
    if isinstance(zo, dict) and stage_value(zo.get("stage")) == 3:
        raise ValueError(ZERO3_MODULE_REFUSAL)
    module: Any = m0.get("module")
    if not isinstance(module, dict) or not module:
        raise ValueError(
            f"{mf.path.name} holds no module weights (saved with exclude_frozen_parameters, or "
            "by a model that keeps its weights elsewhere)"
        )
    buffer_names = {str(b) for b in (m0.get("buffer_names") or [])}
    if m0.get("param_shapes") is None:  # ZeRO stage 0 records none: every module parameter is trained
        trainable = {n: tuple(module[n].shape) for n in module_param_names(module, buffer_names)}
    else:
        trainable = {n: s for g in shapes_of(m0, mf.path.name) for n, s in g.items()}
    shared = (
        {str(k): str(v) for k, v in (m0.get("shared_params") or {}).items()}
        if isinstance(m0.get("shared_params"), dict)
        else {}
    )
    fz = m0.get("frozen_param_shapes")
    recorded_frozen = {str(k) for k in fz} if isinstance(fz, dict) else None

    out: list[SourceTensor] = []
    first_by_view: dict[tuple[object, ...], str] = {}
    seen: set[str] = set()
    for name, t in iter_tensors(module):
        shape = tuple(t.shape)
        want = trainable.get(name)
        if want is not None and want != shape:
            raise ValueError(
                f"{mf.path.name}: module weight {name} has shape {shape} but param_shapes says "
                f"{want} (a partitioned module: ZeRO-3?)"
            )
        if t.storage is None:
            raise ValueError(f"{mf.path.name}: module weight {name} has no storage (a tensor subclass?)")
        view = (t.storage.key, t.offset, shape, t.stride)
        first = first_by_view.setdefault(view, name)
        tied: Optional[str] = first if first != name else None
        if tied is None and shared.get(name) in seen:
            tied = shared[name]
        seen.add(name)
        if recorded_frozen is not None:
            frozen = name in recorded_frozen
        else:  # ZeRO-1 records no frozen_param_shapes: what is neither trainable nor a buffer is frozen
            frozen = name not in trainable and name not in buffer_names and name not in shared
        out.append(
            SourceTensor(
                name,
                shape,
                t.dtype,
                ref_ranges(mf, t, name),
                tied_to=tied,
                frozen=frozen and not tied,
                note=MODULE_NOTE,
            )
        )
    if not out:
        raise ValueError(f"{mf.path.name} holds no module weights")
    experts = num_experts(m0)
    if experts is not None:  # a mixture of experts: each expert's weights are in its own file, global names
        for fname in expected_expert_files(experts):
            if fname not in names:
                raise ValueError(f"{fname} is missing: the module weights of that expert are in no other file")
            ef = StatesFile(tag / fname)
            for name, t in iter_tensors(ef.obj):
                if t.storage is None:
                    raise ValueError(f"{fname}: {name} has no storage (a tensor subclass?)")
                out.append(SourceTensor(name, tuple(t.shape), t.dtype, ref_ranges(ef, t, name), note=MODULE_NOTE))
    floats = sorted({t.dtype for t in out if t.dtype in ("bfloat16", "float16", "float32", "float64")})
    half = [d for d in floats if d in ("bfloat16", "float16")]
    shown = "/".join(short_dtype(d) for d in floats) or "as stored"
    if half:
        note = (
            f"HALF PRECISION ({shown}): these are the module weights of mp_rank_00_model_states.pt in the training "
            "dtype (--from-module-states), NOT the fp32 master weights. Fine to load and run or fine-tune from; "
            "the fp32 masters of this step are not in them"
        )
    else:
        note = (
            f"module weights ({shown}) of mp_rank_00_model_states.pt (--from-module-states), not rebuilt from "
            "the optimizer states"
        )
    return Source("deepspeed-module", tag, out, notes=[note])
