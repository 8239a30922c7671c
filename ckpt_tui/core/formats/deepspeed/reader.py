"""DeepSpeed checkpoints: tag folders (``global_stepN/``) and universal checkpoints.

Model-states and optim-states files are torch zips; we read their data.pkl through the
restricted unpickler (tensors become references, never data).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from ...dtypes import ITEMSIZE
from ...facts import DeepSpeedZeroFacts
from ...storage import Location, LocationLike, as_path
from ...types import TensorInfo, numel
from ..torch_save import torchfile
from ..unpickle import Stub, TensorRef, iter_tensors, name_part
from .moe import EXPERT_FILE_RE, EXPP_OPTIM_RE, data_before_expert, global_shapes, group_ep_sizes, num_experts, parts

MODEL_STATES_RE = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
OPTIM_STATES_RE = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
LAYER_RE = re.compile(r"^layer_\d+-model_\d+-model_states\.pt$|^layer_\d+-model_states\.pt$")
LAYER_INDEX_RE = re.compile(r"^layer_(\d+)-")
# what a tag's optimizer is, by what it saved (``optimizer_kind``): ZeRO-1/2/3 flat groups in *_optim_states.pt,
# BF16_Optimizer (ZeRO-1 + bf16 + fp32 grad accumulation: ZeRO-like partitions, no zero_stage), and without ZeRO
# (stage 0) the optimizer inside mp_rank_XX_model_states.pt: FP16_UnfusedOptimizer (bf16/fp16: fp32 masters in
# ``fp32_groups``) or the plain torch optimizer (fp32: the module weights are the masters)
OPTIMIZER_CLASS = {
    "bf16-optimizer": "BF16_Optimizer",
    "fp16-unfused": "FP16_UnfusedOptimizer",
    "torch": "torch optimizer (no DeepSpeed wrapper)",
}
UNIVERSAL_KEY = "universal_checkpoint_info"
# a universal checkpoint's per-parameter files (zero/<param>/<state>.pt), in the order ds_to_universal writes them
UNIVERSAL_STATES = ("fp32", "exp_avg", "exp_avg_sq", "step")
UNIVERSAL_STATE_ROLES = {
    "fp32.pt": "model",
    "exp_avg.pt": "optimizer",
    "exp_avg_sq.pt": "optimizer",
    "step.pt": "optimizer",
}


def is_tag_dir(names: Iterable[str]) -> bool:
    return any(MODEL_STATES_RE.match(n) or OPTIM_STATES_RE.match(n) for n in names)


def stage_value(x: Any) -> Optional[int]:
    if isinstance(x, Stub):
        x = x.value
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


@dataclass
class TagFacts:
    model_files: dict[tuple[int, int], str] = field(default_factory=dict)  # (dp, mp) -> name; dp=-1 if none
    optim_files: dict[tuple[int, int], str] = field(default_factory=dict)
    optim_prefix: str = ""
    layer_files: list[str] = field(default_factory=list)
    facts: DeepSpeedZeroFacts = field(
        default_factory=DeepSpeedZeroFacts
    )  # rank 0's states files: merged into the tag's facts
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    frozen_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    buffers: dict[str, TensorRef] = field(default_factory=dict)
    module_dtypes: set[str] = field(default_factory=set)
    frozen_recorded: bool = False  # the model states have frozen_param_shapes (ZeRO-1 saves none)
    frozen_dtypes: dict[str, str] = field(default_factory=dict)  # frozen param -> dtype of its fragment
    module_tensors: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # name -> (shape, dtype)
    # ZeRO stage 0: the optimizer inside the model states ("fp16-unfused" or "torch"), and its fp32 master
    # shapes in order (FP16_UnfusedOptimizer ``fp32_groups`` flattened)
    inline_optimizer: Optional[str] = None
    master_shapes: list[tuple[int, ...]] = field(default_factory=list)
    module_param_names: list[str] = field(default_factory=list)  # module params in named_parameters() order
    # pipeline: each layer file's tensors (read from their data.pkl), named as PipelineModule names them
    layer_tensors: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    layers: list[tuple[str, list[tuple[str, tuple[int, ...]]]]] = field(default_factory=list)  # in layer order
    # mixture of experts: each expert's model-states file ((moe layer, expert, mp) -> name; layer -1: the old
    # expert_E_mp_rank_XX name), ZeRO stage 0's expp_rank_K_mp_rank_XX_optim_states.pt, the model states'
    # num_experts (one count per MoE layer), rank 0's param_shapes per group (local expert names), the
    # partition count of each optimizer group and its saved param group (moe, name)
    expert_files: dict[tuple[int, int, int], str] = field(default_factory=dict)
    expp_files: list[str] = field(default_factory=list)
    num_experts: Optional[list[int]] = None
    data_before_expert: bool = False
    group_shapes: list["OrderedDict[str, tuple[int, ...]]"] = field(default_factory=list)
    partition_counts: list[int] = field(default_factory=list)
    param_groups: list[Any] = field(default_factory=list)


def classify_files(names: Iterable[str]) -> TagFacts:
    tf = TagFacts()
    for n in names:
        m = MODEL_STATES_RE.match(n)
        if m:
            dp = int(m.group(1)) if m.group(1) is not None else -1
            tf.model_files[(dp, int(m.group(2)))] = n
            continue
        m = OPTIM_STATES_RE.match(n)
        if m:
            tf.optim_prefix = m.group(1) or ""
            tf.optim_files[(int(m.group(2)), int(m.group(3)))] = n
            continue
        if LAYER_RE.match(n):
            tf.layer_files.append(n)
            continue
        m = EXPERT_FILE_RE.match(n)
        if m:
            layer = int(m.group(1)) if m.group(1) is not None else -1
            tf.expert_files[(layer, int(m.group(2)), int(m.group(3)))] = n
        elif EXPP_OPTIM_RE.match(n):
            tf.expp_files.append(n)
    return tf


def module_param_names(module: dict[str, Any], buffer_names: Optional[Iterable[object]]) -> list[str]:
    """The parameters of a model-states ``module`` in ``named_parameters()`` order: its state_dict order
    without the buffers and without a second name of one storage view (tied weights)."""
    buffers = {name_part(b) for b in buffer_names or ()}
    seen: set[tuple[object, ...]] = set()
    out = []
    for name, t in iter_tensors(module):
        if name in buffers:
            continue
        view = (t.storage.key, t.offset, tuple(t.shape), t.stride) if t.storage is not None else (id(t),)
        if view in seen:
            continue
        seen.add(view)
        out.append(name)
    return out


def layer_name(file_name: str, key: str) -> str:
    """A pipeline layer file's tensor as DeepSpeed's PipelineModule names it: ``<layer index>.<key>``
    (``layer_03-model_states.pt``'s ``weight`` is ``3.weight``, as in the PipelineModule's state_dict)."""
    m = LAYER_INDEX_RE.match(file_name)
    return f"{int(m.group(1))}.{key}" if m else key


def inline_optimizer(obj: Any) -> Optional[str]:
    """ZeRO stage 0's optimizer saved inside the model states: "fp16-unfused" (FP16_UnfusedOptimizer, fp32
    masters in ``fp32_groups``), "torch" (a plain torch optimizer's state_dict), or None."""
    opt = obj.get("optimizer") if isinstance(obj, dict) else None
    if not isinstance(opt, dict):
        return None
    if isinstance(opt.get("fp32_groups"), (list, tuple)) and isinstance(opt.get("optimizer_state_dict"), dict):
        return "fp16-unfused"
    if isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), (list, tuple)):
        return "torch"
    return None


def _int_fact(v: object) -> Optional[int]:
    """``v`` where it is an int as DeepSpeed writes one (not a bool, at most 63 bits), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() <= 63 else None


def analyze_model_states(obj: Any, tf: TagFacts) -> None:
    """Facts from the top-level dict of a model-states file."""
    f = tf.facts
    if not isinstance(obj, dict):
        return
    kind = inline_optimizer(obj)
    if kind is not None:
        tf.inline_optimizer = kind
        f["optimizer_kind"] = kind
        if kind == "fp16-unfused":
            f["master_dtype"] = "float32"
            tf.master_shapes = [
                tuple(t.shape)
                for g in obj["optimizer"]["fp32_groups"]
                if isinstance(g, (list, tuple))
                for t in g
                if isinstance(t, TensorRef)
            ]
    dims = obj.get("checkpoint_parallel_dimensions")
    if isinstance(dims, dict) and isinstance(dims.get("pp_degree"), int) and dims["pp_degree"] > 1:
        f["pipeline"] = True
        f["pipeline_stages"] = dims["pp_degree"]
    f["universal_checkpoint_info"] = UNIVERSAL_KEY in obj
    # facts of the type DeepSpeed writes, or none: a value of another type (a graph of shared dicts, a huge
    # string) is not carried into the report
    if (count := _int_fact(obj.get("dp_world_size"))) is not None:
        f["dp_world_size"] = count
    if (count := _int_fact(obj.get("mp_world_size"))) is not None:
        f["mp_world_size"] = count
    if (count := _int_fact(obj.get("global_steps"))) is not None:
        f["global_step"] = count
    version = obj.get("ds_version")
    if isinstance(version, str) and len(version) <= 64:
        f["ds_version"] = version
    if (count := _int_fact(obj.get("global_samples"))) is not None:
        f["global_samples"] = count
    cfg = obj.get("ds_config")
    if isinstance(cfg, dict):
        zo = cfg.get("zero_optimization") or {}
        if isinstance(zo, dict) and zo.get("stage") is not None:
            f.setdefault("zero_stage", stage_value(zo.get("stage")))
        for name in ("bf16", "fp16"):
            sect = cfg.get(name)
            if isinstance(sect, dict) and sect.get("enabled") in (True, "true"):
                f["train_dtype"] = "bfloat16" if name == "bf16" else "float16"
        if not f.get("pipeline"):
            f["pipeline"] = (
                bool(cfg.get("pipeline"))
                if isinstance(cfg.get("pipeline"), dict) and cfg["pipeline"].get("stages", 1) not in (1, None)
                else False
            )
    shapes = obj.get("param_shapes")
    if isinstance(shapes, list):
        for group in shapes:
            if isinstance(group, dict):
                g: "OrderedDict[str, tuple[int, ...]]" = OrderedDict()
                for n, s in group.items():
                    tf.param_shapes[name_part(n)] = g[name_part(n)] = tuple(int(x) for x in s)
                tf.group_shapes.append(g)
    frozen = obj.get("frozen_param_shapes")
    if isinstance(frozen, dict):
        tf.frozen_recorded = True
        for n, s in frozen.items():
            tf.frozen_shapes[name_part(n)] = tuple(int(x) for x in s)
    frags = obj.get("frozen_param_fragments")
    if isinstance(frags, dict):
        for n, t in frags.items():
            if isinstance(t, TensorRef):
                tf.frozen_dtypes[name_part(n)] = t.dtype
    shared = obj.get("shared_params")
    if isinstance(shared, dict) and shared:
        f["shared_params"] = {name_part(k): name_part(v) for k, v in shared.items()}
    module = obj.get("module")
    names = obj.get("buffer_names")
    buffer_names = {b for b in names if isinstance(b, str)} if isinstance(names, (list, tuple)) else set()
    if isinstance(module, dict):
        for name, t in iter_tensors(module):
            tf.module_dtypes.add(t.dtype)
            tf.module_tensors[name] = (tuple(t.shape), t.dtype)
            if name in buffer_names:
                tf.buffers[name] = t
        f["module_tensors"] = sum(1 for _ in iter_tensors(module))
        seen_storage: set[object] = set()
        n_params = 0
        for n, t in iter_tensors(module):
            key = (t.storage.key, t.offset, t.shape) if t.storage is not None else id(t)
            if n in buffer_names or key in seen_storage:
                continue  # tied weights share one storage: count them once
            seen_storage.add(key)
            n_params += t.numel
        f["module_params"] = n_params
        tf.module_param_names = module_param_names(module, buffer_names)
    experts = num_experts(obj)
    if experts is not None:
        f["moe"] = True
        f["num_experts"] = experts
        tf.num_experts = experts
        tf.data_before_expert = data_before_expert(obj)


def analyze_optim_states(obj: Any, tf: TagFacts) -> None:
    f = tf.facts
    if not isinstance(obj, dict):
        return
    osd = obj.get("optimizer_state_dict")
    if not isinstance(osd, dict):
        return
    st = stage_value(osd.get("zero_stage"))
    if st is not None:
        f["zero_stage"] = st
    pc = osd.get("partition_count")
    if isinstance(pc, (list, tuple)) and pc:
        counts = [c for c in pc if isinstance(c, int) and not isinstance(c, bool)]
        if len(counts) == len(pc):
            tf.partition_counts = counts
        pc = max(counts) if counts else None  # a MoE group is partitioned over fewer ranks: its experts' only
    if isinstance(pc, int):
        f["partition_count"] = pc
    base = osd.get("base_optimizer_state")
    pgs = base.get("param_groups") if isinstance(base, dict) else None
    if isinstance(pgs, (list, tuple)):
        tf.param_groups = list(pgs)
    if "single_partition_of_fp32_groups" in osd or "fp32_flat_groups" in osd:
        f["master_dtype"] = "float32"
        if st is None and "param_slice_mappings" in osd:  # BF16_Optimizer: ZeRO-1 partitions, no zero_stage
            f["optimizer_kind"] = "bf16-optimizer"
    else:
        # DeepSpeed's BF16_Optimizer (bf16 without ZeRO-1/2/3 flat groups) stores fp32 groups differently
        flat = any(isinstance(k, str) and "fp32_groups_flat" in k for k in osd)
        f["optimizer_kind"] = "bf16-optimizer" if flat else "unknown"
    if isinstance(osd.get("ds_version"), str) and "ds_version" not in f:
        f["ds_version"] = name_part(osd.get("ds_version"))


def globalize_experts(tf: TagFacts, world: Optional[int]) -> None:
    """A mixture of experts' trainable params with every expert-parallel rank's experts, global ids
    (``tf.param_shapes`` holds rank 0's, as its model states record them), and its expert-parallel size; left
    as recorded where the optimizer states do not say how the groups were partitioned."""
    if tf.num_experts is None or not world or len(tf.partition_counts) != len(tf.group_shapes):
        return
    try:
        eps = group_ep_sizes(tf.param_groups, tf.partition_counts, world)
        named = global_shapes(parts(tf.group_shapes, eps, world, tf.data_before_expert), len(tf.group_shapes))
    except ValueError:
        return  # export says why
    tf.param_shapes = {n: s for g in named for n, s in g.items()}
    tf.facts["expert_parallel_size"] = max(eps)


@dataclass
class OptimStates:
    """One ``*_optim_states.pt`` as its data.pkl describes it (no tensor data is read): what the tensor
    table lists, and what an optimizer export reads -- each TensorRef names its storage, and
    ``torchfile.storage_offsets(path)`` where that storage's bytes are in the file."""

    path: Location
    dp_rank: Optional[int]  # from the file name
    mp_rank: Optional[int]
    zero_stage: Optional[int]
    partition_count: Optional[int]  # ways each param group is partitioned (the dp world size)
    # this rank's fp32 master partition of each param group: ZeRO-1/2 ``single_partition_of_fp32_groups``,
    # ZeRO-3 ``fp32_flat_groups``; named as in ``tensors``
    fp32_partitions: list[tuple[str, TensorRef]]
    # the wrapped torch optimizer's state (``exp_avg``, ``exp_avg_sq``, ``step`` of each group): ZeRO-1/2
    # ``base_optimizer_state``, ZeRO-3 ``optimizer_state_dict``; named as in ``tensors``
    optimizer_state: list[tuple[str, TensorRef]]
    # param name -> (start, numel) in this rank's fp32 partition of its group (ZeRO-1/2 ``param_slice_mappings``)
    slices: dict[str, tuple[int, int]]
    tensors: list[tuple[str, TensorRef]]  # every tensor of the file, named as torch.load's object nests it
    unsafe: set[str] = field(default_factory=set)  # globals outside the allowlist its pickle names (never called)

    def tensor_infos(self) -> list[TensorInfo]:
        return [TensorInfo(n, t.shape, t.dtype, t.nbytes) for n, t in self.tensors]


def optim_states(obj: Any, path: LocationLike) -> OptimStates:
    """:class:`OptimStates` of an optim-states file's unpickled object (``torchfile.read(path).obj``)."""
    where = as_path(path)
    m = OPTIM_STATES_RE.match(where.name)
    st = OptimStates(
        where,
        int(m.group(2)) if m else None,
        int(m.group(3)) if m else None,
        None,
        None,
        [],
        [],
        {},
        list(iter_tensors(obj)),
    )
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if not isinstance(osd, dict):
        return st
    st.zero_stage = stage_value(osd.get("zero_stage"))
    pc = osd.get("partition_count")
    pc = pc[0] if isinstance(pc, (list, tuple)) and pc else pc
    st.partition_count = pc if isinstance(pc, int) else None
    pre = "optimizer_state_dict."
    for key in ("single_partition_of_fp32_groups", "fp32_flat_groups"):
        st.fp32_partitions += [(f"{pre}{key}.{n}", t) for n, t in iter_tensors(osd.get(key))]
    for key in ("base_optimizer_state", "optimizer_state_dict"):
        st.optimizer_state += [(f"{pre}{key}.{n}", t) for n, t in iter_tensors(osd.get(key))]
    maps = osd.get("param_slice_mappings")
    for group in maps if isinstance(maps, list) else []:
        for name, addr in group.items() if isinstance(group, dict) else ():
            a = getattr(addr, "__dict__", None) or {}
            args: Any = a.get("_args") or ()  # unpickled: whatever the file holds
            start, n = a.get("start", args[1] if len(args) > 1 else None), a.get("numel", args[0] if args else None)
            if isinstance(start, int) and isinstance(n, int):
                st.slices[name_part(name)] = (start, n)
    return st


def read_optim_states(path: LocationLike) -> OptimStates:
    """Read an optim-states file's structure (zip directory and data.pkl, through the restricted
    unpickler). Raises FormatError (truncated, corrupt) and OSError."""
    tf = torchfile.read(as_path(path))
    st = optim_states(tf.obj, path)
    st.unsafe = set(tf.unsafe)
    return st


HALF = ("bfloat16", "float16")


def _frozen(name: str, shape: tuple[int, ...], stored: Optional[str]) -> TensorInfo:
    """A frozen parameter as an export writes it with --dtype keep (export.plan.out_dtype): a floating one
    in fp32 -- it has no fp32 master, so bf16/fp16 values are upcast, and say so; anything else as stored."""
    if stored is None or stored in HALF or stored in ("float32", "float64"):  # export.plan.FLOATS
        return TensorInfo(name, shape, "float32", numel(shape) * 4, upcast_from=stored if stored in HALF else None)
    return TensorInfo(name, shape, stored, numel(shape) * ITEMSIZE.get(stored, 1))


def stage0_masters(tf: TagFacts) -> Optional[list[str]]:
    """ZeRO stage 0 + FP16_UnfusedOptimizer: the module parameter each fp32 master belongs to, in the order of
    ``fp32_groups`` (DeepSpeed records no names: matched by count, order and shape), or None where they differ."""
    names = tf.module_param_names
    shapes = [tf.module_tensors[n][0] for n in names]
    return names if shapes == tf.master_shapes else None


def tensors(tf: TagFacts) -> list[TensorInfo]:
    """What an export of this tag writes with --dtype keep (deepspeed.zero): trainable params as
    their fp32 masters; frozen params, which have none, from their fragments (ZeRO-1 records none: from the
    model-states module, as the export takes them) upcast to fp32; buffers as stored. ZeRO stage 0: the
    FP16_UnfusedOptimizer masters (else the module weights); pipeline: the layer files' tensors."""
    if tf.layer_files:
        return [TensorInfo(n, s, d, numel(s) * ITEMSIZE.get(d, 1)) for n, (s, d) in tf.layer_tensors.items()]
    if tf.inline_optimizer is not None or (not tf.optim_files and not tf.param_shapes):
        masters = stage0_masters(tf) if tf.inline_optimizer == "fp16-unfused" else None
        out = []
        for n, (s, d) in tf.module_tensors.items():
            if masters is not None and n in masters:
                out.append(TensorInfo(n, s, "float32", numel(s) * 4))
            elif n not in tf.module_param_names and n not in tf.buffers:
                continue  # a tied alias: written once
            else:
                out.append(TensorInfo(n, s, d, numel(s) * ITEMSIZE.get(d, 1)))
        return out
    out = [TensorInfo(n, s, "float32", numel(s) * 4) for n, s in tf.param_shapes.items()]
    out += [_frozen(n, s, tf.frozen_dtypes.get(n)) for n, s in tf.frozen_shapes.items() if n not in tf.param_shapes]
    stage = tf.facts.get("zero_stage")
    if not tf.frozen_recorded and stage in (1, 2):
        skip = set(tf.param_shapes) | set(tf.buffers) | set(tf.facts.get("shared_params") or {})
        out += [_frozen(n, s, dt) for n, (s, dt) in tf.module_tensors.items() if n not in skip]
    for n, t in tf.buffers.items():
        out.append(TensorInfo(n, t.shape, t.dtype, t.nbytes))
    return out


def inline_param_shapes(obj: Any) -> Optional[list[tuple[int, ...]]]:
    """The shapes of the parameters a stage-0 optimizer inside the model states holds, in its order
    (FP16_UnfusedOptimizer: its fp32 masters; a torch optimizer: its exp_avg), or None where unreadable."""
    kind = inline_optimizer(obj)
    if kind is None:
        return None
    opt = obj["optimizer"]
    if kind == "fp16-unfused":
        return [
            tuple(t.shape)
            for g in opt["fp32_groups"]
            if isinstance(g, (list, tuple))
            for t in g
            if isinstance(t, TensorRef)
        ]
    state, out = opt["state"], []
    for g in opt["param_groups"]:
        for i in (g.get("params") or []) if isinstance(g, dict) else []:
            s = state.get(i, state.get(name_part(i)))
            t = s.get("exp_avg") if isinstance(s, dict) else None
            if not isinstance(t, TensorRef):
                return None
            out.append(tuple(t.shape))
    return out


def match_pipeline(
    layers: list[tuple[str, list[tuple[str, tuple[int, ...]]]]], stages: list[list[tuple[int, ...]]]
) -> Optional[list[list[str]]]:
    """Which layer tensors each pipeline stage's optimizer holds: the layers (``[(file, [(name, shape)])]`` in
    index order) cut into consecutive runs whose shapes are each stage's optimizer shapes, in order. DeepSpeed
    records no partition of layers to stages; None where no such cut exists (a layer file missing, buffers)."""
    out, li = [], 0
    for shapes in stages:
        names: list[str] = []
        got: list[tuple[int, ...]] = []
        while len(got) < len(shapes) and li < len(layers):
            names += [n for n, _ in layers[li][1]]
            got += [s for _, s in layers[li][1]]
            li += 1
        if got != shapes:
            return None
        out.append(names)
    if any(ts for _, ts in layers[li:]):
        return None
    return out
