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

ZeRO-1 records no ``frozen_param_*``, so ``zero_to_fp32`` silently drops frozen params; we take
them from the model-states ``module`` weights (training dtype) instead.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ...dtypes import ITEMSIZE, short_dtype
from ...export.sources import ByteRange, Source, SourceTensor, read_ranges
from ...storage import as_path, listdir
from .. import FormatError
from ..torch_save import torchfile
from ..unpickle import TensorRef, iter_tensors
from .reader import (
    LAYER_INDEX_RE,
    LAYER_RE,
    MODEL_STATES_RE,
    OPTIM_STATES_RE,
    inline_optimizer,
    layer_name,
    module_param_names,
    stage_value,
)

MOE_RE = re.compile(r"(^|_)expp_rank_\d+|(^|_)expert_\d+_")
MAX_RANGES_PER_TENSOR = 1 << 20
ZERO1_FROZEN_NOTE = "from module weights (ZeRO-1 saves no frozen_param_*)"


# ---------------------------------------------------------------------------------------------
# byte-range helpers


class StatesFile:
    """One torch zip: its structure (data.pkl) and where each storage's bytes are."""

    def __init__(self, path: Path):
        self.path = as_path(path)
        try:
            tf = torchfile.read(self.path)
        except FormatError as e:
            raise ValueError(f"{self.path.name}: {e}") from None
        if not tf.is_zip:
            raise ValueError(f"{self.path.name}: legacy (non-zip) torch file; byte ranges need the zip format")
        if tf.unsafe and tf.obj is None:
            raise ValueError(f"{self.path.name}: unreadable without running code it names: {sorted(tf.unsafe)[:3]}")
        self.obj = tf.obj
        self._offsets: Optional[dict[str, tuple[int, int]]] = None

    @property
    def offsets(self) -> dict[str, tuple[int, int]]:
        if self._offsets is None:
            try:
                self._offsets = torchfile.storage_offsets(self.path)
            except FormatError as e:
                raise ValueError(f"{self.path.name}: {e}") from None
        return self._offsets

    def element_start(self, ref: TensorRef) -> tuple[int, int]:
        """(absolute byte offset of the storage, storage size in bytes)."""
        if ref.storage is None:
            raise ValueError(f"{self.path.name}: a tensor without a storage (tensor subclass?)")
        try:
            return self.offsets[ref.storage.key]
        except KeyError:
            raise ValueError(f"{self.path.name}: storage data/{ref.storage.key} missing from the archive") from None


def _merge(ranges: list[ByteRange]) -> tuple[ByteRange, ...]:
    out: list[ByteRange] = []
    for r in ranges:
        if r.length == 0:
            continue
        if out and out[-1].path == r.path and out[-1].offset + out[-1].length == r.offset:
            out[-1] = ByteRange(r.path, out[-1].offset, out[-1].length + r.length)
        else:
            out.append(r)
    return tuple(out)


def ref_ranges(f: StatesFile, ref: TensorRef, what: str) -> tuple[ByteRange, ...]:
    """Byte ranges of a (possibly strided) tensor, in row-major order."""
    item = ITEMSIZE.get(ref.dtype)
    if item is None:
        raise ValueError(f"{what}: unsupported dtype {ref.dtype}")
    base, size = f.element_start(ref)
    shape = tuple(ref.shape)
    numel = math.prod(shape)
    if numel == 0:
        return ()
    stride = ref.stride
    if stride is None or ref.contiguous:
        if stride is None:
            stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        last = ref.offset + numel - 1
        if ref.offset < 0 or (last + 1) * item > size:
            raise ValueError(f"{what}: elements [{ref.offset}, {last + 1}) run past its storage in {f.path.name}")
        return (ByteRange(str(f.path), base + ref.offset * item, numel * item),)
    # strided: split into the trailing block of dims that is contiguous, iterate the rest
    if any(s < 0 for s in stride):
        raise ValueError(f"{what}: negative strides")
    max_el = ref.offset + sum((d - 1) * s for d, s in zip(shape, stride))
    if (max_el + 1) * item > size:
        raise ValueError(f"{what}: elements run past its storage in {f.path.name}")
    k = len(shape)
    inner = 1
    while k > 0 and (shape[k - 1] == 1 or stride[k - 1] == inner):
        inner *= shape[k - 1]
        k -= 1
    outer = math.prod(shape[:k])
    if outer > MAX_RANGES_PER_TENSOR:
        raise ValueError(f"{what}: a strided layout that needs {outer} byte ranges")
    out = []
    for idx in itertools.product(*(range(d) for d in shape[:k])):
        el = ref.offset + sum(i * s for i, s in zip(idx, stride[:k]))
        out.append(ByteRange(str(f.path), base + el * item, inner * item))
    return _merge(out)


_File, _ref_ranges = StatesFile, ref_ranges  # their earlier names (tests and other branches use them)


class _Flat:
    """A virtual 1-D fp32 vector: several flat tensors (of one or more files) back to back."""

    def __init__(self):
        self.parts: list[tuple[str, int, int]] = []  # (path, byte offset of element 0, numel)
        self.starts: list[int] = []
        self.numel = 0

    def add(self, f: StatesFile, ref: TensorRef, what: str) -> None:
        if not isinstance(ref, TensorRef):
            raise ValueError(f"{what}: not a tensor")
        if ref.dtype != "float32":
            raise ValueError(f"{what}: expected a float32 partition, found {ref.dtype}")
        if len(ref.shape) != 1 or not ref.contiguous:
            raise ValueError(f"{what}: expected a flat contiguous tensor, found shape {ref.shape}")
        (r,) = ref_ranges(f, ref, what) or (ByteRange(str(f.path), 0, 0),)
        self.starts.append(self.numel)
        self.parts.append((r.path, r.offset, ref.shape[0]))
        self.numel += ref.shape[0]

    def slice(self, start: int, n: int) -> list[ByteRange]:
        if start < 0 or start + n > self.numel:
            raise ValueError(f"elements [{start}, {start + n}) outside a flat group of {self.numel}")
        out = []
        i = bisect.bisect_right(self.starts, start) - 1
        while n > 0:
            path, off, cnt = self.parts[i]
            local = start - self.starts[i]
            take = min(n, cnt - local)
            if take > 0:
                out.append(ByteRange(path, off + local * 4, take * 4))
                start += take
                n -= take
            i += 1
        return out


# ---------------------------------------------------------------------------------------------
# tag folder


def _shape(s: Any, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: unreadable shape {s!r}") from None


def config_train_dtype(model: dict) -> Optional[str]:
    cfg = model.get("ds_config")
    if isinstance(cfg, dict):
        for key, name in (("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("fp16", "float16")):
            sect = cfg.get(key)
            if isinstance(sect, dict) and sect.get("enabled") in (True, "true"):
                return name
    return None


def _check_model_states(model: Any, name: str) -> dict:
    if not isinstance(model, dict) or "buffer_names" not in model or "param_shapes" not in model:
        raise ValueError(f"{name} is not a DeepSpeed model-states file (no buffer_names/param_shapes)")
    mp = model.get("mp_world_size")
    if isinstance(mp, int) and mp > 1:
        raise ValueError(
            f"model parallelism (mp_world_size={mp}) is not supported: "
            "zero_to_fp32 reconstructs a single model-parallel rank only"
        )
    dims = model.get("checkpoint_parallel_dimensions")
    if isinstance(dims, dict):
        for k in ("pp_degree", "tp_degree"):
            v = dims.get(k)
            if isinstance(v, int) and v > 1:
                raise ValueError(
                    f"{'pipeline' if k == 'pp_degree' else 'tensor'} parallelism ({k}={v}) is not supported"
                )
    if model.get("num_experts"):
        raise ValueError("MoE checkpoints (expert parameters) are not supported")
    return model


def _param_shapes(model: dict, name: str) -> list["OrderedDict[str, tuple[int, ...]]"]:
    ps = model.get("param_shapes")
    if isinstance(ps, dict):  # very old DeepSpeed: one group
        ps = [ps]
    if not isinstance(ps, list):
        raise ValueError(f"{name}: param_shapes is not a list of groups")
    return [OrderedDict((str(k), _shape(v, f"{name}: {k}")) for k, v in g.items()) for g in ps]


def _osd(f: StatesFile) -> dict:
    obj = f.obj
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if not isinstance(osd, dict):
        raise ValueError(f"{f.path.name} has no optimizer_state_dict")
    return osd


def _tag_names(tag_dir: Path) -> list[str]:
    """The file names of a ZeRO tag folder, refusing layouts no source here reads (pipeline, MoE)."""
    if not tag_dir.is_dir():
        raise ValueError(f"{tag_dir} is not a folder")
    names = sorted(listdir(tag_dir))
    if any(LAYER_RE.match(n) for n in names):
        raise ValueError("pipeline-parallel checkpoints (layer_*-model_states.pt files) are not supported")
    if any(MOE_RE.search(n) for n in names):
        raise ValueError("MoE checkpoints (expert_*/expp_rank_* files) are not supported")
    return names


def is_bf16_optimizer(osd: dict) -> bool:
    """An ``optimizer_state_dict`` DeepSpeed's BF16_Optimizer saved: ZeRO-1 style fp32 partitions and
    ``param_slice_mappings``, but no ``zero_stage`` (which is why zero_to_fp32 rejects it)."""
    return (
        "zero_stage" not in osd
        and isinstance(osd.get("single_partition_of_fp32_groups"), (list, tuple))
        and "param_slice_mappings" in osd
    )


def _open_tag(
    tag_dir: Path, bf16_optimizer: bool = False
) -> tuple[int, int, dict[int, StatesFile], list[StatesFile], dict]:
    """A ZeRO tag's stage, world size, optimizer-states files by rank, model-states files (one for
    ZeRO-1/2, one per rank for ZeRO-3) and rank 0's optimizer_state_dict; refuses what no source reads
    (``bf16_optimizer``: a BF16_Optimizer tag is read as ZeRO-1, whose layout it has)."""
    names = _tag_names(tag_dir)
    model_files: dict[tuple[int, int], str] = {}
    optim_files: dict[tuple[int, int], str] = {}
    for n in names:
        m = MODEL_STATES_RE.match(n)
        if m:
            model_files[(int(m.group(1)) if m.group(1) is not None else -1, int(m.group(2)))] = n
        m = OPTIM_STATES_RE.match(n)
        if m:
            optim_files[(int(m.group(2)), int(m.group(3)))] = n
    if any(mp != 0 for _, mp in list(model_files) + list(optim_files)):
        raise ValueError("model-parallel checkpoints (mp_rank > 0 files) are not supported")
    if not optim_files:
        raise ValueError(
            f"no *_optim_states.pt in {tag_dir}: the fp32 master weights live there (saved without optimizer states?)"
        )

    optim = {dp: StatesFile(tag_dir / n) for (dp, _), n in sorted(optim_files.items())}
    osd0 = _osd(optim[min(optim)])
    if "zero_stage" not in osd0:
        if bf16_optimizer and is_bf16_optimizer(osd0):
            stage = 1  # BF16_Optimizer partitions like ZeRO-1: the same reconstruction, no per-param padding
        elif "single_partition_of_fp32_groups" in osd0 or "fp32_groups_flat" in osd0:
            raise ValueError(
                "a DeepSpeed BF16_Optimizer checkpoint (ZeRO-1 + bf16 + fp32 gradient accumulation): "
                "zero_to_fp32 and ds_to_universal reject it (no zero_stage in the optimizer states); "
                "`ckpt-tui export` reads it"
            )
        else:
            raise ValueError(f"{optim[min(optim)].path.name} is not a ZeRO checkpoint (no zero_stage)")
    else:
        stage = stage_value(osd0.get("zero_stage"))
    if stage not in (1, 2, 3):
        raise ValueError(f"unsupported ZeRO stage {osd0.get('zero_stage')!r}")
    world = osd0.get("partition_count")
    if isinstance(world, (list, tuple)):
        if len(set(world)) > 1:
            raise ValueError(f"param groups with different partition counts {list(world)} (MoE?) are not supported")
        world = max(world)
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"unreadable partition_count {osd0.get('partition_count')!r}")
    if sorted(optim) != list(range(world)):
        raise ValueError(
            f"expected {world} *_optim_states.pt (ranks 0..{world - 1}) in {tag_dir}, found ranks "
            f"{sorted(optim)}: an overwritten checkpoint, or one rank did not save"
        )

    if stage <= 2:
        if (-1, 0) not in model_files:
            raise ValueError(f"no mp_rank_00_model_states.pt in {tag_dir}")
        models = [StatesFile(tag_dir / model_files[(-1, 0)])]
    else:
        missing = [r for r in range(world) if (r, 0) not in model_files]
        if missing:
            raise ValueError(
                f"ZeRO-3 needs zero_pp_rank_<r>_mp_rank_00_model_states.pt for every rank; missing ranks {missing}"
            )
        models = [StatesFile(tag_dir / model_files[(r, 0)]) for r in range(world)]
    for mf in models:
        _check_model_states(mf.obj, mf.path.name)
    return stage, world, optim, models, osd0


@dataclass
class ZeroTag:
    """An opened ZeRO-1/2/3 tag folder (structure only, from the pickles): what the optimizer export
    (:mod:`.deepspeed_optim`) reads through the same partition mapping as the fp32 masters."""

    path: Path
    stage: int
    world: int
    _optim: dict[int, StatesFile]
    _models: list[StatesFile]
    _osd0: dict

    @property
    def model_states(self) -> dict:
        """Rank 0's model-states object (``param_shapes``, ``buffer_names``, ``module``, ``ds_config`` ...)."""
        return self._models[0].obj

    @property
    def shapes(self) -> list["OrderedDict[str, tuple[int, ...]]"]:
        return _param_shapes(self.model_states, self._models[0].path.name)

    @property
    def train_dtype(self) -> Optional[str]:
        return config_train_dtype(self.model_states)

    def optimizer_state_dict(self, rank: int) -> dict:
        """Rank ``rank``'s ``optimizer_state_dict`` (TensorRefs for tensors)."""
        return _osd(self._optim[rank])

    def file_name(self, rank: int) -> str:
        return self._optim[rank].path.name

    def fp32_groups(self, rank: int) -> list:
        return _fp32_groups(self._optim[rank], self.stage)

    def tensor_bytes(self, rank: int, ref: TensorRef, what: str) -> bytes:
        """The bytes of a (small) tensor of rank ``rank``'s optimizer-states file, e.g. a 0-d step."""
        try:
            return read_ranges(ref_ranges(self._optim[rank], ref, what))
        except OSError:
            raise ValueError(f"{what}: {self.file_name(rank)} ends early") from None

    def params(
        self, groups_of: Optional[Callable[[int], list]] = None, *, suffix: str = "", what: str = "fp32"
    ) -> "OrderedDict[str, SourceTensor]":
        """Every trainable param (``name + suffix``) as byte ranges of the flat tensors ``groups_of(rank)``
        gives for each group (default: the fp32 master partitions; or a state laid out like them)."""
        out: "OrderedDict[str, SourceTensor]" = OrderedDict()
        ranks = {id(f): r for r, f in self._optim.items()}
        of = None if groups_of is None else (lambda f: groups_of(ranks[id(f)]))
        if self.stage <= 2:
            _zero2_params(out, self.shapes, self._optim, self.world, self._osd0, groups_of=of, suffix=suffix, what=what)
        else:
            _zero3_params(out, self.shapes, self._optim, self.world, groups_of=of, suffix=suffix, what=what)
        return out


def open_zero_tag(tag_dir: Path, bf16_optimizer: bool = False) -> ZeroTag:
    """Open ZeRO tag ``tag_dir`` (refusing what no source reads: ValueError with the reason;
    ``bf16_optimizer``: also a BF16_Optimizer tag, as ZeRO-1)."""
    stage, world, optim, models, osd0 = _open_tag(as_path(tag_dir), bf16_optimizer)
    return ZeroTag(as_path(tag_dir), stage, world, optim, models, osd0)


def deepspeed_source(tag_dir: Path, *, exclude_frozen: bool = False, bf16_optimizer: bool = False) -> Source:
    """Where each tensor of the fp32 model ``zero_to_fp32`` would rebuild from ``tag_dir`` lives
    (``bf16_optimizer``: also a BF16_Optimizer tag, which zero_to_fp32 rejects, by the same ZeRO-1 rule)."""
    tag_dir = as_path(tag_dir)
    stage, world, optim, models, osd0 = _open_tag(tag_dir, bf16_optimizer)
    m0f = models[0]
    m0 = m0f.obj
    shapes = _param_shapes(m0, m0f.path.name)
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
                    shape = _shape(s, name)
                    t = frags.get(name)
                    if not isinstance(t, TensorRef):
                        raise ValueError(f"frozen param {name} has no frozen_param_fragments entry")
                    if math.prod(t.shape) != math.prod(shape):
                        raise ValueError(f"frozen param {name}: fragment {t.shape} does not match shape {shape}")
                    out[name] = SourceTensor(name, shape, t.dtype, ref_ranges(m0f, t, name), frozen=True)
            else:
                for name, s in frozen_shapes.items():
                    shape = _shape(s, name)
                    numel = math.prod(shape)
                    ranges, dtype, have = [], None, 0
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
                        ranges += _cut(rs, take * ITEMSIZE[dtype])
                        have += take
                    if have != numel:
                        raise ValueError(f"frozen param {name}: fragments hold {have} of {numel} elements")
                    out[name] = SourceTensor(name, shape, dtype or "float32", _merge(ranges), frozen=True)
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
        _zero2_params(out, shapes, optim, world, osd0)
    else:
        _zero3_params(out, shapes, optim, world)

    # tied weights
    for alias, target in shared.items():
        alias, target = str(alias), str(target)
        if target in out:
            t = out[target]
            out[alias] = SourceTensor(alias, t.shape, t.dtype, t.ranges, tied_to=target, frozen=t.frozen, note=t.note)
        elif target in left_out:
            left_out.append(alias)

    if is_bf16_optimizer(osd0):
        notes.append(
            "BF16_Optimizer (ZeRO-1 + bf16 + fp32 gradient accumulation): the fp32 masters are rebuilt from "
            "its ZeRO-1 style partitions in the optim-states files (zero_to_fp32 rejects this checkpoint: "
            "its optimizer states record no zero_stage)"
        )
    return Source(
        "deepspeed", tag_dir, list(out.values()), train_dtype=config_train_dtype(m0), notes=notes, excluded=left_out
    )


def _cut(ranges, nbytes: int) -> list[ByteRange]:
    out = []
    for r in ranges:
        if nbytes <= 0:
            break
        take = min(nbytes, r.length)
        out.append(ByteRange(r.path, r.offset, take))
        nbytes -= take
    return out


def _fp32_groups(f: StatesFile, stage: int) -> list:
    """A rank's fp32 master partition of each param group (ZeRO-3: of each sub-group)."""
    key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
    g = _osd(f).get(key)
    if not isinstance(g, (list, tuple)):
        raise ValueError(f"{f.path.name}: no {key}")
    return list(g)


def _zero2_params(
    out,
    shapes,
    optim: dict[int, StatesFile],
    world: int,
    osd0: dict,
    *,
    groups_of=None,
    suffix: str = "",
    what: str = "fp32",
) -> None:
    """ZeRO-1/2: each param's slice of its group's flat vector (the ranks' partitions back to back).
    ``groups_of(file)``: a rank's flat tensor of each group -- the fp32 masters by default, or an
    optimizer state laid out like them (exp_avg, exp_avg_sq); written as ``name + suffix``."""
    groups_of = groups_of or (lambda f: _fp32_groups(f, 2))
    groups_per_rank = [groups_of(optim[r]) for r in range(world)]
    n_groups = len(groups_per_rank[0])
    if any(len(g) != n_groups for g in groups_per_rank) or n_groups != len(shapes):
        raise ValueError(f"{n_groups} {what} param groups but {len(shapes)} groups in param_shapes")
    paddings = osd0.get("param_alignment_paddings")
    align_to = 2 * world
    for gi, group_shapes in enumerate(shapes):
        flat = _Flat()
        for r in range(world):
            flat.add(optim[r], groups_per_rank[r][gi], f"{optim[r].path.name} {what} group {gi}")
        pads = None
        if paddings is not None:
            pads = paddings[gi]
            if len(pads) != len(group_shapes):
                raise ValueError(
                    f"expected {len(group_shapes)} parameter alignment paddings for group {gi}, found {len(pads)}"
                )
        offset = 0
        for pi, (name, shape) in enumerate(group_shapes.items()):
            n = math.prod(shape)
            out[name + suffix] = SourceTensor(name + suffix, shape, "float32", _merge(flat.slice(offset, n)))
            offset += n
            if pads is not None:
                offset += int(pads[pi])
        # same sanity check as zero_to_fp32 (both rounded up to 2 * world)
        if align_to * math.ceil(offset / align_to) != align_to * math.ceil(flat.numel / align_to):
            raise ValueError(
                f"group {gi}: params consume {offset} of {flat.numel} {what} elements - "
                "param_shapes and the optimizer partitions do not match"
            )


def _zero3_params(
    out, shapes, optim: dict[int, StatesFile], world: int, *, groups_of=None, suffix: str = "", what: str = "fp32"
) -> None:
    """ZeRO-3: each param's ``ceil(numel / world)`` slice at the same offset of every rank's flat
    groups (concatenated); ``groups_of``/``suffix`` as for :func:`_zero2_params`."""
    groups_of = groups_of or (lambda f: _fp32_groups(f, 3))
    flats = []
    sizes0 = None
    for r in range(world):
        flat = _Flat()
        for gi, t in enumerate(groups_of(optim[r])):
            flat.add(optim[r], t, f"{optim[r].path.name} {what} group {gi}")
        sizes = [p[2] for p in flat.parts]
        if sizes0 is None:
            sizes0 = sizes
        elif sizes != sizes0:
            raise ValueError(f"ranks hold differently sized {what} flat groups ({sizes0} vs {sizes})")
        flats.append(flat)
    offset = 0
    merged = OrderedDict((k, v) for g in shapes for k, v in g.items())
    for name, shape in merged.items():
        n = math.prod(shape)
        pn = math.ceil(n / world)
        ranges, left = [], n
        for r in range(world):
            take = min(pn, left)
            if take > 0:
                ranges += flats[r].slice(offset, take)
                left -= take
        out[name + suffix] = SourceTensor(name + suffix, shape, "float32", _merge(ranges))
        offset += pn
    if offset != flats[0].numel:
        raise ValueError(
            f"params consume {offset * world} of {flats[0].numel * world} {what} elements - "
            "param_shapes and the optimizer partitions do not match"
        )


# ---------------------------------------------------------------------------------------------
# beyond ZeRO-1/2/3: stage 0 (the optimizer inside the model states), BF16_Optimizer, pipeline


def tag_source(tag_dir: Path, *, exclude_frozen: bool = False) -> Source:
    """The fp32 model of any DeepSpeed tag folder ckpt-tui reads: pipeline (:func:`pipeline_source`),
    ZeRO stage 0 (:func:`stage0_source`), BF16_Optimizer and ZeRO-1/2/3 (:func:`deepspeed_source`)."""
    tag_dir = as_path(tag_dir)
    if not tag_dir.is_dir():
        raise ValueError(f"{tag_dir} is not a folder")
    names = listdir(tag_dir)
    if any(LAYER_RE.match(n) for n in names):
        return pipeline_source(tag_dir)
    if not any(OPTIM_STATES_RE.match(n) for n in names) and "mp_rank_00_model_states.pt" in names:
        return stage0_source(tag_dir, exclude_frozen=exclude_frozen)
    return deepspeed_source(tag_dir, exclude_frozen=exclude_frozen, bf16_optimizer=True)


STAGE0_NOTE = (
    "ZeRO stage 0: no *_optim_states.pt; the optimizer is inside mp_rank_00_model_states.pt "
    "(zero_to_fp32 rejects this checkpoint: it has no optimizer-states files and no param_shapes)"
)


def open_stage0(tag_dir: Path) -> tuple[StatesFile, dict, Optional[str]]:
    """A stage-0 tag's model-states file, its object and the optimizer kind inside it."""
    names = _tag_names(tag_dir)
    ms = [n for n in names if MODEL_STATES_RE.match(n)]
    if ms != ["mp_rank_00_model_states.pt"]:
        raise ValueError(
            f"ZeRO stage 0 expects one mp_rank_00_model_states.pt in {tag_dir.name}, found {ms or 'none'}"
            " (tensor or pipeline parallelism?)"
        )
    mf = StatesFile(tag_dir / ms[0])
    m0 = _check_model_states(mf.obj, mf.path.name)
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


def stage0_masters(m0: dict, name: str) -> list[tuple[str, TensorRef]]:
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


def stage0_source(tag_dir: Path, *, exclude_frozen: bool = False) -> Source:
    """ZeRO stage 0 (no ZeRO): bf16/fp16 runs have FP16_UnfusedOptimizer's fp32 masters in the model states
    (``optimizer.fp32_groups``): each parameter is its master; fp32 runs keep the plain torch optimizer there and
    the module weights are the masters. Buffers as stored; tied names written once."""
    tag_dir = as_path(tag_dir)
    mf, m0, kind = open_stage0(tag_dir)
    module = m0["module"]
    buffer_names = {str(b) for b in (m0.get("buffer_names") or [])}
    masters = dict(stage0_masters(m0, mf.path.name)) if kind == "fp16-unfused" else {}
    params = set(module_param_names(module, buffer_names))
    out: list[SourceTensor] = []
    first_by_view: dict[tuple, str] = {}
    for name, t in iter_tensors(module):
        if t.storage is None:
            raise ValueError(f"{mf.path.name}: module weight {name} has no storage (a tensor subclass?)")
        view = (t.storage.key, t.offset, tuple(t.shape), t.stride)
        tied = first_by_view.setdefault(view, name)
        tied = tied if tied != name else None
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
    return Source("deepspeed", tag_dir, out, train_dtype=train, notes=notes)


def pipeline_layers(tag_dir: Path) -> list[tuple[str, StatesFile]]:
    names = sorted(listdir(tag_dir))
    layers = [n for n in names if LAYER_RE.match(n)]
    by_index: dict[int, list[str]] = {}
    for n in layers:
        by_index.setdefault(int(LAYER_INDEX_RE.match(n).group(1)), []).append(n)
    if any(len(v) > 1 for v in by_index.values()):
        raise ValueError(
            "pipeline layers split by tensor parallelism (layer_XX-model_YY-model_states.pt) are not "
            "supported: each layer must be one file"
        )
    if any(MOE_RE.search(n) for n in names):
        raise ValueError("MoE checkpoints (expert_*/expp_rank_* files) are not supported")
    return [(by_index[i][0], StatesFile(tag_dir / by_index[i][0])) for i in sorted(by_index)]


def pipeline_source(tag_dir: Path) -> Source:
    """A pipeline-parallel tag (``PipelineModule``): each ``layer_XX-model_states.pt`` holds one layer's
    ``state_dict``; merged, named as the PipelineModule names them (``<layer index>.<key>``, e.g.
    ``3.weight``). Written as stored: with fp32 training these are the masters; with bf16/fp16 the
    training-dtype weights (the masters stay in the stages' optimizer states; said in a note)."""
    tag_dir = as_path(tag_dir)
    out: list[SourceTensor] = []
    for fname, f in pipeline_layers(tag_dir):
        if not isinstance(f.obj, dict):
            raise ValueError(f"{fname} holds no state_dict")
        first_by_view: dict[tuple, str] = {}
        for key, t in iter_tensors(f.obj):
            name = layer_name(fname, key)
            if t.storage is None:
                raise ValueError(f"{fname}: {key} has no storage (a tensor subclass?)")
            view = (t.storage.key, t.offset, tuple(t.shape), t.stride)
            tied = first_by_view.setdefault(view, name)
            out.append(
                SourceTensor(
                    name, tuple(t.shape), t.dtype, ref_ranges(f, t, name), tied_to=tied if tied != name else None
                )
            )
    if not out:
        raise ValueError(f"no tensors in the layer files of {tag_dir.name}")
    train = None
    ms = tag_dir / "mp_rank_00_model_states.pt"
    if ms.is_file():
        m0 = StatesFile(ms).obj
        train = config_train_dtype(m0) if isinstance(m0, dict) else None
    notes = [
        "pipeline parallel: the layer_XX-model_states.pt files merged; names as DeepSpeed's PipelineModule "
        "names them, <layer index>.<parameter> (e.g. 0.weight)"
    ]
    if train in ("bfloat16", "float16"):
        notes.append(
            f"HALF PRECISION ({short_dtype(train)}): the layer files hold the training-dtype weights; the "
            "fp32 masters stay in the stages' optimizer states and are not written"
        )
    else:
        notes.append("fp32 training: the layer weights are the masters (no separate fp32 copy)")
    return Source("deepspeed", tag_dir, out, train_dtype=train, notes=notes)


# ---------------------------------------------------------------------------------------------
# module weights (--from-module-states)


MODULE_NOTE = "module weights (training dtype), not an fp32 master"
ZERO3_MODULE_REFUSAL = (
    "ZeRO-3 partitions the parameters themselves: its zero_pp_rank_*_model_states.pt files hold "
    "empty placeholders for the module weights, not whole weights, so there are no module "
    "weights to export; they can only be rebuilt from every rank's optimizer states"
)


def module_states_source(tag_dir: Path, *, exclude_frozen: bool = False) -> Source:
    """The ``module`` state dict of a ZeRO-1/2 tag's ``mp_rank_00_model_states.pt``, as byte ranges.

    These are the weights the model computed with, in the training dtype (bf16/fp16): what is left
    when the fp32 masters cannot be rebuilt (an optimizer-states file missing or corrupt). Nothing
    from the optimizer-states files is read. Tied aliases (one storage, or ``shared_params``) are
    written once; frozen params are flagged so ``--exclude-frozen`` leaves them out.
    """
    tag_dir = as_path(tag_dir)
    names = _tag_names(tag_dir)
    matches = [m for m in map(MODEL_STATES_RE.match, names) if m]
    if any(m.group(1) is not None for m in matches):
        raise ValueError(ZERO3_MODULE_REFUSAL)
    if any(int(m.group(2)) != 0 for m in matches):
        raise ValueError("model-parallel checkpoints (mp_rank > 0 files) are not supported")
    if "mp_rank_00_model_states.pt" not in names:
        raise ValueError(f"no mp_rank_00_model_states.pt in {tag_dir.name}: there are no module weights to export")
    mf = StatesFile(tag_dir / "mp_rank_00_model_states.pt")
    m0 = _check_model_states(mf.obj, mf.path.name)
    cfg = m0.get("ds_config")
    zo = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
    if isinstance(zo, dict) and stage_value(zo.get("stage")) == 3:
        raise ValueError(ZERO3_MODULE_REFUSAL)
    module = m0.get("module")
    if not isinstance(module, dict) or not module:
        raise ValueError(
            f"{mf.path.name} holds no module weights (saved with exclude_frozen_parameters, or "
            "by a model that keeps its weights elsewhere)"
        )
    buffer_names = {str(b) for b in (m0.get("buffer_names") or [])}
    if m0.get("param_shapes") is None:  # ZeRO stage 0 records none: every module parameter is trained
        trainable = {n: tuple(module[n].shape) for n in module_param_names(module, buffer_names)}
    else:
        trainable = {n: s for g in _param_shapes(m0, mf.path.name) for n, s in g.items()}
    shared = (
        {str(k): str(v) for k, v in (m0.get("shared_params") or {}).items()}
        if isinstance(m0.get("shared_params"), dict)
        else {}
    )
    fz = m0.get("frozen_param_shapes")
    recorded_frozen = {str(k) for k in fz} if isinstance(fz, dict) else None

    out: list[SourceTensor] = []
    first_by_view: dict[tuple, str] = {}
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
        tied = first_by_view.setdefault(view, name)
        tied = tied if tied != name else None
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
    return Source("deepspeed-module", tag_dir, out, notes=[note])


# ---------------------------------------------------------------------------------------------
# universal checkpoints


def universal_source(universal_dir: Path) -> Source:
    """A DeepSpeed universal checkpoint: ``zero/<param>/fp32.pt`` per param, buffers from model states."""
    universal_dir = as_path(universal_dir)
    zdir = universal_dir / "zero"
    if not zdir.is_dir():
        raise ValueError(f"{universal_dir} has no zero/ folder: not a DeepSpeed universal checkpoint")
    names = sorted(listdir(universal_dir))
    if any(LAYER_RE.match(n) for n in names):
        raise ValueError("pipeline-parallel universal checkpoints are not supported")
    model_names = sorted(
        (n for n in names if MODEL_STATES_RE.match(n)),
        key=lambda n: (0 if n.startswith("mp_rank_") else 1, int(MODEL_STATES_RE.match(n).group(1) or 0)),
    )
    mf = StatesFile(universal_dir / model_names[0]) if model_names else None
    m0 = mf.obj if mf is not None and isinstance(mf.obj, dict) else {}
    if mf is not None:
        _check_model_states(m0, mf.path.name)

    params = {n for n in listdir(zdir) if (zdir / n / "fp32.pt").is_file()}
    shapes: "OrderedDict[str, tuple[int, ...]]" = OrderedDict()
    if m0:
        for g in _param_shapes(m0, mf.path.name):
            shapes.update(g)
        fz = m0.get("frozen_param_shapes")
        if isinstance(fz, dict):
            for k, v in fz.items():
                shapes.setdefault(str(k), _shape(v, k))
    order = [n for n in shapes if n in params] + sorted(params - set(shapes))

    out: "OrderedDict[str, SourceTensor]" = OrderedDict()
    notes: list[str] = []
    module = m0.get("module") if isinstance(m0.get("module"), dict) else {}
    buffer_names = [str(b) for b in (m0.get("buffer_names") or [])]
    for name, t in module.items():
        if name in buffer_names and isinstance(t, TensorRef):
            out[name] = SourceTensor(name, tuple(t.shape), t.dtype, ref_ranges(mf, t, name))
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
    shared = m0.get("shared_params") if isinstance(m0.get("shared_params"), dict) else {}
    for alias, target in shared.items():
        alias, target = str(alias), str(target)
        if target in out and alias not in params:
            t = out[target]
            out[alias] = SourceTensor(alias, t.shape, t.dtype, t.ranges, tied_to=target)
    return Source("universal", universal_dir, list(out.values()), train_dtype=config_train_dtype(m0), notes=notes)
