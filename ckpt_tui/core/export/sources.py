"""Where each output tensor's bytes are in the source.

A :class:`SourceTensor` is either a list of byte ranges whose concatenation is the full tensor in
row-major order (the fast path: bytes are moved by offset, never become Python objects), a
``chunks`` generator of its bytes in order (a tensor computed piece by piece, e.g. a LoRA merge in
row blocks: bounded memory, nothing on disk to point at), or a ``load`` callable that materialises
it with torch (the general path: layouts whose chunks are not contiguous byte ranges of the full
tensor).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..dtypes import ITEMSIZE
from ..storage import Location, open_read
from ..types import numel


@dataclass(frozen=True)
class ByteRange:
    path: str
    offset: int
    length: int


@dataclass
class SourceTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name of the stored bytes, e.g. "float32"
    ranges: Optional[tuple[ByteRange, ...]] = None
    load: Optional[Callable[[], "object"]] = None  # -> torch.Tensor (general path)
    tied_to: Optional[str] = None  # written once: this name is an alias of ``tied_to``
    frozen: bool = False
    note: str = ""
    # the name ``list_tensors`` gives this tensor in the file it comes from, where that differs (a torch
    # file's weights under a wrapper key: DeepSpeed's `module.X`, Lightning's `state_dict.X`)
    listed_as: Optional[str] = None
    # the tensor's bytes in ``dtype``, row-major, in pieces whose concatenation is the full tensor (a computed
    # tensor: the writer casts and writes piece by piece, never holding the whole)
    chunks: Optional[Callable[[], Iterator[Union[bytes, memoryview]]]] = None

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


@dataclass
class Source:
    """Everything an export needs to know about the weights it reads."""

    kind: str  # "dcp" | "deepspeed" | "universal" | "torch-file" | "safetensors"
    path: Location
    tensors: list[SourceTensor]
    train_dtype: Optional[str] = None  # bf16/fp16 runs store fp32 masters: say --dtype bf16 halves the size
    notes: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)  # names the source already left out (exclude_frozen)


def read_bytes(t: SourceTensor, limit: int = 1 << 62) -> bytes:
    """All bytes of ``t`` (for tests and small tensors; the executor streams instead)."""
    if t.ranges is None:
        raise ValueError(f"{t.name} has no byte ranges")
    return read_ranges(t.ranges, limit)


def read_ranges(ranges: Iterable[ByteRange], limit: int = 1 << 62) -> bytes:
    """The bytes of these byte ranges, in order (OSError where a file ends early)."""
    out = bytearray()
    for r in ranges:
        with open_read(r.path) as f:
            f.seek(r.offset)
            data = f.read(r.length)
        if len(data) != r.length:
            raise OSError(f"{r.path}: expected {r.length} bytes at {r.offset}, got {len(data)}")
        out += data
        if len(out) > limit:
            raise MemoryError("tensor larger than the limit")
    return bytes(out)


def to_torch(t: SourceTensor) -> Any:  # a torch.Tensor (torch is not followed here: Any)
    """Materialise ``t`` as a torch tensor (tests, verification, dtype conversion of one tensor)."""
    import torch

    if t.load is not None:
        return t.load()
    if t.chunks is not None:
        data = b"".join([bytes(p) for p in t.chunks()])  # each piece copied as it comes: a view's buffer is reused
        if len(data) != t.nbytes:
            raise ValueError(f"{t.name}: its chunks hold {len(data)} bytes, its shape and dtype {t.nbytes}")
    else:
        data = read_bytes(t)
    dt = getattr(torch, t.dtype)
    if not data:
        return torch.empty(t.shape, dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=dt).reshape(t.shape)


def strip_names(src: Source, prefix: Optional[str]) -> Source:
    """Remove ``prefix`` from the names of ``src``'s tensors (and of what they are tied to)."""
    if prefix:
        src.excluded = [n[len(prefix) :] if n.startswith(prefix) else n for n in src.excluded]
        for t in src.tensors:
            if t.name.startswith(prefix):
                t.name = t.name[len(prefix) :]
            if t.tied_to and t.tied_to.startswith(prefix):
                t.tied_to = t.tied_to[len(prefix) :]
    return src
