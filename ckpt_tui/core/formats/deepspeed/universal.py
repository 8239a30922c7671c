"""A DeepSpeed universal checkpoint (``zero/<param>/fp32.pt``) as an export source."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from typing import Any, cast

from ...export.sources import Source, SourceTensor
from ...storage import LocationLike, as_path, listdir
from ..unpickle import TensorRef
from .reader import (
    LAYER_RE,
    MODEL_STATES_RE,
)
from .states import StatesFile, as_shape, check_model_states, config_train_dtype, ref_ranges, shapes_of


def _model_states_order(n: str) -> tuple[int, int]:
    m = cast("re.Match[str]", MODEL_STATES_RE.match(n))  # a model-states file's name
    return (0 if n.startswith("mp_rank_") else 1, int(m.group(1) or 0))


def universal_source(universal_dir: LocationLike) -> Source:
    """A DeepSpeed universal checkpoint: ``zero/<param>/fp32.pt`` per param, buffers from model states."""
    folder = as_path(universal_dir)
    zdir = folder / "zero"
    if not zdir.is_dir():
        raise ValueError(f"{folder} has no zero/ folder: not a DeepSpeed universal checkpoint")
    names = sorted(listdir(folder))
    if any(LAYER_RE.match(n) for n in names):
        raise ValueError("pipeline-parallel universal checkpoints are not supported")
    model_names = sorted(
        (n for n in names if MODEL_STATES_RE.match(n)),
        key=_model_states_order,
    )
    mf = StatesFile(folder / model_names[0]) if model_names else None
    m0: dict[str, Any] = mf.obj if mf is not None and isinstance(mf.obj, dict) else {}
    if mf is not None:
        check_model_states(m0, mf.path.name)

    params = {n for n in listdir(zdir) if (zdir / n / "fp32.pt").is_file()}
    shapes: "OrderedDict[str, tuple[int, ...]]" = OrderedDict()
    if m0:
        mf = cast(StatesFile, mf)  # m0 is its object
        for g in shapes_of(m0, mf.path.name):
            shapes.update(g)
        fz = m0.get("frozen_param_shapes")
        if isinstance(fz, dict):
            for k, v in fz.items():
                shapes.setdefault(str(k), as_shape(v, k))
    order = [n for n in shapes if n in params] + sorted(params - set(shapes))

    out: "OrderedDict[str, SourceTensor]" = OrderedDict()
    notes: list[str] = []
    module_obj = m0.get("module")
    module: dict[str, Any] = module_obj if isinstance(module_obj, dict) else {}
    buffer_names = [str(b) for b in (m0.get("buffer_names") or [])]
    for name, t in module.items():
        if name in buffer_names and isinstance(t, TensorRef):
            states = cast(StatesFile, mf)  # a module: m0 is its object
            out[name] = SourceTensor(name, tuple(t.shape), t.dtype, ref_ranges(states, t, name))
    missing = [n for n in shapes if n not in params]
    if missing:
        notes.append(f"{len(missing)} param(s) of param_shapes have no zero/<name>/fp32.pt (e.g. {missing[0]})")
    for name in order:
        f = StatesFile(zdir / name / "fp32.pt")
        obj = f.obj
        if isinstance(obj, dict) and isinstance(obj.get("param"), TensorRef):
            t = obj["param"]
        elif isinstance(obj, TensorRef):
            t = obj
        else:
            raise ValueError(f"zero/{name}/fp32.pt holds neither a tensor nor {{'param': tensor, ...}}")
        shape = tuple(t.shape)
        want = shapes.get(name)
        if want is not None and want != shape:
            if math.prod(want) != t.numel or not t.contiguous:
                raise ValueError(f"zero/{name}/fp32.pt holds {t.numel} elements, param_shapes says {want}")
            shape = want  # ZeRO-3 universal stores the param flat
        ranges = ref_ranges(f, t, name)
        out[name] = SourceTensor(name, shape, t.dtype, ranges)
    shared_obj = m0.get("shared_params")
    shared: dict[Any, Any] = shared_obj if isinstance(shared_obj, dict) else {}
    for alias, target in shared.items():
        alias, target = str(alias), str(target)
        if target in out and alias not in params:
            t = out[target]
            out[alias] = SourceTensor(alias, t.shape, t.dtype, t.ranges, tied_to=target)
    return Source("universal", folder, list(out.values()), train_dtype=config_train_dtype(m0), notes=notes)
