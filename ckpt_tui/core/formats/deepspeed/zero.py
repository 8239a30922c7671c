"""DeepSpeed ZeRO-1/2/3 tag folders and universal checkpoints as byte ranges.

One thing, in full (hence its length): DeepSpeed's partitioned layouts -> the byte ranges of each
full tensor, with both reconstruction rules, their padding, frozen parameters and tied aliases.

:func:`deepspeed_source` describes exactly the tensors DeepSpeed's ``zero_to_fp32``
(``get_fp32_state_dict_from_zero_checkpoint``) reconstructs, with the same names and order, as
byte ranges of the fp32 master partitions in the optimizer-states files. Nothing is loaded with
torch: the files' data.pkl are read through the restricted unpickler and the zip directory gives
where each storage's bytes are (entries are stored uncompressed).

Reconstruction rules (``deepspeed/utils/zero_to_fp32.py``):

* ZeRO-1/2: per param group, the ranks' ``single_partition_of_fp32_groups[g]`` concatenated in
  rank order; params of ``param_shapes[g]`` are consecutive slices of it (plus
  ``param_alignment_paddings`` where recorded). Frozen params are full tensors in the model
  states' ``frozen_param_fragments``.
* ZeRO-3: every param occupies ``ceil(numel / world)`` elements at the same offset of each rank's
  ``fp32_flat_groups`` (the groups of a rank concatenated); the full param is the ranks' slices
  concatenated and cut to ``numel`` (the padding is never read). Frozen params: per-rank
  fragments in each ``zero_pp_rank_*_model_states.pt``, concatenated and cut the same way.
* Order: buffers, frozen params, trainable params, then tied aliases (``shared_params``).
* Mixture of experts (:mod:`.moe`): an expert group is one flat vector per expert-parallel rank, over its
  expert-data-parallel ranks; its params are rank 0's ``param_shapes`` renamed to each one's global expert ids.

ZeRO-1 records no ``frozen_param_*``, so ``zero_to_fp32`` silently drops frozen params; we take
them from the model-states ``module`` weights (training dtype) instead.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...dtypes import ITEMSIZE
from ...export.sources import ByteRange, Source, SourceTensor, read_ranges
from ...storage import Location, LocationLike, as_path
from ..unpickle import TensorRef
from .moe import (
    EXPERT_PARAM_RE,
    Part,
    check_experts,
    data_before_expert,
    global_shapes,
    group_ep_sizes,
    num_experts,
    parts,
    slice_names,
)
from .states import (
    StatesFile,
    as_shape,
    config_train_dtype,
    cut_ranges,
    is_bf16_optimizer,
    master_groups,
    merge_ranges,
    open_tag,
    optimizer_state,
    ref_ranges,
    shapes_of,
)
from .zero3 import zero3_params
from .zero12 import zero2_params

ZERO1_FROZEN_NOTE = "from module weights (ZeRO-1 saves no frozen_param_*)"


def expert_parts(
    m0: dict[str, Any], m0_name: str, osd0: dict[str, Any], world: int, optim: dict[int, StatesFile]
) -> tuple[Optional[list[Part]], list["OrderedDict[str, tuple[int, ...]]"]]:
    """A ZeRO-1/2 tag's flat vectors where it is a mixture of experts (else None) and each param group's
    params with global names (else rank 0's ``param_shapes``). Raises ValueError where the layout does not
    fit what DeepSpeed writes (:mod:`.moe`)."""
    shapes = shapes_of(m0, m0_name)
    experts = num_experts(m0)
    if experts is None:
        return None, shapes
    pc = osd0.get("partition_count")
    counts = [int(c) for c in pc] if isinstance(pc, (list, tuple)) else [world] * len(shapes)
    base = osd0.get("base_optimizer_state")
    eps = group_ep_sizes(base.get("param_groups") if isinstance(base, dict) else None, counts, world)
    ps = parts(shapes, eps, world, data_before_expert(m0))
    named = global_shapes(ps, len(shapes))
    check_experts((n for g in named for n in g), experts)
    for part in ps:  # each rank's slice mappings name only the params of its own flat group (local names)
        for r in part.ranks:
            stray = slice_names(optimizer_state(optim[r]), part.group) - set(shapes[part.group])
            if stray:
                raise ValueError(
                    f"{optim[r].path.name} places {sorted(stray)[:2]} in param group {part.group}, which rank 0's "
                    "param_shapes do not list: not the expert-parallel layout read here"
                )
    fz = m0.get("frozen_param_shapes")
    frozen_experts = [str(n) for n in fz if EXPERT_PARAM_RE.match(str(n))] if isinstance(fz, dict) else []
    if frozen_experts and max(eps) > 1:
        raise ValueError(
            f"frozen expert parameters ({frozen_experts[0]}, ...) under expert parallelism are not supported: "
            "the model states record rank 0's experts only"
        )
    return ps, named


@dataclass
class ZeroTag:
    """An opened ZeRO-1/2/3 tag folder (structure only, from the pickles): what the optimizer export
    (:mod:`.optim`) reads through the same partition mapping as the fp32 masters."""

    path: Location
    stage: int
    world: int
    _optim: dict[int, StatesFile]
    _models: list[StatesFile]
    _osd0: dict[str, Any]
    _parts: Optional[list[Part]] = None  # a mixture of experts' flat vectors (:func:`expert_parts`)
    _shapes: Optional[list["OrderedDict[str, tuple[int, ...]]"]] = None

    @property
    def model_states(self) -> dict[str, Any]:
        """Rank 0's model-states object (``param_shapes``, ``buffer_names``, ``module``, ``ds_config`` ...)."""
        states: dict[str, Any] = self._models[0].obj  # check_model_states held it to a dict
        return states

    @property
    def shapes(self) -> list["OrderedDict[str, tuple[int, ...]]"]:
        """Each param group's params (a mixture of experts: every expert, global names)."""
        if self._shapes is not None:
            return self._shapes
        return shapes_of(self.model_states, self._models[0].path.name)

    @property
    def train_dtype(self) -> Optional[str]:
        return config_train_dtype(self.model_states)

    @property
    def experts(self) -> bool:
        """A mixture of experts (its expert groups joined from every expert-parallel rank)."""
        return self._parts is not None

    def optimizer_state_dict(self, rank: int) -> dict[str, Any]:
        """Rank ``rank``'s ``optimizer_state_dict`` (TensorRefs for tensors)."""
        return optimizer_state(self._optim[rank])

    def file_name(self, rank: int) -> str:
        return self._optim[rank].path.name

    def fp32_groups(self, rank: int) -> list[Any]:
        return master_groups(self._optim[rank], self.stage)

    def tensor_bytes(self, rank: int, ref: TensorRef, what: str) -> bytes:
        """The bytes of a (small) tensor of rank ``rank``'s optimizer-states file, e.g. a 0-d step."""
        try:
            return read_ranges(ref_ranges(self._optim[rank], ref, what))
        except OSError:
            raise ValueError(f"{what}: {self.file_name(rank)} ends early") from None

    def params(
        self, groups_of: Optional[Callable[[int], list[Any]]] = None, *, suffix: str = "", what: str = "fp32"
    ) -> "OrderedDict[str, SourceTensor]":
        """Every trainable param (``name + suffix``) as byte ranges of the flat tensors ``groups_of(rank)``
        gives for each group (default: the fp32 master partitions; or a state laid out like them)."""
        out: "OrderedDict[str, SourceTensor]" = OrderedDict()
        ranks = {id(f): r for r, f in self._optim.items()}
        of: Optional[Callable[[StatesFile], list[Any]]] = None
        if groups_of is not None:
            rank_groups = groups_of

            def file_groups(f: StatesFile) -> list[Any]:
                return rank_groups(ranks[id(f)])

            of = file_groups
        if self.stage <= 2:
            zero2_params(
                out,
                self.shapes,
                self._optim,
                self.world,
                self._osd0,
                groups_of=of,
                suffix=suffix,
                what=what,
                parts=self._parts,
            )
        else:
            zero3_params(out, self.shapes, self._optim, self.world, groups_of=of, suffix=suffix, what=what)
        return out


def open_zero_tag(tag_dir: LocationLike, bf16_optimizer: bool = False) -> ZeroTag:
    """Open ZeRO tag ``tag_dir`` (refusing what no source reads: ValueError with the reason;
    ``bf16_optimizer``: also a BF16_Optimizer tag, as ZeRO-1)."""
    stage, world, optim, models, osd0 = open_tag(as_path(tag_dir), bf16_optimizer)
    ps, named = expert_parts(models[0].obj, models[0].path.name, osd0, world, optim) if stage <= 2 else (None, None)
    return ZeroTag(as_path(tag_dir), stage, world, optim, models, osd0, ps, named)


def deepspeed_source(tag_dir: LocationLike, *, exclude_frozen: bool = False, bf16_optimizer: bool = False) -> Source:
    """Where each tensor of the fp32 model ``zero_to_fp32`` would rebuild from ``tag_dir`` lives
    (``bf16_optimizer``: also a BF16_Optimizer tag, which zero_to_fp32 rejects, by the same ZeRO-1 rule)."""
    tag = as_path(tag_dir)
    stage, world, optim, models, osd0 = open_tag(tag, bf16_optimizer)
    m0f = models[0]
    m0 = m0f.obj
    ps, shapes = (
        expert_parts(m0, m0f.path.name, osd0, world, optim) if stage <= 2 else (None, shapes_of(m0, m0f.path.name))
    )
    module = m0.get("module") if isinstance(m0.get("module"), dict) else {}
    buffer_names = [str(b) for b in (m0.get("buffer_names") or [])]
    shared = m0.get("shared_params") if isinstance(m0.get("shared_params"), dict) else {}
    frozen_shapes = m0.get("frozen_param_shapes")
    notes: list[str] = []

    out: "OrderedDict[str, SourceTensor]" = OrderedDict()

    # buffers (zero_to_fp32 upcasts floating buffers to fp32; we keep them as stored)
    for name, t in module.items():
        if name in buffer_names and isinstance(t, TensorRef):
            out[name] = SourceTensor(name, tuple(t.shape), t.dtype, ref_ranges(m0f, t, name))

    # frozen params
    if not exclude_frozen:
        if isinstance(frozen_shapes, dict) and frozen_shapes:
            if stage <= 2:
                frags = m0.get("frozen_param_fragments") or {}
                for name, s in frozen_shapes.items():
                    shape = as_shape(s, name)
                    t = frags.get(name)
                    if not isinstance(t, TensorRef):
                        raise ValueError(f"frozen param {name} has no frozen_param_fragments entry")
                    if math.prod(t.shape) != math.prod(shape):
                        raise ValueError(f"frozen param {name}: fragment {t.shape} does not match shape {shape}")
                    out[name] = SourceTensor(name, shape, t.dtype, ref_ranges(m0f, t, name), frozen=True)
            else:
                for name, s in frozen_shapes.items():
                    shape = as_shape(s, name)
                    numel = math.prod(shape)
                    ranges: list[ByteRange] = []
                    dtype: Optional[str] = None
                    have = 0
                    for mf in models:
                        t = (mf.obj.get("frozen_param_fragments") or {}).get(name)
                        if not isinstance(t, TensorRef):
                            raise ValueError(f"frozen param {name}: no fragment in {mf.path.name}")
                        if dtype is None:
                            dtype = t.dtype
                        elif t.dtype != dtype:
                            raise ValueError(f"frozen param {name}: fragments of different dtypes")
                        take = min(t.numel, numel - have)
                        if take <= 0:
                            break
                        rs = ref_ranges(mf, t, name)
                        ranges += cut_ranges(rs, take * ITEMSIZE[dtype])
                        have += take
                    if have != numel:
                        raise ValueError(f"frozen param {name}: fragments hold {have} of {numel} elements")
                    out[name] = SourceTensor(name, shape, dtype or "float32", merge_ranges(ranges), frozen=True)
        elif frozen_shapes is None and stage <= 2:
            # ZeRO-1 saves no frozen_param_*: the frozen weights are only in the module (training dtype)
            trainable = {n for g in shapes for n in g}
            n_frozen = 0
            for name, t in module.items():
                if name in trainable or name in buffer_names or name in shared or not isinstance(t, TensorRef):
                    continue
                out[name] = SourceTensor(
                    name, tuple(t.shape), t.dtype, ref_ranges(m0f, t, name), frozen=True, note=ZERO1_FROZEN_NOTE
                )
                n_frozen += 1
            if n_frozen:
                notes.append(
                    f"{n_frozen} frozen param(s) taken from the model-states module weights "
                    f"(ZeRO-{stage} records no frozen_param_shapes; zero_to_fp32 drops them)"
                )

    left_out: list[str] = []  # exclude_frozen: said to the user (and to the load snippet: strict=False)
    if exclude_frozen and isinstance(frozen_shapes, dict):
        left_out = [str(n) for n in frozen_shapes]
    elif exclude_frozen and frozen_shapes is None and stage <= 2:
        trainable = {n for g in shapes for n in g}
        left_out = [
            n
            for n, t in module.items()
            if n not in trainable and n not in buffer_names and n not in shared and isinstance(t, TensorRef)
        ]

    # trainable params
    if stage <= 2:
        zero2_params(out, shapes, optim, world, osd0, parts=ps)
    else:
        zero3_params(out, shapes, optim, world)

    # tied weights
    for alias, target in shared.items():
        alias, target = str(alias), str(target)
        if target in out:
            t = out[target]
            out[alias] = SourceTensor(alias, t.shape, t.dtype, t.ranges, tied_to=target, frozen=t.frozen, note=t.note)
        elif target in left_out:
            left_out.append(alias)

    if ps is not None:
        notes.append(
            f"mixture of experts: {sum(1 for _ in _experts(shapes))} expert parameters of every expert-parallel "
            "rank joined from the ranks' optimizer partitions, named with global expert ids (as DeepSpeed's "
            "layer_*_expert_* files name them)"
        )
    if is_bf16_optimizer(osd0):
        notes.append(
            "BF16_Optimizer (ZeRO-1 + bf16 + fp32 gradient accumulation): the fp32 masters are rebuilt from "
            "its ZeRO-1 style partitions in the optim-states files (zero_to_fp32 rejects this checkpoint: "
            "its optimizer states record no zero_stage)"
        )
    return Source(
        "deepspeed", tag, list(out.values()), train_dtype=config_train_dtype(m0), notes=notes, excluded=left_out
    )


def _experts(shapes: list["OrderedDict[str, tuple[int, ...]]"]) -> list[str]:
    return [n for g in shapes for n in g if EXPERT_PARAM_RE.match(n)]
