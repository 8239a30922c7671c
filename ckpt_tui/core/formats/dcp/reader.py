"""torch.distributed.checkpoint folders: ``.metadata`` (or rank-local ``__{rank}.metadata``) and ``*.distcp``.

``.metadata`` is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``; DCP's own
reader unpickles it freely, we read it through the restricted unpickler.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from itertools import accumulate, compress, product, repeat
from typing import Any, Callable, Iterable, Iterator, Optional, Union, cast

from ...dtypes import ITEMSIZE
from ...progress import check_cancel, report, scoped
from ...storage import Location, LocationLike, as_path, open_read
from ...storage import size as storage_size
from ...types import TensorInfo
from .. import FormatError
from ..unpickle import (
    MAX_PICKLE_BYTES,
    Record,
    Stub,
    gc_paused,
    mark_screened_clean,
    release_in_slices,
    safe_loads,
    screened_clean,
)
from . import stream as dcp_stream
from .stream import LITTLE, StreamFacts
from .summary import ChunkSummary, Folded, SummaryMismatch, load_dcp_summary

PROGRESS_FROM = 1 << 24  # a .metadata larger than this reports its reading (the scan's progress) and checks cancel
SHARD_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
RANK_META_RE = re.compile(r"^__(\d+)\.metadata$")


@dataclass
class DcpInfo:
    path: Location
    tensors: list[TensorInfo]
    bytes_entries: list[str]
    files: dict[str, int]  # relative file -> bytes it must have at least (max offset+length)
    planner_data: dict[str, tuple[str, ...]] = field(default_factory=dict)
    metadata_files: list[str] = field(default_factory=list)
    metadata_bytes: int = 0
    unsafe: set[str] = field(default_factory=set)
    chunk_dims: set[int] = field(default_factory=set)  # dimensions along which chunks are split
    version: Optional[str] = None
    # tensor -> its chunks' offsets (the general reader, or rank-local metadata files to merge)
    chunk_offsets: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    # tensor -> (distinct chunk offsets, the most of them sharing one offset[:1]), where read folded (one .metadata)
    chunk_layout: dict[str, tuple[int, int]] = field(default_factory=dict)
    chunk_count: int = 0  # chunk records in all
    # Megatron-Core's tensor-parallel linear weights (:data:`MEGATRON_TP_SPLIT`), where read folded: their distinct
    # chunk offsets (the others' are in chunk_offsets)
    tp_offsets: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    chunk_gaps: list[str] = field(default_factory=list)  # tensors whose chunks leave part of them unwritten
    chunk_overlaps: list[str] = field(default_factory=list)  # tensors whose chunks overlap
    # rank-local metadata files: tensor -> its distinct (offsets, sizes) over the files, checked once all are read
    merged_chunks: dict[str, set[tuple[tuple[int, ...], tuple[int, ...]]]] = field(default_factory=dict)
    # the distinct transform descriptors of the storage entries (torch's extensions: ("stream.zstd/1",) for
    # FileSystemWriter(_extensions=[ZStandard()])); () is the plain encoding
    transforms: set[tuple[str, ...]] = field(default_factory=set)

    @property
    def keys(self) -> list[str]:
        return [t.name for t in self.tensors] + self.bytes_entries


def _get(o: Any, name: str, default: Any = None) -> Any:
    if isinstance(o, (Stub, Record)):
        return o.__dict__.get(name, default)
    if isinstance(o, dict):
        return o.get(name, default)
    return getattr(o, name, default)


def _props_dtype(props: object) -> str:
    state = _get(props, "_state")
    if isinstance(state, tuple) and state:
        return str(state[0])
    return str(_get(props, "dtype", "unknown"))


def metadata_files(folder: Location) -> tuple[Optional[Location], list[Location]]:
    """The global ``.metadata`` (or None) and any rank-local ``__{rank}.metadata`` files."""
    glob_meta = folder / ".metadata"
    ranks = sorted(
        (p for p in folder.iterdir() if RANK_META_RE.match(p.name)),
        key=lambda p: int(cast("re.Match[str]", RANK_META_RE.match(p.name)).group(1)),  # matched just above
    )
    return (glob_meta if glob_meta.is_file() else None), ranks


def _check_size(path: Location) -> int:
    size = storage_size(path)
    if size == 0:
        raise FormatError(".metadata is empty (0 bytes)", "truncated")
    if size > MAX_PICKLE_BYTES:
        raise FormatError(f".metadata of {size} bytes exceeds the {MAX_PICKLE_BYTES} byte limit")
    return size


def _check_metadata(obj: object) -> None:
    if not isinstance(obj, (Stub, Record)) or "state_dict_metadata" not in obj.__dict__:
        raise FormatError("not a torch.distributed.checkpoint Metadata pickle")


def read_metadata_file(path: Location) -> tuple[Any, set[str], int]:
    """The whole ``Metadata`` as stand-ins: every chunk record and ``storage_data`` entry (what an export
    needs to map chunks to byte ranges)."""
    size = _check_size(path)
    with open_read(path, whole=True) as f:
        data = f.read()
    return (*_general(data), size)


def _general(data: bytes) -> tuple[Any, set[str]]:
    """``Metadata`` and the globals outside the allowlist, through the general restricted reader."""
    up = safe_loads(data)
    _check_metadata(up.obj)
    return up.obj, up.unsafe


class ChainReader:
    """The stream to unpickle, over a list of byte strings each dropped once read (the compacted stream's
    frames), through Python methods: the C unpickler calls one per frame it reads, and each call lets another
    thread take the GIL — a TUI stays responsive while a worker unpickles a 200 MB ``.metadata`` in one C call.
    ``on_read(bytes so far)`` is called there too (progress, or a cancel check that raises)."""

    def __init__(self, parts: list[bytes], on_read: Optional[Callable[[int], None]] = None) -> None:
        self._parts = parts
        parts.reverse()
        self._pos = 0
        self._on_read = on_read
        self.done = 0

    def _count(self, n: int) -> None:
        self.done += n
        if self._on_read is not None:
            self._on_read(self.done)

    def readinto(self, buf: Union[bytearray, memoryview]) -> int:
        view = memoryview(buf).cast("B")
        done = 0
        while done < len(view) and self._parts:
            part = self._parts[-1]
            n = min(len(view) - done, len(part) - self._pos)
            view[done : done + n] = part[self._pos : self._pos + n]
            done += n
            self._pos += n
            if self._pos == len(part):
                self._parts.pop()
                self._pos = 0
        self._count(done)
        return done

    def read(self, n: int) -> bytes:  # the unpickler always asks for a size
        buf = bytearray(n)
        return bytes(buf[: self.readinto(buf)])

    def readline(self) -> bytes:  # text opcodes (protocols 0 and 1), which no rewrite touches
        out = bytearray()
        while self._parts:
            part = self._parts[-1]
            i = part.find(b"\n", self._pos)
            end = len(part) if i < 0 else i + 1
            out += part[self._pos : end]
            self._pos = end
            if self._pos == len(part):
                self._parts.pop()
                self._pos = 0
            if i >= 0:
                break
        self._count(len(out))
        return bytes(out)


def read_metadata_summary(path: Location) -> tuple[Any, set[str], int, Optional[tuple[list[Any], dict[str, int]]]]:
    """``Metadata`` with each tensor's chunk records folded (``chunks`` a :class:`ChunkSummary`) and the
    ``storage_data`` entries as (the states read the ordinary way, ``{file: furthest end}`` of the entries
    compacted first by :mod:`.stream`) — what inspect needs, built in a fraction of the time and memory.

    The file is read once. A stream whose chunk records refer to one another keeps only its storage entries
    rewritten; one whose records refer to rewritten ones is folded as written; one of another shape, or naming a
    global outside the allowlist, is read by the general reader (the storage then None)."""
    size = _check_size(path)
    on_progress, cancel = scoped()  # a scan's: a 200 MB .metadata takes seconds
    big = size > PROGRESS_FROM

    def reading(done: int, total: int, what: str = f"reading {path.name}") -> None:
        check_cancel(cancel)
        report(on_progress, done, total, "bytes", what)

    def folding(parts: list[bytes]) -> ChainReader:
        total, shown = sum(map(len, parts)), 0

        def on_read(done: int) -> None:  # once per frame the unpickler reads: reported ~64 times in all
            nonlocal shown
            if done - shown >= total // 64 or done == total:
                shown = done
                reading(done, total, f"folding {path.name}'s records")

        return ChainReader(parts, on_read if big else None)

    def streams() -> Iterator[tuple[list[bytes], Optional[StreamFacts]]]:
        """What to fold, in turn, until one folds: (the stream's pieces, the facts the rewrite took out)."""
        parts, nchunks, _, facts = dcp_stream.compact(data, reading if big else None)
        yield parts, facts
        if facts is None:  # not rewritten (not framed): that was the stream as written
            return
        if nchunks:  # the chunk records refer to one another (torch.Size objects shared): leave them as they are
            parts, _, _, facts = dcp_stream.compact(data, chunks=False)
            yield parts, facts
        yield [data], None  # records refer to rewritten ones: as written

    with open_read(path, whole=True) as f:  # remote: one GET of the whole object
        data = f.read()
    # The verdict comes from a read of the whole file as written (every opcode through the restricted unpickler):
    # the rewritten stream is a view for facts only, used for bytes whose full read this process or an earlier
    # run already made and found clean (screened_clean: by content digest).
    screened = screened_clean(data)
    for parts, facts in streams() if screened else iter([([data], None)]):
        try:
            up, states, files = load_dcp_summary(folding(parts), facts)
        except SummaryMismatch:
            continue
        if up.unsafe:  # a finding: let the general reader decide what it can still read
            break
        if facts is not None and facts.negative:
            raise FormatError("storage data with a negative offset or length")
        _check_metadata(up.obj)
        if not screened:
            mark_screened_clean(data)
        return up.obj, up.unsafe, size, (states, files)
    obj, unsafe = _general(data)
    if not unsafe:
        mark_screened_clean(data)
    return obj, unsafe, size, None


def screen_metadata(path: Location) -> set[str]:
    """The globals outside the allowlist that a ``.metadata`` names, from a read of the whole file as written by the
    restricted unpickler (what torch's DCP reader would ``pickle.load``). Raises FormatError where it cannot be
    read."""
    size = _check_size(path)
    with open_read(path, whole=True) as f:
        data = f.read()
    if len(data) != size:
        raise FormatError(f"{path.name} changed while it was read", "truncated")
    if screened_clean(data):
        return set()
    try:
        up = load_dcp_summary(ChainReader([data]), None)[0]
    except SummaryMismatch:
        up = safe_loads(data)
    if not up.unsafe:
        _check_metadata(up.obj)
        mark_screened_clean(data)
    return up.unsafe


def read(where: LocationLike) -> DcpInfo:
    """The facts of a DCP folder's metadata: tensors, files and the sizes they must have, how chunks split."""
    folder = as_path(where)
    glob_meta, rank_metas = metadata_files(folder)
    sources = [glob_meta] if glob_meta else rank_metas
    if not sources:
        raise FormatError("no .metadata file", "missing")
    info = DcpInfo(folder, [], [], {})
    with gc_paused():
        for src in sources:
            _read_one(info, src, merge=len(sources) > 1)
    for t in info.tensors:  # rank-local files list a replicated tensor's chunk once per rank: distinct ones count
        recs = info.merged_chunks.get(t.name)
        if recs is not None:
            _note_cover(info, t, [r[0] for r in recs], [r[1] for r in recs])
    info.merged_chunks.clear()
    return info


def _note_cover(info: DcpInfo, t: TensorInfo, offsets: list[tuple[int, ...]], sizes: list[tuple[int, ...]]) -> None:
    try:
        gap, overlap = chunk_cover(t.shape, offsets, sizes)
    except FormatError as e:
        raise FormatError(f"tensor {t.name!r}: {e}") from None
    _note(info, t.name, gap, overlap)


def _note(info: DcpInfo, name: str, gap: bool, overlap: bool) -> None:
    if gap:
        info.chunk_gaps.append(name)
    if overlap:
        info.chunk_overlaps.append(name)


_ONE_INT = {(0x4B, 2), (0x4D, 3), (0x4A, 5)}  # BININT1, BININT2, BININT: (opcode, token length)


def _single_ints(toks: list[bytes]) -> list[int]:
    """The int each token (one pickled int opcode) holds: read whole as little-endian numbers, the opcode their low
    byte, where every one is a BININT1/BININT2/BININT of a value below 2**31; one at a time otherwise."""
    whole = list(map(int.from_bytes, toks, repeat(LITTLE)))
    if set(zip(map(operator.and_, whole, repeat(0xFF)), map(len, toks))) <= _ONE_INT:
        vals = list(map(operator.rshift, whole, repeat(8)))
        if max(vals, default=0) < 1 << 31:
            return vals
    out = []
    for tok in toks:
        v = dcp_stream.decode_ints(tok)
        if len(v) != 1:
            raise FormatError("a chunk's first offset is not one integer")
        out.append(v[0])
    return out


def _fold_cover(info: DcpInfo, t: TensorInfo, fold: Folded, merge: bool) -> None:
    """The tiling check of one tensor's folded chunk records (:data:`ChunkSummary`)."""
    recs = fold.records()
    if len(recs) == 2:  # read the ordinary way: tuples
        offsets, shapes = recs
        if merge:
            info.merged_chunks.setdefault(t.name, set()).update(zip(offsets, shapes))
        else:
            _note_cover(info, t, offsets, shapes)
        return
    first, rest, sizes = recs  # the rewritten records' tokens: each distinct token decoded once
    nd, n = len(t.shape), len(first)
    uniq = list(set(first))  # one per chunk where split on dim 0 (10^6 on a 405B layout): decoded in C-level passes
    if not nd and set(uniq) - {b""}:
        raise FormatError(f"tensor {t.name!r}: a chunk with offsets for a 0-d tensor")
    tails = {tok: dcp_stream.decode_ints(tok) for tok in set(rest)}
    sized = {tok: dcp_stream.decode_ints(tok) for tok in set(sizes)}
    if set(map(len, tails.values())) - {max(nd - 1, 0)} or set(map(len, sized.values())) - {nd}:
        raise FormatError(f"tensor {t.name!r}: a chunk whose offsets or sizes are not of the tensor's {nd} dimensions")

    def column(tokens: list[bytes], table: dict[bytes, tuple[int, ...]], j: int) -> list[int]:
        vals = {v[j] for v in table.values()}
        if len(vals) == 1:
            return [vals.pop()] * n
        return list(map(operator.itemgetter(j), map(table.__getitem__, tokens)))

    ocols = []
    if nd:
        head = dict(zip(uniq, _single_ints(uniq)))
        ocols = [list(map(head.__getitem__, first)) if len(uniq) > 1 else [head[uniq[0]]] * n]
        ocols += [column(rest, tails, j) for j in range(nd - 1)]
    scols = [column(sizes, sized, j) for j in range(nd)]
    if merge:
        info.merged_chunks.setdefault(t.name, set()).update(zip(zip(*ocols), zip(*scols)) if nd else [((), ())] * n)
        return
    try:
        _note(info, t.name, *cover_columns(t.shape, n, ocols, scols, ints=True))
    except FormatError as e:
        raise FormatError(f"tensor {t.name!r}: {e}") from None


def _read_one(info: DcpInfo, src: Location, merge: bool) -> None:
    seen = {t.name for t in info.tensors}
    meta, unsafe, nbytes, storage = read_metadata_summary(src)
    info.unsafe |= unsafe
    info.metadata_bytes += nbytes
    info.metadata_files.append(src.name)
    info.version = _get(meta, "version", info.version)
    sdm = _get(meta, "state_dict_metadata") or {}
    if not isinstance(sdm, dict):
        raise FormatError("state_dict_metadata is not a dict")
    for key, md in sdm.items():
        key = str(key)
        qual = getattr(md, "_qualname", "")
        if qual.endswith("TensorStorageMetadata"):
            size = tuple(int(x) for x in (_get(md, "size") or ()))
            dtype = _props_dtype(_get(md, "properties"))
            numel = 1
            for d in size:
                numel *= d
            ti = TensorInfo(key, size, dtype, numel * ITEMSIZE.get(dtype, 1))
            chunks = _get(md, "chunks") or []
            if isinstance(chunks, ChunkSummary):
                _fold_cover(info, ti, chunks, merge)
            if isinstance(chunks, ChunkSummary) and not merge:
                info.chunk_layout[key] = (chunks.distinct, chunks.per_first)
                if megatron_tp_split(key) is not None:
                    info.tp_offsets[key] = set(chunks.offsets)
                info.chunk_dims |= chunks.split_dims
                info.chunk_count += chunks.count
            elif isinstance(chunks, ChunkSummary):
                info.chunk_offsets.setdefault(key, []).extend(chunks.offsets)
                info.chunk_dims |= chunks.split_dims
                info.chunk_count += chunks.count
            if isinstance(chunks, ChunkSummary):
                chunks.release()  # freed tensor by tensor, not all at once at the end (GIL)
            else:
                offsets = info.chunk_offsets.setdefault(key, [])
                mine: tuple[list[tuple[int, ...]], list[tuple[int, ...]]] = ([], [])
                for ch in chunks:
                    offs = tuple(_get(ch, "offsets") or ())
                    sizes = tuple(_get(ch, "sizes") or ())
                    offsets.append(offs)
                    mine[0].append(offs)
                    mine[1].append(sizes)
                    info.chunk_count += 1
                    for d, (o, s) in enumerate(zip(offs, sizes)):
                        if len(size) > d and (o != 0 or s != size[d]):
                            info.chunk_dims.add(d)
                if merge:
                    info.merged_chunks.setdefault(key, set()).update(zip(*mine))
                else:
                    _note_cover(info, ti, *mine)
            if key not in seen:
                seen.add(key)
                info.tensors.append(ti)
        elif key not in info.bytes_entries:
            info.bytes_entries.append(key)
    pd = _get(meta, "planner_data") or {}
    if isinstance(pd, dict):
        for k, v in pd.items():
            if isinstance(v, (list, tuple)):
                info.planner_data[str(k)] = tuple(str(x) for x in v)
    if storage is None:
        sd = _get(meta, "storage_data") or {}
        storage = ([getattr(st, "__dict__", None) for st in sd.values()] if isinstance(sd, dict) else [], {})
    states, files = storage
    info.transforms.update(map(_transforms, states))
    storage_ends(states, info.files)
    _merge_ends(files, info.files)
    release_in_slices([states])


def _transforms(state: Any) -> tuple[str, ...]:
    """A storage entry's transform descriptors, as strings (``()``: none)."""
    d = state.get("transform_descriptors") if isinstance(state, dict) else None
    return tuple(str(x)[:200] for x in d) if isinstance(d, (list, tuple)) else ()


def storage_ends(states: list[Any], files: dict[str, int]) -> None:
    """files[relative path] = the largest offset + length any storage entry places in it."""
    if storage_ends_fast(states, files):
        return
    for d in states:
        if not isinstance(d, dict) or d.get("relative_path") is None:
            continue
        try:
            offset, length = int(d.get("offset") or 0), int(d.get("length") or 0)
        except (TypeError, ValueError):
            raise FormatError("storage data with a non-numeric offset or length") from None
        if offset < 0 or length < 0:
            raise FormatError(
                f"storage data with a negative offset or length ({offset}, {length}) in {d['relative_path']!r}"
            )
        end = offset + length
        rel = str(d["relative_path"])
        if end > files.get(rel, -1):
            files[rel] = end


def storage_ends_fast(states: list[Any], files: dict[str, int], step: int = 65_536) -> bool:
    """:func:`storage_ends` in C-level passes for the common case (every state a dict with a path and int
    offset and length, each file's last entry its furthest); False (``files`` untouched) where that does not
    hold. ``step`` states at a time, so that no single C call holds the GIL for long."""
    last: dict[str, int] = {}
    for i in range(0, len(states), step):
        part = states[i : i + step]
        n = len(part)
        if set(map(type, part)) != {dict}:
            return False
        rels = list(map(dict.get, part, repeat("relative_path", n)))
        offs = list(map(dict.get, part, repeat("offset", n), repeat(0, n)))
        lens = list(map(dict.get, part, repeat("length", n), repeat(0, n)))
        if set(map(type, offs)) - {int} or set(map(type, lens)) - {int} or min(offs) < 0 or min(lens) < 0:
            return False  # the one-at-a-time pass says what is wrong
        ends = list(map(operator.add, offs, lens))
        if not _ends_in_order(rels, ends, last):
            return False
    _merge_ends(last, files)
    return True


def _ends_in_order(rels: list[Any], ends: list[Any], last: dict[Any, int]) -> bool:
    """Fold one slice of (path, end) into ``last``; False where a path or an end is not a str/int or a file's
    entries do not come in increasing order of end (also across slices)."""
    if set(map(type, rels)) - {str} or set(map(type, ends)) - {int}:
        return False
    n = len(rels)
    ends_before = list(map(last.get, rels, repeat(-1, n)))
    last.update(zip(rels, ends))
    return not (any(map(operator.gt, ends, map(last.__getitem__, rels))) or any(map(operator.gt, ends_before, ends)))


def _merge_ends(last: dict[str, int], files: dict[str, int]) -> None:
    for rel, end in last.items():
        if end > files.get(rel, -1):
            files[rel] = end


MAX_COVER_CELLS = 1 << 22  # the most grid cells the tiling check paints for one tensor of an irregular layout


def chunk_cover(
    shape: tuple[int, ...], offsets: list[tuple[int, ...]], sizes: list[tuple[int, ...]]
) -> tuple[bool, bool]:
    """(a gap, an overlap) of the chunks ``offsets[i]``/``sizes[i]`` (tuples) over a tensor of ``shape``: do they
    tile it exactly? Raises FormatError for a chunk that is not of the tensor's rank, not of non-negative integers,
    or reaches outside the tensor. Near-linear for the layouts frameworks write (a split along one dimension, or a
    grid over several)."""
    nd = len(shape)
    if set(map(len, offsets)) - {nd} or set(map(len, sizes)) - {nd} or len(offsets) != len(sizes):
        raise FormatError(f"a chunk whose offsets or sizes are not of the tensor's {nd} dimensions")
    return cover_columns(
        shape,
        len(offsets),
        [list(map(operator.itemgetter(d), offsets)) for d in range(nd)],
        [list(map(operator.itemgetter(d), sizes)) for d in range(nd)],
    )


def cover_columns(
    shape: tuple[int, ...], n: int, ocols: list[list[int]], scols: list[list[int]], ints: bool = False
) -> tuple[bool, bool]:
    """:func:`chunk_cover` over the chunks' coordinates by dimension: ``ocols[d][i]`` chunk i's offset along d
    (``ints``: every coordinate is known to be an int, as decoded from the pickled tokens)."""
    nd = len(shape)
    whole = 1
    for d in shape:
        whole *= d
    ends = []
    for d in range(nd):
        o, z = ocols[d], scols[d]
        if n and (not ints and (set(map(type, o)) - {int} or set(map(type, z)) - {int}) or min(o) < 0 or min(z) < 0):
            raise FormatError("a chunk with a negative or non-integer offset or size")
        e = list(map(operator.add, o, z))
        if n and max(e) > shape[d]:
            raise FormatError(f"a chunk reaching outside its tensor (to {max(e)} along dimension {d} of {shape[d]})")
        ends.append(e)
    if whole == 0:
        return False, False
    vol = [1] * n
    for z in scols:
        vol = list(map(operator.mul, vol, z))
    if 0 in vol:  # an empty chunk covers nothing (torch.chunk's tail ranks)
        ocols = [list(compress(c, vol)) for c in ocols]
        scols = [list(compress(c, vol)) for c in scols]
        ends = [list(compress(c, vol)) for c in ends]
    m = len(ends[0]) if nd else n
    if not m:
        return True, False
    split = [d for d in range(nd) if max(ocols[d]) != 0 or min(scols[d]) != shape[d]]
    if not split:  # every chunk is the whole tensor
        return False, m > 1
    if len(split) == 1:  # a sweep along the one split dimension, its chunks in order of their start
        d = split[0]
        starts, stops = ocols[d], ends[d]
        if any(map(operator.gt, starts, starts[1:])):  # not written in order
            order = sorted(range(m), key=starts.__getitem__)
            starts, stops = [starts[i] for i in order], [stops[i] for i in order]
        reach = list(accumulate(stops, max))
        gap = starts[0] > 0 or reach[-1] < shape[d] or any(map(operator.gt, starts[1:], reach))
        return gap, any(map(operator.lt, starts[1:], reach))
    # a grid: the cells between every chunk boundary along each split dimension
    bounds = [sorted(set(ocols[d]) | set(ends[d]) | {0, shape[d]}) for d in split]
    index = [{b: i for i, b in enumerate(bs)} for bs in bounds]
    cells = 1
    for bs in bounds:
        cells *= len(bs) - 1
    lo = [list(map(ix.__getitem__, ocols[d])) for ix, d in zip(index, split)]
    hi = [list(map(ix.__getitem__, ends[d])) for ix, d in zip(index, split)]
    if all(list(map(operator.sub, h, lo_)) == [1] * m for h, lo_ in zip(hi, lo)):  # each chunk one cell
        distinct = len(set(zip(*lo)))
        return distinct < cells, distinct < m
    if cells > MAX_COVER_CELLS:
        raise FormatError(f"a chunk layout too irregular to check ({m} chunks over {cells} grid cells)")
    seen: dict[tuple[int, ...], int] = {}
    painted = 0
    for box in zip(*lo, *hi):
        k = len(split)
        spans = [range(box[j], box[k + j]) for j in range(k)]
        size = 1
        for r in spans:
            size *= len(r)
        painted += size
        if painted > MAX_COVER_CELLS:
            raise FormatError(f"a chunk layout too irregular to check ({m} chunks over {cells} grid cells)")
        for cell in product(*spans):
            seen[cell] = seen.get(cell, 0) + 1
    return len(seen) < cells, painted > len(seen)


# Megatron-Core torch_dist: a transformer block's layers are saved as one tensor per parameter with a leading layer
# dimension (``decoder.layers.self_attention.linear_qkv.weight`` of shape (num_layers, ...)); a name whose part
# after ``decoder.layers.`` starts with a digit is one layer's own tensor (older, unstacked checkpoints).
MEGATRON_STACKED_RE = re.compile(r"^((?:.+\.)?decoder\.layers\.)(?!\d+\.)(.+)$")


# megatron-core >= 0.19's common state: a ShardedObject("common_state", ..., (1,), (0,)), saved under its unique key
MEGATRON_COMMON_RE = re.compile(r"^common_state/shard_\d+(?:\.\d+)*_\d+(?:\.\d+)*$")


def is_megatron_dist(folder: Location) -> bool:
    """A Megatron-Core ``dist_checkpointing`` folder: its ``metadata.json`` names the torch_dist backend."""
    import json

    try:
        with open_read(as_path(folder) / "metadata.json") as f:
            meta = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("sharded_backend") == "torch_dist"


def megatron_stacked(info: DcpInfo) -> dict[str, tuple[str, str, int]]:
    """Stacked layer tensors of a Megatron-Core torch_dist checkpoint: key -> (prefix, rest, number of layers),
    the per-layer names being ``prefix + str(i) + "." + rest``: the checkpoint's own keys, one per layer
    (``dist_checkpointing.load`` into megatron's local layer spec maps its ``input_layernorm.``/
    ``pre_mlp_layernorm.`` onto ``self_attention.linear_qkv.layer_norm_``/``mlp.linear_fc1.layer_norm_``)."""
    out = {}
    for t in info.tensors:
        m = MEGATRON_STACKED_RE.match(t.name)
        if m and t.shape:
            out[t.name] = (m.group(1), m.group(2), int(t.shape[0]))
    return out


def chunk_layout(info: DcpInfo) -> dict[str, tuple[int, int]]:
    """tensor -> (distinct chunk offsets, the most of them sharing one ``offset[:1]``), folded or from the offsets."""
    out = dict(info.chunk_layout)
    for key, offsets in info.chunk_offsets.items():
        uniq = set(offsets)
        per_first: dict[tuple[int, ...], int] = {}
        for o in uniq:
            per_first[o[:1]] = per_first.get(o[:1], 0) + 1
        out[key] = (len(uniq), max(per_first.values(), default=0))
    return out


# Megatron-Core's tensor-parallel linear layers, and which of the weight's two dimensions tensor parallelism splits:
# ColumnParallelLinear (linear_qkv, linear_fc1) its output rows, RowParallelLinear (linear_proj, linear_fc2) its input
# columns — as the 0.16 and 0.19 saves' .metadata place the chunks (TP=2: linear_qkv.weight (2, 192, 64) at row
# offsets 0 and 96 of each layer, linear_proj.weight (2, 64, 64) at column offsets 0 and 32). Counted from the end of
# the shape, so a stacked tensor's leading layer axis (decoder.layers.…) is never taken for a split. The model's own
# keys only: a distributed optimizer's state (optimizer.state.…) is split by its flattened ranges, not by TP.
MEGATRON_TP_SPLIT = {
    "self_attention.linear_qkv.weight": -2,
    "mlp.linear_fc1.weight": -2,
    "self_attention.linear_proj.weight": -1,
    "mlp.linear_fc2.weight": -1,
}
_MEGATRON_TP_RE = re.compile(
    r"^(?!optimizer\.)(?:.+\.)?(self_attention\.linear_(?:qkv|proj)|mlp\.linear_fc[12])\.weight$"
)


def megatron_tp_split(key: str) -> Optional[int]:
    """The dimension (from the end) along which tensor parallelism splits the Megatron-Core weight ``key``, or None
    for a tensor it does not split that way."""
    m = _MEGATRON_TP_RE.match(key)
    return MEGATRON_TP_SPLIT[m.group(1) + ".weight"] if m else None


def megatron_tensor_parallel(info: DcpInfo) -> Optional[int]:
    """The tensor-parallel size, from the chunk offsets of the weight dimensions: the distinct offsets along the
    dimension tensor parallelism splits of Megatron's tensor-parallel linear weights (:data:`MEGATRON_TP_SPLIT`;
    megatron writes each shard once, replicas deduplicated). Where there are none (another layer spec's names): the
    most chunks one layer of one tensor has."""
    best = 0
    for t in info.tensors:
        d = megatron_tp_split(t.name)
        if d is None or len(t.shape) < 2:
            continue
        offsets = info.tp_offsets.get(t.name) or set(info.chunk_offsets.get(t.name) or ())
        best = max(best, len({o[d] for o in offsets if len(o) == len(t.shape)}))
    if best:
        return best
    stacked = megatron_stacked(info)
    for key, (distinct, per_layer) in chunk_layout(info).items():
        best = max(best, per_layer if key in stacked else distinct)
    return best or None


def ranks_of(files: Iterable[str]) -> set[int]:
    out = set()
    for f in files:
        m = SHARD_RE.match(f)
        if m:
            out.add(int(m.group(1)))
    return out
