"""A DCP ``.metadata`` pickle with its per-chunk and per-storage records taken out before unpickling.

A 1,024-rank checkpoint of a large model holds ~10^6 ``ChunkStorageMetadata`` records and as many
``storage_data`` entries (a ``MetadataIndex`` key, a ``_StorageInfo`` value). Pickled by torch they are
byte-regular: every record after the first of its kind refers to its class, its keys and ``torch.Size``
through the memo, and carries only small ints and, for a storage entry, a name and a path. Unpickling them
builds ~16 M objects that the pickle memo keeps alive until the end — most of the time and memory of reading
the file.

:func:`compact` matches those records with regular expressions (C-level passes, one frame at a time) and
takes their facts from the matched bytes (:class:`StreamFacts`); in the stream it leaves only what keeps
every memo slot in place (``None`` in each slot a record filled; a record's new strings stay themselves), so
every other reference in the stream still resolves:

- a run of chunk records leaves one int in its tensor's ``chunks`` list, the run's number, which the reader
  folds with the run's facts;
- a storage entry leaves nothing in ``storage_data``; the first entry of each path reference leaves
  ``(path, reference)`` there, so the reader learns what the reference names.

The result is read by the same restricted unpickler (the same allowlist of globals: the rewrite adds no
global and removes only records' bytes). A record that does not have exactly the expected shape is left as it
is and read the ordinary way. The first rewritten record of each kind also leaves its class and key references
for the reader to check, so a stream of another shape reads the slower way rather than wrongly.
"""

from __future__ import annotations

import operator
import pickle
import re
from collections import Counter
from itertools import compress, repeat
from typing import Callable, Literal, Optional

_PROTO4 = b"\x80\x04"
_FRAME = 0x95

_REF = rb"(?:h.|j....)"  # BINGET / LONG_BINGET: a memo reference
_INT = rb"(?:K.|M..|J....|" + b"|".join(b"\\x8a" + b"\\x%02x" % n + b"." * n for n in range(1, 9)) + rb")"
# a printable-ASCII SHORT_BINUNICODE and its MEMOIZE. Its length byte is not matched against the text: in a stream
# a pickler wrote, the MEMOIZE follows the text at once and cannot be in it; a stream made to mislead can state
# any facts it likes anyway, and the rewrite never lets it run anything (the same restricted unpickler reads it).
_LIT_AHEAD = rb"\x8c[\x01-\x7f][ -~]+(?=\x94)"
_LIT = _LIT_AHEAD + rb"\x94"
_KEY = rb"(?:" + _REF + b"|" + _LIT + rb")"
_TUP = rb"(?:" + _INT + rb"\x85|" + _INT + rb"{2}\x86|" + _INT + rb"{3}\x87|\(" + _INT + rb"+t)"
_SIZE_TAIL = rb"\x94\x85\x94R\x94"  # the tuple memoized, TUPLE1, REDUCE (torch.Size(tuple)) memoized
_NEW = rb"\)\x81\x94\}\x94\("  # EMPTY_TUPLE NEWOBJ MEMOIZE, EMPTY_DICT MEMOIZE, MARK
_CHUNK_FILL = b"N" + b"\x94" * 8 + b"0"  # NONE, MEMOIZE x8, POP: a chunk record's 8 memo slots, nothing left

# The first regular record of each kind is found with a general pattern (any memo references); the rest are
# matched with a pattern specialised to that record's references (its class, its keys, torch.Size: the same memo
# slots for every record of the stream), which leaves only the numbers, a name and a path to capture.
# fmt: off
# (one line per record the pattern matches, as the stream lays them out)
CHUNK_RE = re.compile(
    rb"(" + _REF + rb")" + _NEW
    + rb"(" + _REF + rb")(" + _REF + rb")" + _TUP + _SIZE_TAIL
    + rb"(" + _REF + rb")(" + _REF + rb")" + _TUP + _SIZE_TAIL + rb"ub",
    re.DOTALL)
STORAGE_RE = re.compile(
    rb"(" + _REF + rb")" + _NEW
    + rb"(" + _REF + rb")" + _KEY + rb"(" + _REF + rb")(?:" + _INT + rb"|N)"
    + rb"(" + _REF + rb")(" + _REF + rb")" + _TUP + _SIZE_TAIL + rb"ub"
    + rb"(" + _REF + rb")" + _NEW
    + rb"(" + _REF + rb")" + _KEY + rb"(" + _REF + rb")" + _INT + rb"(" + _REF + rb")" + _INT + rb"ub",
    re.DOTALL)
# fmt: on
_STORAGE_KEY = b"\x8c\x0cstorage_data\x94"
_NEVER = re.compile(rb"(?!)")  # matches nothing: the records of a kind left as they are

# what the first rewritten record of each kind leaves for the reader to check (with its classes):
CHUNK_CHECK = ("offsets", tuple, "sizes", tuple)  # a 5-tuple item: (class, "offsets", torch.Size, "sizes", torch.Size)
STORAGE_CHECK = ("fqn", "index", "offset", "relative_path", "offset", "length")  # an 8-tuple key, items 1-3 and 5-7


def _chunk_pattern(found: re.Match[bytes]) -> tuple[re.Pattern[bytes], bytes]:
    """The pattern for the chunk records that share ``found``'s references: groups 1 the first offset (one int),
    2 the other offsets and the tuple's opcode, 3 the sizes; and the check item (a tuple of the references)."""
    cls, ko, size_cls, ks, size_cls2 = found.groups()
    e = re.escape
    pattern = re.compile(
        e(cls)
        + _NEW
        + e(ko + size_cls)
        + rb"("
        + _INT
        + rb")(\x85|"
        + _INT
        + rb"\x86|"
        + _INT
        + rb"{2}\x87)"
        + _SIZE_TAIL
        + e(ks + size_cls2)
        + rb"("
        + _TUP
        + rb")"
        + _SIZE_TAIL
        + rb"ub",
        re.DOTALL,
    )
    return pattern, b"(" + cls + ko + size_cls + ks + size_cls2 + b"t"


def _storage_pattern(found: re.Match[bytes]) -> tuple[re.Pattern[bytes], bytes]:
    """The pattern for the storage entries that share ``found``'s references: group 1 ``\\x94`` where the fqn is a
    new string, else empty; 2 the path (a new string or a reference); 3 the offset; 4 the length. And the check
    key (a tuple of the references), with its value None."""
    icls, kf, ki, kof, size_cls, scls, kr, ko, kl = found.groups()
    e = re.escape
    pattern = re.compile(
        e(icls)
        + _NEW
        + e(kf)
        + rb"(?:"
        + _LIT_AHEAD
        + b"|"
        + _REF
        + rb")(\x94?)"
        + e(ki)
        + rb"(?:"
        + _INT
        + rb"|N)"
        + e(kof)
        + e(size_cls)
        + _TUP
        + _SIZE_TAIL
        + rb"ub"
        + e(scls)
        + _NEW
        + e(kr)
        + rb"("
        + _LIT
        + b"|"
        + _REF
        + rb")"
        + e(ko)
        + rb"("
        + _INT
        + rb")"
        + e(kl)
        + rb"("
        + _INT
        + rb")ub",
        re.DOTALL,
    )
    return pattern, b"(" + icls + kf + ki + kof + scls + kr + ko + kl + b"tN"


# ---- pickled ints and int tuples, as the pickler writes them -------------------------------------------------


def encode_int(v: int) -> bytes:
    """The opcode and argument a pickler writes for ``v`` (BININT1/BININT2/BININT/LONG1)."""
    return pickle.dumps(int(v), 2)[2:-1]


_TUPLE_OP = {1: b"\x85", 2: b"\x86", 3: b"\x87"}


def encode_offsets(offsets: tuple[int, ...]) -> tuple[bytes, bytes]:
    """(first, rest) of an offsets tuple as the chunk pattern captures it (any other length: a form of its own)."""
    toks = [encode_int(v) for v in offsets]
    if not toks:
        return b"", b")"
    op = _TUPLE_OP.get(len(toks))
    return toks[0], b"".join(toks[1:]) + op if op else b"(" + b"".join(toks[1:]) + b"t"


def encode_sizes(sizes: tuple[int, ...]) -> bytes:
    toks = b"".join(encode_int(v) for v in sizes)
    op = _TUPLE_OP.get(len(sizes))
    return b")" if not sizes else toks + op if op else b"(" + toks + b"t"


def decode_ints(tok: bytes) -> tuple[int, ...]:
    """The ints of pickled int opcodes (a tuple's opcode or mark, if any, ignored)."""
    out, i, n = [], 0, len(tok)
    while i < n:
        op = tok[i]
        if op == 0x4B:
            out.append(tok[i + 1])
            i += 2
        elif op == 0x4D:
            out.append(int.from_bytes(tok[i + 1 : i + 3], "little"))
            i += 3
        elif op == 0x4A:
            out.append(int.from_bytes(tok[i + 1 : i + 5], "little", signed=True))
            i += 5
        elif op == 0x8A:
            k = tok[i + 1]
            out.append(int.from_bytes(tok[i + 2 : i + 2 + k], "little", signed=True))
            i += 2 + k
        else:  # \x85 \x86 \x87 t ( )
            i += 1
    return tuple(out)


_KMJ = {0x4B, 0x4D, 0x4A}
LITTLE: Literal["little"] = "little"  # int.from_bytes' byte order, as map() passes it


def _ints(toks: list[bytes]) -> list[int]:
    """Decode single pickled ints in C-level passes where every one is a BININT1/BININT2/BININT of a value below
    2**31 (each token read whole as a little-endian number: its opcode is the low byte); one at a time otherwise
    (a LONG1, a negative BININT)."""
    whole = list(map(int.from_bytes, toks, repeat(LITTLE)))
    if set(map(operator.and_, whole, repeat(0xFF))) <= _KMJ:
        vals = list(map(operator.rshift, whole, repeat(8)))
        if max(vals, default=0) < 1 << 31:
            return vals
    return [decode_ints(t)[0] for t in toks]


# ---- the facts the rewritten records leave behind --------------------------------------------------------------


# one run of chunk records: their (first offsets, other offsets, sizes) tokens
Run = tuple[list[bytes], list[bytes], list[bytes]]


class StreamFacts:
    """What the rewritten records say, gathered from their bytes.

    Chunk records: ``runs[i]`` is the (first offsets, other offsets, sizes) tokens of run ``i`` (consecutive records
    of one tensor's list). Storage entries: for each path token (a new string, or a reference to one) the largest
    offset + length of its entries, and the references the unpickler resolves."""

    def __init__(self) -> None:
        self.runs: list[Optional[Run]] = []  # a run is None once its tensor has read it
        self.ends: dict[bytes, int] = {}  # path token -> furthest end
        self.refs: set[bytes] = set()  # reference tokens whose path the unpickler resolves
        self.negative = False  # an entry with a negative offset or length (corrupt: the reader says so)

    def add_storage(self, paths: list[bytes], offsets_: list[bytes], lengths_: list[bytes]) -> list[int]:
        """Fold one frame's entries; the indexes of the entries to patch: the first of each new reference."""
        offsets, lengths = _ints(offsets_), _ints(lengths_)
        if min(offsets, default=0) < 0 or min(lengths, default=0) < 0:
            self.negative = True
        ends = list(map(operator.add, offsets, lengths))
        last = dict(zip(paths, ends))
        if any(map(operator.gt, ends, map(last.__getitem__, paths))):  # a path's last entry is not its furthest
            last = {}
            for p, end in zip(paths, ends):
                if end > last.get(p, -1):
                    last[p] = end
        get = self.ends.get
        for p, end in last.items():
            if end > get(p, -1):
                self.ends[p] = end
        new = [p for p in last if p[0] != 0x8C and p not in self.refs]  # references not seen before
        if not new:
            return []
        self.refs.update(new)
        first = dict(zip(reversed(paths), range(len(paths) - 1, -1, -1)))
        return [first[p] for p in new]

    def files(self, resolved: dict[bytes, str]) -> dict[str, int]:
        """path -> furthest end, once the references are resolved (``resolved``: reference token -> path)."""
        out: dict[str, int] = {}
        for tok, end in self.ends.items():
            if tok[0] == 0x8C:
                path = tok[2:-1].decode("ascii")
                if len(path) != tok[1]:
                    raise ValueError("a path whose length is not its text's")
            else:
                path = resolved[tok]
            if end > out.get(path, -1):
                out[path] = end
        return out


_ZERO = encode_int(0)


class ChunkFold:
    """One tensor's chunk records folded: how many, the distinct offsets, the dimensions split, and the most
    distinct offsets sharing one first coordinate — from their pickled tokens (``first``, ``rest`` and ``sizes``
    lists in the same order; :func:`encode_offsets`/:func:`encode_sizes` for records read the ordinary way)."""

    def __init__(self, size: tuple[int, ...], first: list[bytes], rest: list[bytes], sizes: list[bytes]) -> None:
        self.count = len(first)
        self._first, self._rest, self._sizes = first, rest, sizes
        nd = len(size)
        firsts = set(first)
        uniq: set[tuple[bytes, bytes]] = set()  # the distinct (first, rest), where some first is shared
        if len(firsts) == len(first):  # each record its own first coordinate: every offset distinct
            self.distinct = len(first)
        else:
            uniq = set(zip(first, rest))
            self.distinct = len(uniq)
        rests = {r: decode_ints(r) for r in set(rest)}
        szs = {s: decode_ints(s) for s in set(sizes)}
        dims: set[int] = set()
        if (
            nd
            and set(map(len, rests.values())) <= {nd - 1}
            and set(map(len, szs.values())) <= {nd}
            and b"" not in firsts
        ):
            if firsts - {_ZERO}:
                dims.add(0)
            for rv in rests.values():
                dims.update(d + 1 for d, v in enumerate(rv) if v)
            for sv in szs.values():
                dims.update(d for d, v in enumerate(sv) if v != size[d])
        else:  # ragged records, or a 0-d tensor: the general rule, one chunk at a time
            for f, r, s in zip(first, rest, sizes):
                o = decode_ints(f) + rests[r]
                for d, (a, b) in enumerate(zip(o, szs[s])):
                    if nd > d and (a != 0 or b != size[d]):
                        dims.add(d)
        self.split_dims = dims
        if not self.distinct:
            self.per_first = 0
        elif nd == 0:
            self.per_first = self.distinct  # every offset is ()
        elif len(firsts) == self.distinct:
            self.per_first = 1
        else:
            self.per_first = max(Counter(map(operator.itemgetter(0), uniq)).values())

    @property
    def offsets(self) -> set[tuple[int, ...]]:
        """The distinct offsets, decoded (merging rank-local metadata files needs them)."""
        return {decode_ints(f) + decode_ints(r) for f, r in set(zip(self._first, self._rest))}

    def records(self) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """The records' (first offset, other offsets, sizes) tokens, in order (the tiling check decodes them)."""
        return self._first, self._rest, self._sizes

    def release(self) -> None:
        self._first = self._rest = self._sizes = []


# ---- the rewrite -------------------------------------------------------------------------------------------------


def frames(data: bytes) -> Optional[list[tuple[int, int]]]:
    """The (start, end) of each FRAME's payload in a protocol-4/5 pickle, or None for a stream that is not framed
    throughout (an unframed large object between frames: left to the ordinary reader)."""
    if len(data) < 11 or data[:2] not in (b"\x80\x04", b"\x80\x05") or data[2] != _FRAME:
        return None
    out = []
    pos, end = 2, len(data)
    while pos < end:
        if data[pos] != _FRAME or pos + 9 > end:
            return None
        n = int.from_bytes(data[pos + 1 : pos + 9], "little")
        if pos + 9 + n > end:
            return None
        out.append((pos + 9, pos + 9 + n))
        pos += 9 + n
    return out


class _Kind:
    """One kind of record: found first with the general pattern, then matched with the specialised one."""

    def __init__(
        self,
        general: re.Pattern[bytes],
        specialise: Callable[[re.Match[bytes]], tuple[re.Pattern[bytes], bytes]],
        facts: StreamFacts,
    ) -> None:
        self.general, self.specialise, self.facts = general, specialise, facts
        self.pattern: Optional[re.Pattern[bytes]] = None
        self.check = b""
        self.count = 0

    def fill(self, parts: list[bytes], n: int, k: int) -> list[bytes]:
        """The rewritten pieces of ``parts`` (``pattern.split``: ``n`` matches of ``k - 1`` groups each)."""
        raise NotImplementedError

    def rewrite(self, buf: memoryview) -> bytes:
        if self.pattern is None:
            found = self.general.search(buf)
            if found is None:
                return bytes(buf)
            self.pattern, self.check = self.specialise(found)
        parts = self.pattern.split(buf)
        k = self.pattern.groups + 1
        n = (len(parts) - 1) // k
        if not n:
            return bytes(buf)
        out = self.fill(parts, n, k)  # the text before each match, what the match leaves; the text after the last
        if self.check:
            out[1] = self.check + out[1]
            self.check = b""
        self.count += n
        return b"".join(out)


class _Chunks(_Kind):
    def fill(self, parts: list[bytes], n: int, k: int) -> list[bytes]:
        """Each record leaves its memo slots; each run (records with nothing between them but the list's
        ``APPENDS``/``MARK``) leaves its number, after its first record."""
        out = [_CHUNK_FILL] * (2 * n + 1)
        out[0::2] = parts[0::k]
        texts = parts[0 : k * n : k]  # the text before each match
        starts = [i for i in compress(range(n), texts) if texts[i] != b"e("]
        if not starts or starts[0] != 0:
            starts.insert(0, 0)
        first, rest, sizes = parts[1::k], parts[2::k], parts[3::k]
        runs = self.facts.runs
        for a, b in zip(starts, starts[1:] + [n]):
            out[2 * a + 1] = _CHUNK_FILL + b"J" + len(runs).to_bytes(4, "little")
            runs.append((first[a:b], rest[a:b], sizes[a:b]))
        return out


_STORAGE_FILL = b"N" + b"\x94" * 7


class _Storage(_Kind):
    def fill(self, parts: list[bytes], n: int, k: int) -> list[bytes]:
        """Each entry leaves its memo slots (7, and the fqn's where it is a new string) and pushes and pops its
        path (a new string keeps its slot); the first entry of each new path reference leaves
        ``(path, reference token)`` in ``storage_data`` instead of popping it."""
        out = [b"0"] * (6 * n + 1)  # per match: its text, the fill, the fqn's MEMOIZE, POP, the path, POP
        out[0::6] = parts[0::k]
        out[1::6] = [_STORAGE_FILL] * n
        out[2::6] = parts[1::k]
        paths = parts[2::k]
        out[4::6] = paths
        for i in self.facts.add_storage(paths, parts[3::k], parts[4::k]):
            tok = paths[i]
            out[6 * i + 5] = b"C" + bytes([len(tok)]) + tok + b"\x86N"
        return out


def compact(
    data: bytes, on_frames: Optional[Callable[[int, int], None]] = None, chunks: bool = True
) -> tuple[list[bytes], int, int, Optional[StreamFacts]]:
    """(the rewritten stream in pieces, chunk records rewritten, storage entries rewritten, their facts);
    ``[data]`` as it is, no facts, where the stream is not one this applies to (not framed protocol 4/5).

    Each frame is rewritten on its own (a record across two frames is left as it is) and framed again: the C
    unpickler reads a frame per call of the file's ``read``, not an opcode per call. ``on_frames(bytes done,
    bytes in all)`` is called ~64 times (progress; a cancel check may raise there). ``chunks=False`` leaves the
    chunk records as they are (for a stream whose chunk records refer to one another)."""
    spans = frames(data)
    if spans is None:
        return [data], 0, 0, None
    split = data.rfind(_STORAGE_KEY)
    if split < 0:
        split = len(data)
    facts = StreamFacts()
    chunk_kind = _Chunks(CHUNK_RE if chunks else _NEVER, _chunk_pattern, facts)
    storage = _Storage(STORAGE_RE, _storage_pattern, facts)
    view = memoryview(data)
    out = [data[:2]]
    try:
        shown = 0
        for lo, hi in spans:
            if on_frames is not None and lo - shown >= len(data) // 64:  # ~64 reports in all
                shown = lo
                on_frames(lo, len(data))
            if hi <= split:
                piece = chunk_kind.rewrite(view[lo:hi])
            elif lo >= split:
                piece = storage.rewrite(view[lo:hi])
            else:
                piece = chunk_kind.rewrite(view[lo:split]) + storage.rewrite(view[split:hi])
            out.append(bytes([_FRAME]) + len(piece).to_bytes(8, "little"))
            out.append(piece)
    finally:
        view.release()
    return out, chunk_kind.count, storage.count, facts
