"""torch's ``HuggingFaceStorageWriter(path, save_distributed=True)``: one safetensors file per rank
(``shard-0000R-model-0000X-of-0000N.safetensors``, R the rank + 1), each tensor the rank's chunk of it, the chunk's
place in the whole tensor in the header's ``DCP_SHARDING_INFO`` (``{name: {"saved_offsets": [...]}}``). No
``.metadata``, no index: the whole tensor's shape is where its chunks end, and a tensor is whole when its chunks tile
it exactly (torch's ``HuggingFaceStorageReader`` and ``consolidate_safetensors_files`` read the folder the same way).

Everything here comes from the headers (the screened safetensors header reader): inspect reads no tensor. Export
copies each tensor by byte range where its chunks split it along dim 0 only (FSDP2's layout); other splits are put
together by the safetensors library, chunk by chunk. A rank's file missing from the middle of the numbering, a chunk
that overlaps another or leaves part of its tensor unwritten, dtypes that disagree: refused, said per tensor.
A missing *last* rank cannot be told from the other ranks' headers (they say where their chunks sit, not how many
ranks there were): where the folder was consolidated too, the consolidated files are the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ...export.sources import ByteRange, Source, SourceTensor
from ...safetext import visible
from ...types import TensorInfo
from .. import FormatError

SHARD_RE = re.compile(r"^shard-(\d{5})-model-(\d{5})-of-(\d{5})\.safetensors$")
KEY = "DCP_SHARDING_INFO"
MAX_PAIRS = 1 << 20  # chunk pairs compared for overlap in a tensor split other than along dim 0


@dataclass(frozen=True, slots=True)
class Chunk:
    path: Path
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    start: int  # absolute byte offset of its data in ``path``
    length: int


@dataclass
class ShardLayout:
    files: list[Path]
    ranks: list[int]  # the ranks whose files are there (from the names: R - 1)
    chunks: dict[str, list[Chunk]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the whole tensors'
    dtypes: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # why the folder does not make whole tensors
    missing_ranks: list[int] = field(default_factory=list)

    def tensor_infos(self) -> list[TensorInfo]:
        from ...dtypes import ITEMSIZE

        return [
            TensorInfo(n, s, self.dtypes[n], _volume(s) * ITEMSIZE.get(self.dtypes[n], 0))
            for n, s in self.shapes.items()
        ]


def shard_files(folder: Path) -> list[Path]:
    """The ``shard-…safetensors`` files of ``folder`` (regular files, not links), in rank order."""
    found = [p for p in folder.iterdir() if SHARD_RE.match(p.name) and p.is_file() and not p.is_symlink()]
    return sorted(found, key=lambda p: (int(SHARD_RE.match(p.name).group(1)), p.name))  # type: ignore[union-attr]


def read_layout(folder: Path) -> ShardLayout:
    """Every shard's header, joined into whole tensors (FormatError where a header cannot be read at all)."""
    from ..safetensors.header import read_header

    files = shard_files(folder)
    if not files:
        raise FormatError(f"no shard-*.safetensors files in {visible(str(folder))}")
    numbers = sorted({int(SHARD_RE.match(p.name).group(1)) for p in files})  # type: ignore[union-attr]
    lay = ShardLayout(files=files, ranks=[n - 1 for n in numbers])
    lay.missing_ranks = [r - 1 for r in range(1, numbers[-1] + 1) if r not in set(numbers)]
    if lay.missing_ranks:
        shown = ", ".join(f"shard-{r + 1:05d}-…" for r in lay.missing_ranks[:4])
        lay.problems.append(
            f"rank(s) {', '.join(map(str, lay.missing_ranks[:8]))} have no file ({shown} missing): their chunks of "
            "every tensor are not there"
        )
    for p in files:
        h = read_header(p)
        try:
            info = json.loads((h.metadata or {}).get(KEY, "null"))
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise FormatError(f"{visible(p.name)}: its header has no readable {KEY}")
        for name, dtype, shape in zip(h.names, h.dtypes, h.shapes):
            entry = info.get(name)
            offs = entry.get("saved_offsets") if isinstance(entry, dict) else None
            if (
                not isinstance(offs, list)
                or len(offs) != len(shape)
                or not all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 1 << 62 for o in offs)
            ):
                lay.problems.append(f"`{visible(name)}` in {visible(p.name)}: {KEY} gives no saved_offsets that fit it")
                continue
            b, e = h.offsets[name]
            lay.chunks.setdefault(name, []).append(Chunk(p, tuple(offs), tuple(shape), h.data_start + b, e - b))
            if lay.dtypes.setdefault(name, dtype) != dtype:
                lay.problems.append(
                    f"`{visible(name)}`: its chunks disagree on the dtype ({lay.dtypes[name]}, {dtype})"
                )
    for name, chunks in lay.chunks.items():
        ndim = len(chunks[0].shape)
        if any(len(c.shape) != ndim for c in chunks):
            lay.problems.append(f"`{visible(name)}`: its chunks have different numbers of dimensions")
            continue
        full = tuple(max(c.offsets[d] + c.shape[d] for c in chunks) for d in range(ndim))
        lay.shapes[name] = full
        why = _tiling_problem(chunks, full)
        if why:
            lay.problems.append(f"`{visible(name)}` {list(full)}: {why}")
    return lay


def _volume(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _tiling_problem(chunks: list[Chunk], full: tuple[int, ...]) -> Optional[str]:
    """Why ``chunks`` do not tile the tensor ``full`` exactly, or None."""
    if _dim0(chunks, full):
        at = 0
        for c in sorted(chunks, key=lambda c: c.offsets[0] if c.offsets else 0):
            o = c.offsets[0] if c.offsets else 0
            if o != at:
                return f"rows {at}–{o} are in no chunk" if o > at else f"chunks overlap at row {o}"
            at = o + (c.shape[0] if c.shape else 1)
        return None
    if sum(_volume(c.shape) for c in chunks) != _volume(full):
        return "its chunks leave part of it unwritten or overlap"
    if len(chunks) ** 2 > MAX_PAIRS:
        return f"{len(chunks)} chunks split it along several dimensions: too many to check"
    for i, a in enumerate(chunks):
        for b in chunks[i + 1 :]:
            if all(
                a.offsets[d] < b.offsets[d] + b.shape[d] and b.offsets[d] < a.offsets[d] + a.shape[d]
                for d in range(len(full))
            ):
                return "two of its chunks overlap"
    return None


def _dim0(chunks: list[Chunk], full: tuple[int, ...]) -> bool:
    """Do the chunks split the tensor along dim 0 only (every other offset 0, every other size whole)?"""
    return all(all(o == 0 for o in c.offsets[1:]) and c.shape[1:] == full[1:] for c in chunks)


def refuse(lay: ShardLayout, folder: Path) -> None:
    if lay.problems:
        more = f" (and {len(lay.problems) - 6} more)" if len(lay.problems) > 6 else ""
        raise FormatError(
            f"the per-rank shards in {visible(str(folder))} do not make whole tensors: "
            + "; ".join(lay.problems[:6])
            + more
        )


def shards_source(folder: Path) -> Source:
    """The whole tensors of a ``save_distributed=True`` folder as an export source."""
    lay = read_layout(folder)
    refuse(lay, folder)
    tensors: list[SourceTensor] = []
    for name, full in lay.shapes.items():
        chunks, dtype = lay.chunks[name], lay.dtypes[name]
        if _dim0(chunks, full):
            ordered = sorted(chunks, key=lambda c: c.offsets[0] if c.offsets else 0)
            ranges = tuple(ByteRange(str(c.path), c.start, c.length) for c in ordered if c.length)
            tensors.append(SourceTensor(name, full, dtype, ranges=ranges))
        else:
            tensors.append(SourceTensor(name, full, dtype, load=_loader(name, full, dtype, chunks)))
    return Source(
        "dcp",
        folder,
        tensors,
        notes=[
            f"torch's HuggingFaceStorageWriter(save_distributed=True): {len(lay.files)} per-rank shard files, each "
            f"tensor put together from its ranks' chunks at the offsets {KEY} gives"
        ],
    )


def _loader(name: str, full: tuple[int, ...], dtype: str, chunks: list[Chunk]) -> Any:
    def load() -> Any:
        return assemble(name, full, dtype, chunks)

    return load


def assemble(name: str, full: tuple[int, ...], dtype: str, chunks: list[Chunk]) -> Any:
    """The whole tensor, each chunk read by the safetensors library and placed at its offsets."""
    import torch
    from safetensors import safe_open

    out = torch.empty(full, dtype=getattr(torch, dtype))
    for c in chunks:
        with safe_open(str(c.path), framework="pt") as f:
            part = f.get_tensor(name)
        out[tuple(slice(o, o + n) for o, n in zip(c.offsets, part.shape))] = part
    return out


def reference_tensors(folder: Path) -> Any:
    """(name, whole tensor) of every tensor, put together by the safetensors library (verify's reference)."""
    lay = read_layout(folder)
    refuse(lay, folder)
    for name, full in lay.shapes.items():
        yield name, assemble(name, full, lay.dtypes[name], lay.chunks[name])
