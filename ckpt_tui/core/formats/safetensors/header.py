"""safetensors files and their index: the JSON header only.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data block.
"""

from __future__ import annotations

import gc
import json
import struct
from collections import Counter
from functools import cached_property
from itertools import chain, repeat
from math import prod
from operator import itemgetter, mul, sub
from typing import Any, NoReturn, Optional, Union

from ...dtypes import FROM_ST_CODE
from ...storage import Location, LocationLike, as_path, open_read
from ...storage import size as storage_size
from ...types import TensorInfo
from .. import FormatError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_INDEX_BYTES = 64 * 1024 * 1024


class SafetensorsHeader:
    """A validated header, kept as columns (a name, torch dtype, shape and offsets per tensor, in the header's order):
    ``tensors`` and ``offsets`` are built when first asked for, ``totals()`` without either (inspect of a header of
    10^6 tensors builds no per-tensor object)."""

    def __init__(
        self,
        path: Location,
        size: int,
        header_len: int,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        begins: list[int],
        ends: list[int],
        metadata: Optional[dict[str, str]] = None,
    ) -> None:
        self.path, self.size, self.header_len = path, size, header_len
        self.names, self.dtypes, self.shapes, self.begins, self.ends = names, dtypes, shapes, begins, ends
        self.metadata = metadata or {}

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @cached_property
    def tensors(self) -> list[TensorInfo]:
        return list(map(TensorInfo, self.names, map(tuple, self.shapes), self.dtypes, map(sub, self.ends, self.begins)))

    @cached_property
    def offsets(self) -> dict[str, tuple[int, int]]:
        return dict(zip(self.names, zip(self.begins, self.ends)))

    def totals(self) -> tuple[int, int, list[str], int]:
        """(elements, bytes, dtypes most frequent first, tensors): what ``set_tensor_facts`` makes of ``tensors``."""
        counts = Counter(self.dtypes)
        return (
            sum(map(prod, self.shapes)),
            sum(self.ends) - sum(self.begins),
            sorted(counts, key=lambda d: -counts[d]),
            len(self.names),
        )


# Every dtype the safetensors library (0.8) knows, and its bits per element: a header naming another is refused by
# the library, so it is corrupt here too. The ones ckpt-tui has no torch dtype for (FROM_ST_CODE) are valid headers
# it cannot list (kind "unreadable", not "corrupt").
ST_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
_U64 = 1 << 64  # the library reads offsets and dims as usize: a JSON int, 0 <= x < 2**64
_FIELDS = ("dtype", "shape", "data_offsets")
_NEG_ZERO = -0.0  # what "-0" parses to here: a float, as the library's JSON reader sees it


def read_header(path: LocationLike) -> SafetensorsHeader:
    """The header, validated as strictly as the safetensors library's own reader (``safe_open``): a header it
    would refuse raises FormatError, so nothing it cannot read is ever exported or verified.

    A header of 10^6 tensors builds ~10^7 objects and no cycles: the cyclic GC, run every 700 allocations, would
    walk them again and again (three quarters of the time). It is paused while the header is read."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _read_header(as_path(path))
    finally:
        if was:
            gc.enable()


def _read_header(path: Location) -> SafetensorsHeader:
    size = storage_size(path)
    if size < 8:
        raise FormatError(f"file is {size} bytes, shorter than the 8-byte safetensors header length", "truncated")
    with open_read(path) as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise FormatError(f"header length {n} exceeds the {MAX_HEADER_BYTES} byte limit: the header is corrupt")
        if 8 + n > size:
            raise FormatError(f"header says {n} bytes of JSON but the file has only {size - 8}", "truncated")
        raw = f.read(n)
    header = _parse(raw)
    if "__metadata__" in header:
        metadata = header.pop("__metadata__")
        if metadata is None:
            metadata = {}
        elif not isinstance(metadata, dict) or set(map(type, metadata.values())) - {str}:
            raise FormatError("__metadata__ is not a map of strings to strings (safetensors refuses it)")
    else:
        metadata = {}
    return SafetensorsHeader(path, size, n, *_tensors(header, size - 8 - n), metadata)


def _parse(raw: bytes) -> dict[str, Any]:
    """The JSON header as the library's reader (serde_json) takes it: UTF-8 only, no NaN/Infinity, ``-0`` a float,
    a tensor's field or ``__metadata__`` given twice refused (any other duplicate key: the last one wins, in both)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"header is not valid JSON (not UTF-8: {e})") from None
    kw: dict[str, Any] = {"parse_constant": _no_constant}
    if b"-0" in raw:
        kw["parse_int"] = _int_or_neg_zero
    try:
        header = json.loads(text, **kw)
        if isinstance(header, dict) and not _no_duplicates_possible(raw, header):
            dups: dict[int, set[str]] = {}
            header = json.loads(text, object_pairs_hook=lambda pairs: _pairs(pairs, dups), **kw)
            _check_duplicates(header, dups)
    except (json.JSONDecodeError, RecursionError) as e:
        raise FormatError(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    if b"\\u" in raw:  # an escape can make a lone surrogate, which the library's reader refuses
        try:
            json.dumps(header, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError("header holds a string with a lone UTF-16 surrogate escape") from None
    return header


def _no_constant(name: str) -> NoReturn:
    raise FormatError(f"header is not valid JSON: {name} is not a JSON number")


def _int_or_neg_zero(text: str) -> Union[int, float]:
    return _NEG_ZERO if text == "-0" else int(text)


def _no_duplicates_possible(raw: bytes, header: dict[str, Any]) -> bool:
    """Each field named once per entry and ``__metadata__`` at most once, by counting the names in the text (any
    other spelling, a name inside a string or a duplicate tensor name: read again with the duplicate check)."""
    n = len(header) - ("__metadata__" in header)
    return (
        raw.count(b'"dtype"') == raw.count(b'"shape"') == raw.count(b'"data_offsets"') == n
        and raw.count(b'"__metadata__"') <= 1
    )


def _pairs(pairs: list[tuple[str, Any]], dups: dict[int, set[str]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        twice: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                twice.add(k)
            seen.add(k)
        dups[id(d)] = twice
    return d


def _check_duplicates(header: dict[str, Any], dups: dict[int, set[str]]) -> None:
    if "__metadata__" in dups.get(id(header), ()):
        raise FormatError("header names __metadata__ twice (safetensors refuses it)")
    for name, e in header.items():
        if name != "__metadata__" and isinstance(e, dict) and dups.get(id(e), set()) & set(_FIELDS):
            raise FormatError(f"header entry {name!r} names a field twice (safetensors refuses it)")


def _entry(name: str, e: object) -> tuple[Any, Any, Any]:
    """(dtype, shape, data_offsets) of one entry: an object with those fields (others ignored) or, as the library
    also reads it, an array of the three."""
    if isinstance(e, dict):
        try:
            return e["dtype"], e["shape"], e["data_offsets"]
        except KeyError:
            pass
    elif isinstance(e, list) and len(e) == 3:
        return e[0], e[1], e[2]
    raise FormatError(f"header entry {name!r} lacks dtype/shape/data_offsets")


def _is_u64(x: object) -> bool:
    return type(x) is int and 0 <= x < _U64


def _check_entry(name: str, e: object) -> tuple[str, list[int], int, int]:
    """One entry checked alone, with a message naming what is wrong (the slow path, taken only for a header the
    fast checks refused, or one in another form)."""
    dt, shape, offs = _entry(name, e)
    if type(dt) is not str or dt not in ST_BITS:
        raise FormatError(f"tensor {name!r} has unknown dtype {dt!r}")
    if type(shape) is not list or not all(map(_is_u64, shape)):
        raise FormatError(f"tensor {name!r} has a shape that is not a list of non-negative integers: {shape!r}")
    if type(offs) is not list or len(offs) != 2 or not all(map(_is_u64, offs)):
        raise FormatError(f"tensor {name!r} has data_offsets that are not two non-negative integers: {offs!r}")
    numel = 1
    for d in shape:
        numel *= d
        if numel >= _U64:
            raise FormatError(f"tensor {name!r}: shape {shape} overflows the element count")
    bits = numel * ST_BITS[dt]
    begin, end = offs
    if bits >= _U64 or bits % 8:
        raise FormatError(f"tensor {name!r}: shape {shape} × {dt} is not a whole number of bytes")
    if end < begin:
        raise FormatError(f"tensor {name!r} has inverted offsets {offs}")
    if bits // 8 != end - begin:
        raise FormatError(f"tensor {name!r}: shape {shape} × {dt} needs {bits // 8} bytes, offsets give {end - begin}")
    return dt, shape, begin, end


def _columns(header: dict[str, Any]) -> Optional[tuple[list[str], list[list[int]], list[int], list[int]]]:
    """(dtypes, shapes, begins, ends) of every entry in C-level passes, or None where any entry is not plainly valid
    (then each is checked alone, for the message)."""
    entries = list(header.values())
    if set(map(type, entries)) - {dict}:
        return None
    try:
        dtypes = list(map(itemgetter("dtype"), entries))
        shapes = list(map(itemgetter("shape"), entries))
        offs = list(map(itemgetter("data_offsets"), entries))
    except KeyError:
        return None
    if (
        set(map(type, dtypes)) - {str}
        or set(dtypes) - set(ST_BITS)
        or set(map(type, shapes)) - {list}
        or set(map(type, offs)) - {list}
        or set(map(len, offs)) - {2}
    ):
        return None
    begins = list(map(itemgetter(0), offs))
    ends = list(map(itemgetter(1), offs))
    dims = list(chain.from_iterable(shapes))
    ints = begins + ends + dims
    if ints and (set(map(type, ints)) - {int} or min(ints) < 0 or max(ints) >= _U64):
        return None
    numels = list(map(prod, shapes))
    if numels and max(numels) >= _U64 or 0 in numels and any(max(s, default=0) >= 1 << 32 for s in shapes):
        return None  # an element count past usize, or (with a 0 dimension) one that may overflow on the way
    bits = list(map(mul, numels, map(ST_BITS.__getitem__, dtypes)))
    lengths = list(map(sub, ends, begins))
    if bits and max(bits) >= _U64 or list(map(mul, lengths, repeat(8))) != bits:
        return None  # also a sub-byte dtype's partial last byte, and inverted offsets (a negative length)
    return dtypes, shapes, begins, ends


def _tensors(
    header: dict[str, Any], data_len: int
) -> tuple[list[str], list[str], list[list[int]], list[int], list[int]]:
    """(names, torch dtypes, shapes, begins, ends) of a header's tensors, checked as the library checks them."""
    names = list(header)
    cols = _columns(header)
    if cols is None:
        checked = [_check_entry(name, e) for name, e in header.items()]
        cols = (
            ([c[0] for c in checked], [c[1] for c in checked], [c[2] for c in checked], [c[3] for c in checked])
            if checked
            else ([], [], [], [])
        )
    dtypes, shapes, begins, ends = cols
    # the library sorts the tensors by (begin, end): each must start where the one before it ended. Contiguous in
    # the header's own order (what writers do) is contiguous sorted: no sort
    if begins[:1] in ([], [0]) and begins[1:] == ends[:-1]:
        order, starts, stops = None, begins, ends
    else:
        order = sorted(range(len(names)), key=list(zip(begins, ends)).__getitem__)
        starts = [begins[i] for i in order]
        stops = [ends[i] for i in order]
    if starts and starts[0] != 0 or starts[1:] != stops[:-1]:
        assert order is not None
        at = next(k for k in range(len(order)) if starts[k] != (stops[k - 1] if k else 0))
        name, before = names[order[at]], names[order[at - 1]] if at else None
        if before is not None and starts[at] < stops[at - 1]:
            raise FormatError(f"tensors {before!r} and {name!r} overlap in the data block")
        what = f"after {before!r} ends at byte {stops[at - 1]}" if before is not None else "at the start"
        raise FormatError(f"the data block has a hole {what}: {name!r} starts at byte {starts[at]}")
    end = stops[-1] if stops else 0
    if end > data_len:
        last = names[-1 if order is None else order[-1]]
        raise FormatError(
            f"tensor {last!r} ends at byte {end} of the data block, which has {data_len}: the file is truncated",
            "truncated",
        )
    if end != data_len:
        # safetensors requires the tensors to cover the data block exactly ("incomplete buffer")
        raise FormatError(
            f"the tensors cover {end} bytes of a {data_len}-byte data block: the header length or the offsets are wrong"
        )
    unread = set(dtypes) - set(FROM_ST_CODE)
    if unread:
        raise FormatError(
            f"dtype {', '.join(sorted(unread))} (valid safetensors) has no torch dtype ckpt-tui reads", "unreadable"
        )
    return names, list(map(_TORCH_NAME.__getitem__, dtypes)), shapes, begins, ends


_TORCH_NAME = {code: name for code, (name, _) in FROM_ST_CODE.items()}


def read_index(where: LocationLike) -> dict[str, Any]:
    """A ``*.safetensors.index.json`` (or ``pytorch_model.bin.index.json``): {"weight_map": {...}, "metadata": {...}}."""
    path = as_path(where)
    size = storage_size(path)
    if size > MAX_INDEX_BYTES:
        raise FormatError(f"index of {size} bytes exceeds the {MAX_INDEX_BYTES} byte limit")
    try:
        doc = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"index is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise FormatError("index has no weight_map object")
    return doc
