"""A DeepSpeed tag's states files as byte ranges: a torch zip's structure and storage offsets (:class:`StatesFile`),
the flat partitions (:class:`Flat`), the checks and fields every layout's reader shares."""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Optional

from ...dtypes import ITEMSIZE
from ...export.sources import ByteRange
from ...storage import Location, LocationLike, as_path, listdir
from .. import FormatError
from ..torch_save import torchfile
from ..unpickle import TensorRef
from .moe import EXPP_OPTIM_RE, num_experts
from .reader import (
    LAYER_RE,
    MODEL_STATES_RE,
    OPTIM_STATES_RE,
    stage_value,
)

# a mixture-of-experts tag's own files: each expert's model states (read: .moe) and ZeRO stage 0's per
# expert-parallel rank optimizer states (refused)
MOE_RE = re.compile(r"(^|_)expp_rank_\d+|(^|_)expert_\d+_")


MAX_RANGES_PER_TENSOR = 1 << 20


class StatesFile:
    """One torch zip: its structure (data.pkl) and where each storage's bytes are."""

    def __init__(self, path: LocationLike) -> None:
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


def merge_ranges(ranges: list[ByteRange]) -> tuple[ByteRange, ...]:
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
    return merge_ranges(out)


class Flat:
    """A virtual 1-D fp32 vector: several flat tensors (of one or more files) back to back."""

    def __init__(self) -> None:
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


def as_shape(s: Any, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: unreadable shape {s!r}") from None


def config_train_dtype(model: dict[str, Any]) -> Optional[str]:
    cfg = model.get("ds_config")
    if isinstance(cfg, dict):
        for key, name in (("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("fp16", "float16")):
            sect = cfg.get(key)
            if isinstance(sect, dict) and sect.get("enabled") in (True, "true"):
                return name
    return None


def check_model_states(model: Any, name: str) -> dict[str, Any]:
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
    return model


def shapes_of(model: dict[str, Any], name: str) -> list["OrderedDict[str, tuple[int, ...]]"]:
    ps = model.get("param_shapes")
    if isinstance(ps, dict):  # very old DeepSpeed: one group
        ps = [ps]
    if not isinstance(ps, list):
        raise ValueError(f"{name}: param_shapes is not a list of groups")
    return [OrderedDict((str(k), as_shape(v, f"{name}: {k}")) for k, v in g.items()) for g in ps]


def optimizer_state(f: StatesFile) -> dict[str, Any]:
    obj = f.obj
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if not isinstance(osd, dict):
        raise ValueError(f"{f.path.name} has no optimizer_state_dict")
    return osd


def tag_names(tag_dir: Location) -> list[str]:
    """The file names of a ZeRO tag folder, refusing layouts no source here reads (pipeline, MoE)."""
    if not tag_dir.is_dir():
        raise ValueError(f"{tag_dir} is not a folder")
    names = sorted(listdir(tag_dir))
    if any(LAYER_RE.match(n) for n in names):
        raise ValueError("pipeline-parallel checkpoints (layer_*-model_states.pt files) are not supported")
    if any(EXPP_OPTIM_RE.match(n) for n in names):
        raise ValueError(
            "MoE checkpoints without ZeRO (stage 0: expp_rank_*_optim_states.pt files) are not supported; "
            "ZeRO-1/2 MoE tags are read"
        )
    return names


def is_bf16_optimizer(osd: dict[str, Any]) -> bool:
    """An ``optimizer_state_dict`` DeepSpeed's BF16_Optimizer saved: ZeRO-1 style fp32 partitions and
    ``param_slice_mappings``, but no ``zero_stage`` (which is why zero_to_fp32 rejects it)."""
    return (
        "zero_stage" not in osd
        and isinstance(osd.get("single_partition_of_fp32_groups"), (list, tuple))
        and "param_slice_mappings" in osd
    )


def open_tag(
    tag_dir: Location, bf16_optimizer: bool = False
) -> tuple[int, int, dict[int, StatesFile], list[StatesFile], dict[str, Any]]:
    """A ZeRO tag's stage, world size, optimizer-states files by rank, model-states files (one for
    ZeRO-1/2, one per rank for ZeRO-3) and rank 0's optimizer_state_dict; refuses what no source reads
    (``bf16_optimizer``: a BF16_Optimizer tag is read as ZeRO-1, whose layout it has)."""
    names = tag_names(tag_dir)
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
    osd0 = optimizer_state(optim[min(optim)])
    stage: Optional[int]
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
    counts = list(world) if isinstance(world, (list, tuple)) else []
    if counts:
        world = max(counts)  # a MoE group is partitioned over its expert-data-parallel ranks only: fewer
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
        check_model_states(mf.obj, mf.path.name)
    experts = num_experts(models[0].obj)
    if len(set(counts)) > 1 and experts is None:
        raise ValueError(
            f"param groups with different partition counts {counts} but no num_experts in the model states: "
            "not a mixture-of-experts layout ckpt-tui reads"
        )
    if experts is not None and stage == 3:
        raise ValueError("MoE checkpoints under ZeRO-3 are not supported (ZeRO-1/2 MoE tags are read)")
    return stage, world, optim, models, osd0


def cut_ranges(ranges: Iterable[ByteRange], nbytes: int) -> list[ByteRange]:
    out = []
    for r in ranges:
        if nbytes <= 0:
            break
        take = min(nbytes, r.length)
        out.append(ByteRange(r.path, r.offset, take))
        nbytes -= take
    return out


def master_groups(f: StatesFile, stage: int) -> list[Any]:
    """A rank's fp32 master partition of each param group (ZeRO-3: of each sub-group)."""
    key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
    g = optimizer_state(f).get(key)
    if not isinstance(g, (list, tuple)):
        raise ValueError(f"{f.path.name}: no {key}")
    return list(g)
