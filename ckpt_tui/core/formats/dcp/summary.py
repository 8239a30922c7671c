"""DCP's summary reader: a ``.metadata`` unpickled by the allowlist (:mod:`..unpickle`), its per-chunk records
folded as they arrive instead of built one object each (a 1,024-rank checkpoint holds ~10^6 of them).

:class:`DcpSummaryUnpickler` is the restricted unpickler with shared stand-ins for the chunk, index and storage
records; :func:`load_dcp_summary` runs it over a stream :mod:`.stream` may have compacted, and raises
:class:`SummaryMismatch` when the stream is not shaped the way it folds (then it is read the general way).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any, Callable, Optional, Union

from ...progress import Cancelled
from .. import FormatError
from ..unpickle import Readable, Record, RestrictedUnpickler, Stub, Unpickled, gc_paused, release_in_slices
from .stream import CHUNK_CHECK, STORAGE_CHECK, ChunkFold, Run, StreamFacts, encode_offsets, encode_sizes


class SummaryMismatch(Exception):
    """The stream is not shaped the way :class:`DcpSummaryUnpickler` folds it: read it the general way."""


_CHUNK = "torch.distributed.checkpoint.metadata.ChunkStorageMetadata"
_INDEX = "torch.distributed.checkpoint.metadata.MetadataIndex"
_STORAGE_INFO = "torch.distributed.checkpoint.filesystem._StorageInfo"
_TENSOR_MD = "torch.distributed.checkpoint.metadata.TensorStorageMetadata"


def _singleton_class(qualname: str, setstate: Callable[[Any], object]) -> type:
    """A class whose every NEWOBJ gives one shared instance and whose BUILD calls ``setstate`` — both C
    callables (a bound ``dict.get`` and a bound ``list.append``), so the C unpickler builds a record without
    calling back into Python and without keeping an object per record."""
    cls = type(qualname.rsplit(".", 1)[-1], (), {"__slots__": (), "_qualname": qualname, "__setstate__": setstate})
    inst: object = object.__new__(cls)
    setattr(cls, "__new__", staticmethod({cls: inst}.get))  # noqa: B010 - mypy refuses assigning a class's method
    return cls


class TupleFold:
    """One tensor's chunk records read the ordinary way (offsets and sizes as tuples), folded as :class:`ChunkFold`
    folds rewritten ones: how many, the distinct offsets, the dimensions split, the most distinct offsets sharing
    one first coordinate."""

    def __init__(self, size: tuple[int, ...], offs: list[tuple[int, ...]], sizes: list[tuple[int, ...]]) -> None:
        uniq = set(offs)
        usz = set(sizes)
        dims: set[int] = set()
        nd = len(size)
        if (
            set(map(len, uniq)) <= {nd}
            and set(map(len, usz)) <= {nd}
            and set(map(type, uniq)) | set(map(type, usz)) <= {tuple}
        ):
            if uniq:
                for d, col in enumerate(zip(*uniq)):
                    if any(col):
                        dims.add(d)
            if usz:
                for d, col in enumerate(zip(*usz)):
                    if d not in dims and col.count(size[d]) != len(col):
                        dims.add(d)
        else:  # ragged records: the general rule, one chunk at a time
            for o, z in zip(offs, sizes):
                for d, (a, b) in enumerate(zip(o, z)):
                    if nd > d and (a != 0 or b != size[d]):
                        dims.add(d)
        self.count, self.offsets, self.distinct, self.split_dims = len(offs), uniq, len(uniq), dims
        self._records = (offs, sizes)  # every record's offsets and sizes, in order (the tiling check)
        if not uniq:
            self.per_first = 0
        elif nd == 0 or set(map(len, uniq)) != {nd}:
            self.per_first = max(Counter(map(_FIRST, uniq)).values())
        else:  # the first coordinates, without a 1-tuple each; most often all distinct (split on dim 0)
            firsts = list(map(_FIRST0, uniq))
            self.per_first = 1 if len(set(firsts)) == len(firsts) else max(Counter(firsts).values())

    def records(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        return self._records

    def release(self) -> None:
        self.offsets = set()
        self._records = ([], [])


ChunkSummary = (ChunkFold, TupleFold)  # a tensor's chunk records, folded (for isinstance)
Folded = Union[ChunkFold, TupleFold]  # the same, as a type


_OFFSETS = operator.itemgetter("offsets")
_SIZES = operator.itemgetter("sizes")
_FIRST = operator.itemgetter(slice(0, 1))
_FIRST0 = operator.itemgetter(0)


class DcpSummaryUnpickler(RestrictedUnpickler):
    """The restricted unpickler for a DCP ``.metadata``, folding its per-chunk records as they arrive.

    A 1,024-rank checkpoint of a large model holds ~10^6 chunk records and as many ``storage_data``
    entries; building each as a Python object is where the time goes. Here the chunk, index and storage
    records are shared stand-ins whose BUILD only appends the state to a list (all in C); each
    ``TensorStorageMetadata``'s BUILD (Python, once per tensor) folds its chunks into a
    :class:`ChunkSummary`, and ``storage_data`` collapses to one entry (its values' states are in
    ``storage_states``). Same allowlist and findings as :class:`RestrictedUnpickler`; any record out of the
    expected shape raises :class:`SummaryMismatch` so the caller reads the file the general way."""

    def __init__(self, f: Readable, result: Unpickled, runs: Optional[list[Optional[Run]]] = None) -> None:
        super().__init__(f, result, False)
        self.runs = runs if runs is not None else []  # the rewritten chunk runs' tokens (dcp_stream.StreamFacts)
        self.chunks_checked = False
        self.chunk_states: list[Any] = []
        self.storage_states: list[Any] = []
        self.index_states: list[Any] = []
        self.folded: list[Any] = []  # each tensor's chunk states, kept past the memo: see release_in_slices
        self._classes: dict[str, type] = {}
        self._fold: list[Callable[[Any, Any], None]] = [self._tensor_md]

    def find_class(self, module: str, name: str) -> Any:
        q = f"{module}.{name}"
        cls = self._classes.get(q)
        if cls is not None:
            return cls
        if q == _CHUNK:
            cls = _singleton_class(q, self.chunk_states.append)
        elif q == _STORAGE_INFO:
            cls = _singleton_class(q, self.storage_states.append)
        elif q == _INDEX:
            cls = _singleton_class(q, self.index_states.append)  # the keys of storage_data: not needed for facts
        elif q == _TENSOR_MD:
            fold = self._fold  # emptied after the load: the class outlives the unpickler, not the other way

            def setstate(inst: Any, state: Any) -> None:
                if not fold:
                    raise SummaryMismatch("TensorStorageMetadata built after the load")
                fold[0](inst, state)

            cls = type("TensorStorageMetadata", (Record,), {"_qualname": q, "__setstate__": setstate})
        else:
            return super().find_class(module, name)
        self._classes[q] = cls
        return cls

    def _tensor_md(self, inst: Any, state: Any) -> None:
        if not isinstance(state, dict):
            raise SummaryMismatch("TensorStorageMetadata state is not a dict")
        chunks = state.get("chunks")
        if not isinstance(chunks, list):
            raise SummaryMismatch("chunks is not a list")
        chunk_cls = self._classes.get(_CHUNK)
        pending = self.chunk_states  # records read the ordinary way (shared stand-ins), their states in order
        n = len(pending)
        if n and (chunk_cls is None or chunks.count(chunk_cls()) != n):
            raise SummaryMismatch("chunk records outside a tensor's chunk list")
        runs = [c for c in chunks if c.__class__ is int] if n != len(chunks) else []  # rewritten runs' numbers
        checks = [c for c in chunks if c.__class__ is tuple] if n + len(runs) != len(chunks) else []
        if checks:
            size_cls = self._functions.get("torch.Size")  # this read's own copy (CHUNK_CHECK says tuple)
            want = (chunk_cls, *(size_cls if x is tuple else x for x in CHUNK_CHECK))
            if checks != [want] or self.chunks_checked:
                raise SummaryMismatch("the rewritten chunk records are not ChunkStorageMetadata")
            self.chunks_checked = True
        if n + len(runs) + len(checks) != len(chunks) or (runs and not self.chunks_checked):
            raise SummaryMismatch("a chunk list holds something else")
        size = state.get("size")
        if size.__class__ is not tuple:  # None: a reference to a record the rewrite took out (dcp_stream)
            raise SummaryMismatch("a tensor's size is not a tuple")
        try:
            offs = list(map(_OFFSETS, pending))
            sizes = list(map(_SIZES, pending))
        except (TypeError, KeyError):
            raise SummaryMismatch("chunk record without offsets/sizes") from None
        if not runs:  # every record read the ordinary way: folded as tuples
            if None in offs or None in sizes:
                raise SummaryMismatch("a chunk record refers to one the rewrite took out")
            inst.__dict__.update(state)
            inst.__dict__["chunks"] = TupleFold(size, offs, sizes)
            self.folded.extend(pending)
            pending.clear()
            return
        try:  # a few records read the ordinary way (the first, those a frame cuts): as the rewritten runs' tokens
            pairs = list(map(encode_offsets, offs))
            first = [p[0] for p in pairs]
            rest = [p[1] for p in pairs]
            sizes = list(map(encode_sizes, sizes))
        except (TypeError, ValueError, OverflowError):
            raise SummaryMismatch("chunk record without offsets/sizes") from None
        table = self.runs
        for r in runs:
            run = table[r] if 0 <= r < len(table) else None
            if run is None:
                raise SummaryMismatch("a chunk run read twice")
            f, o, z = run
            table[r] = None
            first += f
            rest += o
            sizes += z
        inst.__dict__.update(state)
        inst.__dict__["chunks"] = ChunkFold(size, first, rest, sizes)
        self.folded.extend(pending)
        pending.clear()


def load_dcp_summary(f: Readable, facts: Optional[StreamFacts] = None) -> tuple[Unpickled, list[Any], dict[str, int]]:
    """Unpickle a DCP ``.metadata`` from the binary file object ``f`` with :class:`DcpSummaryUnpickler`: (the
    result, the ``_StorageInfo`` states read the ordinary way, ``{file: the furthest offset + length}`` of the
    entries compacted by :mod:`.stream`, whose facts it gathered in ``facts``). Raises SummaryMismatch (read
    it with :func:`safe_loads` instead) or FormatError."""
    result = Unpickled(None)
    up = DcpSummaryUnpickler(f, result, facts.runs if facts is not None else None)
    up.size_hint = sum(map(len, getattr(f, "_parts", ()) or ()))
    with gc_paused():
        try:
            result.obj = up.load()
        except (FormatError, SummaryMismatch, Cancelled):
            raise
        except Exception:  # anything else: let the general reader say what it is
            raise SummaryMismatch("not readable by the summary reader") from None
        finally:
            # the stand-in classes refer back to the unpickler (a cycle): break it so that its memo, which
            # holds every object the stream built, is freed now by reference counting, not by a full GC pass
            classes = dict(up._classes)
            up._classes.clear()
            up._fold.clear()
    if facts is not None and any(r is not None for r in facts.runs):
        # a rewritten run its tensor never read: its records sat inside another opcode's argument (a string),
        # where the rewrite may not reach; the stream is read as written instead
        raise SummaryMismatch("a rewritten chunk run that no tensor read")
    storage = up.storage_states
    files = _compacted_storage(result.obj, facts, classes)
    # The unpickler's memo holds every object the stream built; freeing them is one long C call that holds the
    # GIL. Keep the records' states past it, drop the unpickler (what is left in the memo goes), then free the
    # states in slices, so a UI thread gets its turns.
    keep = [up.chunk_states, up.index_states, up.folded]
    del up
    release_in_slices(keep)
    return result, storage, files


def _compacted_storage(meta: object, facts: Optional[StreamFacts], classes: dict[str, type]) -> dict[str, int]:
    """The files of the compacted storage entries: their references resolved by what the rewrite added to
    ``storage_data`` (the check of its references, a ``(path, reference token)`` key for each reference), which
    is then emptied (the ordinary entries' key and value are shared stand-ins: their states are read apart)."""
    sd = meta.__dict__.get("storage_data") if isinstance(meta, (Record, Stub)) else None
    if not isinstance(sd, dict):
        if facts is not None and facts.ends:
            raise SummaryMismatch("storage_data is not a dict")
        return {}
    added = [k for k in sd if k.__class__ is tuple]
    sd.clear()
    if facts is None or not facts.ends:
        if added:
            raise SummaryMismatch("storage_data keyed by tuples")
        return {}
    want = (classes.get(_INDEX), *STORAGE_CHECK[:3], classes.get(_STORAGE_INFO), *STORAGE_CHECK[3:])
    if [k for k in added if len(k) == 8] != [want]:
        raise SummaryMismatch("the compacted storage entries are not MetadataIndex -> _StorageInfo")
    resolved = {tok: path for path, tok in (k for k in added if len(k) == 2)}
    if facts.refs - resolved.keys() or set(map(type, resolved.values())) - {str}:
        raise SummaryMismatch("a storage path that is not a string")
    try:
        return facts.files(resolved)
    except (ValueError, UnicodeDecodeError):
        raise SummaryMismatch("a storage path out of shape") from None
