"""Weights of single files as export sources: torch.save zips (pytorch_model.bin, .pt, .pth,
Lightning .ckpt, FSDP full state dicts, Accelerate model_N.bin).

Tensors in a torch zip are storage entries stored uncompressed: a contiguous tensor is one byte
range of the file, found from the zip headers; nothing is unpickled beyond the restricted reader.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ...dtypes import ITEMSIZE
from ...export.sources import ByteRange, Source, SourceTensor
from ...storage import Location, LocationLike, as_path, open_read
from .. import FormatError
from ..unpickle import DTensorRef, ShardedTensorRef, StorageRef, TensorRef, iter_tensors
from . import torchfile
from .torchfile import pick_state_dict


def read_screened(path: Location, trust_pickles: bool) -> "torchfile.TorchFile":
    """The torch file ``path`` read by the restricted unpickler, refused if it names code outside the allowlist
    (unless trusted) or is in torch's legacy format (no byte ranges to read)."""
    tf = torchfile.read(path)
    if tf.unsafe and not trust_pickles:
        raise FormatError(
            f"{path.name} names code outside the allowlist ({', '.join(sorted(tf.unsafe)[:4])}); "
            "pass --trust-pickles if you trust its origin"
        )
    if not tf.is_zip:
        raise FormatError(f"{path.name} uses torch's legacy (pre-1.6) format; re-save it with torch.save first")
    return tf


def torch_file_source(
    where: LocationLike, *, strip_prefix: Optional[str] = None, trust_pickles: bool = False
) -> Source:
    path = as_path(where)
    tf = read_screened(path, trust_pickles)
    sd, wrapper = pick_state_dict(tf.obj)
    if isinstance(sd, dict) and any(isinstance(v, (DTensorRef, ShardedTensorRef)) for v in sd.values()):
        raise FormatError(
            f"{path.name} holds one rank's shards (DTensor/ShardedTensor), not full tensors: export the "
            "folder that holds every rank's file"
        )
    offsets = torchfile.storage_offsets(path)
    tensors: list[SourceTensor] = []
    first_by_view: dict[tuple[str, int, tuple[int, ...], Optional[tuple[int, ...]]], str] = {}
    for name, t in iter_tensors(sd):
        out = name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name
        listed = f"{wrapper}.{name}" if wrapper else None  # list_tensors names the whole nesting
        view = (t.storage.key, t.offset, t.shape, t.stride) if t.storage is not None else None
        tied = first_by_view.get(view) if view else None
        if view and tied is None:
            first_by_view[view] = out
        tensors.append(
            file_tensor(
                path,
                t,
                offsets,
                name,
                out=out,
                tied_to=tied,
                listed_as=listed,
                not_plain=" (a sharded or subclass tensor); export its folder's DCP/full state dict instead",
            )
        )
    if not tensors:
        raise FormatError(f"{path.name} holds no tensors")
    src = Source("torch-file", path, tensors)
    if wrapper:
        src.notes.append(f"weights taken from the file's `{wrapper}` entry")
    return src


def file_tensor(
    path: Location,
    t: TensorRef,
    offsets: dict[str, tuple[int, int]],
    name: str,
    *,
    out: Optional[str] = None,
    not_plain: str = "",
    **fields: Any,
) -> SourceTensor:
    """The tensor ``t`` of the torch file ``path`` (``name`` in it; ``out`` in the output, default ``name``) as
    a byte range of its storage, or, for a non-contiguous view, a loader that copies it element-wise."""
    if t.storage is None:
        raise FormatError(f"{name} is not a plain tensor{not_plain}")
    item = ITEMSIZE.get(t.dtype)
    if item is None:
        raise FormatError(f"{name} has unsupported dtype {t.dtype}")
    out = name if out is None else out
    if t.contiguous:
        start, size = offsets[t.storage.key]
        if (t.offset + t.numel) * item > size:
            raise FormatError(f"{name} runs past its storage: the file is corrupt", "corrupt")
        rng = (ByteRange(str(path), start + t.offset * item, t.numel * item),) if t.numel else ()
        return SourceTensor(out, t.shape, t.dtype, ranges=rng, **fields)
    return SourceTensor(
        out,
        t.shape,
        t.dtype,
        load=strided_loader(path, t, t.storage, offsets),
        note="non-contiguous view, copied element-wise",
        **fields,
    )


def strided_loader(
    path: Location, t: TensorRef, storage: StorageRef, offsets: dict[str, tuple[int, int]]
) -> Callable[[], object]:
    """A loader of ``t``, a view of ``storage`` (``t.storage``), copied element-wise."""

    def load() -> object:
        import torch

        start, size = offsets[storage.key]
        with open_read(path) as f:
            f.seek(start)
            raw = bytearray(f.read(size))
        base = torch.frombuffer(raw, dtype=getattr(torch, t.dtype)) if raw else torch.empty(0)
        return torch.as_strided(base, t.shape, t.stride, t.offset).contiguous()

    return load
