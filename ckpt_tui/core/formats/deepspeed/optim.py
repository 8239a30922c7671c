"""The optimizer state of a DeepSpeed ZeRO-1/2/3 tag folder as byte ranges (``--component optimizer``).

Adam's ``exp_avg`` and ``exp_avg_sq`` sit in each rank's ``*_optim_states.pt`` as flat tensors with
exactly the layout of that rank's fp32 master partition: ZeRO-1/2 ``base_optimizer_state['state'][g]``
beside ``single_partition_of_fp32_groups[g]``, ZeRO-3 ``optimizer_state_dict['state'][i]`` beside
``fp32_flat_groups[i]`` (this is how DeepSpeed's ``ds_to_universal`` pairs them). So the mapping that
rebuilds the masters (:mod:`.zero`, after ``zero_to_fp32``) cuts them per parameter too.

Each trainable parameter ``p`` gives ``p.exp_avg``, ``p.exp_avg_sq`` and, where the run kept fp32
masters apart from its bf16/fp16 module weights, ``p.master``. Frozen parameters have no optimizer
state and are only listed. The step and each param group's hyper-parameters (with the names of its
parameters) go to ``optimizer_config.json``: :func:`optimizer_config`.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from functools import partial
from typing import Any, Callable, Optional, Union

from ...export.sources import Source, SourceTensor, read_ranges
from ...storage import LocationLike, as_path, listdir
from ..unpickle import Stub, TensorRef, name_part
from .pipeline import pipeline_layers
from .reader import LAYER_RE, OPTIM_STATES_RE, OPTIMIZER_CLASS, inline_optimizer, match_pipeline, module_param_names
from .source import tag_source
from .stage0 import open_stage0, stage0_masters
from .states import StatesFile, config_train_dtype, is_bf16_optimizer, ref_ranges
from .zero import ZeroTag, open_zero_tag

STATES = ("exp_avg", "exp_avg_sq")
CONFIG_FILE = "optimizer_config.json"
KIND = "deepspeed-optimizer"
_SCALAR = {"float32": "<f", "float64": "<d", "int64": "<q", "int32": "<i"}
Number = Union[int, float]  # a saved step


def _state(tag: ZeroTag, rank: int) -> dict[str, Any]:
    """The wrapped torch optimizer's state_dict of a rank (``{"state": {i: {...}}, "param_groups": [...]}``)."""
    osd = tag.optimizer_state_dict(rank)
    key = "base_optimizer_state" if tag.stage <= 2 else "optimizer_state_dict"
    sd = osd.get(key)
    if isinstance(sd, (list, tuple)):  # older DeepSpeed (ZeRO-1/2): a list of per-group states, no param_groups
        sd = {"state": dict(enumerate(sd)), "param_groups": []}
    if not isinstance(sd, dict) or not isinstance(sd.get("state"), dict):
        raise ValueError(f"{tag.file_name(rank)}: no {key} with a 'state' (saved without optimizer state?)")
    return sd


def _state_groups(tag: ZeroTag, rank: int, key: str) -> list[Any]:
    """A rank's flat ``key`` tensor (exp_avg, exp_avg_sq) of each group, in the order of its fp32 groups."""
    n = len(tag.fp32_groups(rank))
    state = _state(tag, rank)["state"]
    out = []
    for i in range(n):
        s = state.get(i, state.get(str(i)))
        if not isinstance(s, dict) or not isinstance(s.get(key), TensorRef):
            found = sorted(s) if isinstance(s, dict) else "nothing"
            raise ValueError(
                f"{tag.file_name(rank)}: the optimizer state of group {i} has no {key} tensor (found {found}): "
                "only Adam-style optimizers (exp_avg, exp_avg_sq) are exported"
            )
        out.append(s[key])
    return out


def step_value(v: Any, what: str, tensor_bytes: Callable[[TensorRef], bytes]) -> Number:
    """A Python number from a saved step value: a number, or a 0-d tensor whose few bytes
    ``tensor_bytes(ref)`` reads (from wherever its file keeps them). Raises ValueError."""
    if isinstance(v, Stub):
        v = v.value
    if isinstance(v, bool) or v is None:
        raise ValueError(f"{what}: not a number ({v!r})")
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, TensorRef):
        if v.numel != 1 or v.dtype not in _SCALAR:
            raise ValueError(f"{what}: a {v.dtype} tensor of shape {tuple(v.shape)}, not a scalar step")
        (x,) = struct.unpack(_SCALAR[v.dtype], tensor_bytes(v))
        number: Number = int(x) if isinstance(x, float) and x.is_integer() else x
        return number
    raise ValueError(f"{what}: unreadable step {type(v).__name__}")


def _scalar(tag: ZeroTag, rank: int, v: Any, what: str) -> Number:
    """A Python number from a step value of ``rank``'s optimizer states file."""
    return step_value(v, what, lambda ref: tag.tensor_bytes(rank, ref, what))


def jsonable(v: Any, _left: Optional[list[int]] = None) -> Any:
    """``v`` (hyper-parameters from a pickle) as JSON values; at most 100,000 values in all (a graph of shared
    lists would otherwise be copied once per path): ValueError beyond."""
    left = _left if _left is not None else [100_000]
    left[0] -= 1
    if left[0] < 0:
        raise ValueError("the optimizer's param groups hold more than 100,000 values: not written")
    if isinstance(v, Stub):
        v = v.value
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x, left) for x in v]
    if isinstance(v, dict):
        return {name_part(k): jsonable(x, left) for k, x in v.items()}
    if isinstance(v, TensorRef):
        return f"<tensor {v.dtype} {list(v.shape)}>"
    return repr(v)


def deepspeed_optimizer_source(tag_dir: LocationLike) -> tuple[Source, dict[str, Any], list[str]]:
    """The optimizer state of ZeRO tag ``tag_dir``: the source (``p.exp_avg``, ``p.exp_avg_sq``,
    ``p.master`` per trainable param ``p``), the content of ``optimizer_config.json`` (names not yet
    prefix-stripped: :func:`strip_config`), and every name the model export of this tag sees (its
    prefix decision must be the same). Raises ValueError with the reason."""
    tag_path = as_path(tag_dir)
    if tag_path.is_dir():
        names = listdir(tag_path)
        if any(LAYER_RE.match(n) for n in names) or (
            not any(OPTIM_STATES_RE.match(n) for n in names) and "mp_rank_00_model_states.pt" in names
        ):
            return inline_optimizer_source(tag_path)
    tag = open_zero_tag(tag_path, bf16_optimizer=True)
    stage, world = tag.stage, tag.world
    m0 = tag.model_states
    shapes = tag.shapes
    train_dtype = tag.train_dtype
    masters = train_dtype in ("bfloat16", "float16")

    per_state: dict[str, "OrderedDict[str, SourceTensor]"] = {}
    for key in STATES:
        per_state[key] = tag.params(partial(_state_groups, tag, key=key), suffix=f".{key}", what=key)
    if masters:
        per_state["master"] = tag.params(suffix=".master")
    out: list[SourceTensor] = []
    trainable = [n for g in shapes for n in g]
    for name in trainable:
        for key, d in per_state.items():
            out.append(d[f"{name}.{key}"])

    # names the model export sees: buffers, frozen params, trainable params, tied aliases
    module_obj = m0.get("module")
    module: dict[str, Any] = module_obj if isinstance(module_obj, dict) else {}
    buffer_names = [str(b) for b in (m0.get("buffer_names") or [])]
    shared_obj = m0.get("shared_params")
    shared = {str(k): str(v) for k, v in shared_obj.items()} if isinstance(shared_obj, dict) else {}
    fz = m0.get("frozen_param_shapes")
    if isinstance(fz, dict):
        frozen = [str(n) for n in fz]
    elif stage <= 2:  # ZeRO-1 records none: what the module holds that is neither trainable, a buffer nor tied
        frozen = [
            n
            for n, t in module.items()
            if n not in set(trainable) and n not in buffer_names and n not in shared and isinstance(t, TensorRef)
        ]
    else:
        frozen = []
    model_names = [n for n in buffer_names if n in module] + frozen + trainable + list(shared)

    # step and param groups (rank 0's; every rank's steps must agree)
    sd0 = _state(tag, 0)
    n_groups = len(tag.fp32_groups(0))
    if n_groups != len(shapes):
        raise ValueError(f"{n_groups} optimizer groups but {len(shapes)} groups in param_shapes")
    steps: list[Optional[Any]] = []
    for i in range(n_groups):
        seen: set[Number] = set()
        for r in range(world):
            st = _state(tag, r)["state"]
            s = st.get(i, st.get(str(i))) or {}
            if "step" in s:
                seen.add(_scalar(tag, r, s["step"], f"{tag.file_name(r)} group {i} step"))
        if len(seen) > 1:
            raise ValueError(f"the ranks disagree on the step of optimizer group {i}: {sorted(seen)}")
        steps.append(seen.pop() if seen else None)
    groups: list[dict[str, Any]] = []
    pgs_obj = sd0.get("param_groups")
    pgs: Union[list[Any], tuple[Any, ...]] = pgs_obj if isinstance(pgs_obj, (list, tuple)) else []
    for gi, pg in enumerate(pgs):
        if not isinstance(pg, dict):
            continue
        idx = [i for i in (pg.get("params") or []) if isinstance(i, int) and 0 <= i < n_groups]
        if not idx and len(pgs) == n_groups:
            idx = [gi]
        hyper = {str(k): jsonable(v) for k, v in pg.items() if k != "params"}
        group_steps = {steps[i] for i in idx}
        groups.append(
            hyper
            | {
                "step": group_steps.pop() if len(group_steps) == 1 else None,
                "params": [n for i in idx for n in shapes[i]],
            }
        )
    if not groups:  # no param_groups saved: at least which params share a group, and its step
        groups = [{"step": steps[i], "params": list(shapes[i])} for i in range(n_groups)]
    distinct = {s for s in steps if s is not None}
    cfg_obj = m0.get("ds_config")
    cfg_ds: dict[str, Any] = cfg_obj if isinstance(cfg_obj, dict) else {}
    config: dict[str, Any] = {
        "source": "deepspeed",
        "zero_stage": stage,
        "dp_world_size": world,
        "optimizer": jsonable(cfg_ds.get("optimizer")) if cfg_ds.get("optimizer") is not None else None,
        "step": distinct.pop() if len(distinct) == 1 else None,
        "states": list(per_state),
        "param_groups": groups,
        "frozen_params": frozen,
        "tied_params": shared,
    }
    if is_bf16_optimizer(tag.optimizer_state_dict(0)):
        config["optimizer_class"] = "BF16_Optimizer"
    notes = []
    if masters:
        notes.append(
            f"the run trained in {'bf16' if train_dtype == 'bfloat16' else 'fp16'}: each parameter's fp32 "
            "master is written as <name>.master, beside <name>.exp_avg and <name>.exp_avg_sq"
        )
    else:
        notes.append(
            "the run kept no fp32 masters apart from its module weights (fp32 training): no <name>.master "
            "(the weights are --component model)"
        )
    if frozen:
        notes.append(f"{len(frozen)} frozen param(s) have no optimizer state (listed in {CONFIG_FILE})")
    if tag.experts:
        notes.append(
            "mixture of experts: the state of every expert, joined from each expert-parallel rank's partitions, "
            "named with global expert ids (as DeepSpeed's layer_*_expert_* files name them)"
        )
    src = Source(KIND, tag_path, out, notes=notes)
    return src, config, model_names


def strip_config(config: dict[str, Any], prefix: Optional[str]) -> dict[str, Any]:
    """``config`` with ``prefix`` removed from every parameter name (the model export's prefix decision)."""
    if not prefix:
        return config

    def s(n: str) -> str:
        return n[len(prefix) :] if n.startswith(prefix) else n

    out = dict(config)
    out["param_groups"] = [g | {"params": [s(n) for n in g["params"]]} for g in config["param_groups"]]
    out["frozen_params"] = [s(n) for n in config["frozen_params"]]
    out["tied_params"] = {s(k): s(v) for k, v in config["tied_params"].items()}
    return out


# ---------------------------------------------------------------------------------------------
# ZeRO stage 0 and pipeline: the optimizer inside mp_rank_XX_model_states.pt


def _file_scalar(f: StatesFile, v: Any, what: str) -> Number:
    """A step value of a model-states file: a number, or a 0-d tensor whose few bytes are read here."""
    if isinstance(v, Stub):
        v = v.value
    if isinstance(v, TensorRef):
        if v.numel != 1 or v.dtype not in _SCALAR:
            raise ValueError(f"{what}: a {v.dtype} tensor of shape {tuple(v.shape)}, not a scalar step")
        try:
            (x,) = struct.unpack(_SCALAR[v.dtype], read_ranges(ref_ranges(f, v, what)))
        except OSError:
            raise ValueError(f"{what}: {f.path.name} ends early") from None
        number: Number = int(x) if isinstance(x, float) and x.is_integer() else x
        return number
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    raise ValueError(f"{what}: unreadable step {v!r}")


def _inline_state(
    f: StatesFile, names: list[str], shapes: dict[str, tuple[int, ...]]
) -> tuple[list[SourceTensor], list[dict[str, Any]], set[Number], str]:
    """The per-parameter tensors (``<name>.exp_avg``, ``.exp_avg_sq`` and, FP16_UnfusedOptimizer, ``.master``)
    and param groups of the optimizer inside model-states file ``f``, its i-th parameter being ``names[i]``
    (a torch optimizer numbers its parameters across its groups in order)."""
    obj = f.obj
    kind = inline_optimizer(obj)
    if kind is None:
        raise ValueError(
            f"{f.path.name} holds no optimizer state (saved with load_optimizer_states off, or without an optimizer)"
        )
    opt = obj["optimizer"]
    sd = opt["optimizer_state_dict"] if kind == "fp16-unfused" else opt
    masters = [t for g in opt["fp32_groups"] for t in g] if kind == "fp16-unfused" else None
    state, pgs = sd["state"], [g for g in sd["param_groups"] if isinstance(g, dict)]
    order = [i for g in pgs for i in (g.get("params") or [])]
    if len(order) != len(names):
        raise ValueError(
            f"{f.path.name}: its optimizer holds {len(order)} parameters but {len(names)} are known by "
            "name; DeepSpeed records no names here, so which state is whose is unknown"
        )
    pos = {i: k for k, i in enumerate(order)}
    out: list[SourceTensor] = []
    steps: dict[int, Number] = {}
    for k, (i, name) in enumerate(zip(order, names)):
        s = state.get(i, state.get(str(i)))
        if not isinstance(s, dict):
            raise ValueError(f"{f.path.name}: no optimizer state for parameter {i} ({name}): saved before any step?")
        for key in STATES:
            t = s.get(key)
            if not isinstance(t, TensorRef):
                raise ValueError(
                    f"{f.path.name}: the optimizer state of {name} has no {key} tensor (found "
                    f"{sorted(s)}): only Adam-style optimizers (exp_avg, exp_avg_sq) are exported"
                )
            if tuple(t.shape) != shapes[name]:
                raise ValueError(
                    f"{f.path.name}: {key} of parameter {i} has shape {tuple(t.shape)} but {name} is "
                    f"{shapes[name]}: the optimizer's order is not the module's"
                )
            out.append(SourceTensor(f"{name}.{key}", tuple(t.shape), t.dtype, ref_ranges(f, t, f"{name}.{key}")))
        if masters is not None:
            m = masters[k]
            out.append(SourceTensor(f"{name}.master", tuple(m.shape), m.dtype, ref_ranges(f, m, f"{name}.master")))
        if "step" in s:
            steps[i] = _file_scalar(f, s["step"], f"{f.path.name} {name} step")
    groups: list[dict[str, Any]] = []
    for pg in pgs:
        idx = [i for i in (pg.get("params") or []) if i in pos]
        gs = {steps.get(i) for i in idx}
        hyper = {str(k): jsonable(v) for k, v in pg.items() if k != "params"}
        groups.append(hyper | {"step": gs.pop() if len(gs) == 1 else None, "params": [names[pos[i]] for i in idx]})
    return out, groups, set(steps.values()), kind


def inline_optimizer_source(tag_dir: LocationLike) -> tuple[Source, dict[str, Any], list[str]]:
    """The optimizer state of a ZeRO stage 0 tag (FP16_UnfusedOptimizer, or the plain torch optimizer, inside
    ``mp_rank_00_model_states.pt``) or of a pipeline tag (one such optimizer per stage, ``mp_rank_XX``), per
    parameter as :func:`deepspeed_optimizer_source` gives it. The optimizer's parameters are numbered, not
    named: stage 0 pairs them with the module's parameters (count, order and shape must agree); a pipeline
    with the layers' tensors (each stage a consecutive run of layers: :func:`match_pipeline`)."""
    tag_path = as_path(tag_dir)
    names = sorted(listdir(tag_path))
    m0: Any  # a model-states object (a pipeline stage's: as unpickled)
    if any(LAYER_RE.match(n) for n in names):
        layers = pipeline_layers(tag_path)
        from ..unpickle import iter_tensors
        from .reader import inline_param_shapes, layer_name

        layer_list = [(fn, [(layer_name(fn, k), tuple(t.shape)) for k, t in iter_tensors(f.obj)]) for fn, f in layers]
        shapes = {n: s for _, ts in layer_list for n, s in ts}
        ms = sorted(n for n in names if n.startswith("mp_rank_") and n.endswith("_model_states.pt"))
        files = [StatesFile(tag_path / n) for n in ms]
        read = [inline_param_shapes(f.obj) for f in files]
        stages = [s for s in read if s is not None]
        if len(stages) != len(read):
            raise ValueError(
                "a pipeline stage's mp_rank_XX_model_states.pt holds no optimizer state ckpt-tui reads "
                "(ZeRO-1 or BF16_Optimizer pipelines keep it in *_optim_states.pt: not supported)"
            )
        per_stage = match_pipeline(layer_list, stages)
        if per_stage is None:
            raise ValueError(
                "the stages' optimizers do not hold consecutive runs of the layer files' tensors (a layer "
                "file missing, or buffers in them): which state is whose is unknown"
            )
        parts = [_inline_state(f, stage_names, shapes) for f, stage_names in zip(files, per_stage)]
        m0 = files[0].obj
    else:
        mf, m0, kind = open_stage0(tag_path)
        module = m0["module"]
        shapes = {n: tuple(t.shape) for n, t in module.items() if isinstance(t, TensorRef)}
        pnames = (
            [n for n, _ in stage0_masters(m0, mf.path.name)]
            if kind == "fp16-unfused"
            else module_param_names(module, m0.get("buffer_names"))
        )
        files = [mf]
        parts = [_inline_state(mf, pnames, shapes)]
    out = [t for p in parts for t in p[0]]
    groups = [g for p in parts for g in p[1]]
    steps: set[Number] = set().union(*(p[2] for p in parts))
    kind = parts[0][3]
    train = config_train_dtype(m0) if isinstance(m0, dict) else None
    cfg_ds = m0.get("ds_config") if isinstance(m0.get("ds_config"), dict) else {}
    pipeline = any(LAYER_RE.match(n) for n in names)
    states = list(STATES) + (["master"] if kind == "fp16-unfused" else [])
    config: dict[str, Any] = {
        "source": "deepspeed",
        "zero_stage": 0,
        "dp_world_size": m0.get("dp_world_size"),
        "optimizer": jsonable(cfg_ds.get("optimizer")) if cfg_ds.get("optimizer") is not None else None,
        "step": steps.pop() if len(steps) == 1 else None,
        "states": states,
        "param_groups": groups,
        "frozen_params": [],
        "tied_params": {},
        "optimizer_class": OPTIMIZER_CLASS[kind],
    }
    if pipeline:
        config["pipeline_stages"] = len(files)
    notes = [
        (
            "pipeline parallel: each stage's optimizer (mp_rank_XX_model_states.pt) paired with its run of layer "
            "files; names as the model export's (<layer index>.<parameter>)"
        )
        if pipeline
        else (
            "ZeRO stage 0: the optimizer inside mp_rank_00_model_states.pt, its numbered parameters paired with the "
            "module's by order and shape"
        )
    ]
    if kind == "fp16-unfused":
        notes.append(
            f"the run trained in {'bf16' if train == 'bfloat16' else 'fp16'}: each parameter's fp32 master "
            "(FP16_UnfusedOptimizer's fp32_groups) is written as <name>.master, beside <name>.exp_avg and "
            "<name>.exp_avg_sq"
        )
    else:
        notes.append(
            "the run kept no fp32 masters apart from its module weights (fp32 training): no <name>.master "
            "(the weights are --component model)"
        )
    model_names = [t.name for t in tag_source(tag_path).tensors]
    return Source(KIND, tag_path, out, notes=notes), config, model_names
