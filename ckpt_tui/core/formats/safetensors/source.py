"""A safetensors file or index as an export source: each tensor one byte range of its file, from the header."""

from __future__ import annotations

from ...export.sources import ByteRange, Source, SourceTensor
from ...storage import LocationLike, as_path
from .. import FormatError
from ..unpickle import gc_paused
from . import header as stfmt


def safetensors_source(where: LocationLike) -> Source:
    """One safetensors file, or an index (``*.safetensors.index.json``) and its shards."""
    path = as_path(where)
    files = [path]
    if path.name.endswith(".index.json"):
        doc = stfmt.read_index(path)
        files = []
        for fn in sorted({str(v) for v in doc["weight_map"].values()}):
            fp = path.parent / fn
            if fp.resolve().parent != path.parent.resolve():
                raise FormatError(f"index points outside its folder: {fn}")
            files.append(fp)
    tensors = []
    for fp in files:
        h = stfmt.read_header(fp)  # its columns, not a TensorInfo per tensor (a header of 10^6 tensors)
        where, start = str(fp), h.data_start
        with gc_paused():  # no cyclic GC passes over 10^6 new objects (none is a cycle)
            for name, shape, dtype, b, e in zip(h.names, h.shapes, h.dtypes, h.begins, h.ends):
                rng = (ByteRange(where, start + b, e - b),) if e > b else ()
                tensors.append(SourceTensor(name, tuple(shape), dtype, ranges=rng))
    return Source("safetensors", path, tensors)
