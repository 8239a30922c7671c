"""safetensors files and their index: the JSON header only.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data block.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..dtypes import FROM_ST_CODE
from ..storage import as_path, open_read
from ..storage import size as storage_size
from ..types import TensorInfo
from . import FormatError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_INDEX_BYTES = 64 * 1024 * 1024


@dataclass
class SafetensorsHeader:
    path: Path
    size: int
    header_len: int
    tensors: list[TensorInfo]
    offsets: dict[str, tuple[int, int]]
    metadata: dict = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len


def read_header(path: Path) -> SafetensorsHeader:
    path = as_path(path)
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
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise FormatError("__metadata__ is not a JSON object")
    data_len = size - 8 - n
    tensors: list[TensorInfo] = []
    offsets: dict[str, tuple[int, int]] = {}
    spans = []
    for name, entry in header.items():
        try:
            dt = entry["dtype"]
            shape = tuple(int(x) for x in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"header entry {name!r} lacks dtype/shape/data_offsets") from None
        if dt not in FROM_ST_CODE:
            raise FormatError(f"tensor {name!r} has unknown dtype {dt!r}")
        tname, item = FROM_ST_CODE[dt]
        if any(d < 0 for d in shape) or begin < 0 or end < begin:
            raise FormatError(f"tensor {name!r} has a negative shape or inverted offsets")
        numel = 1
        for d in shape:
            numel *= d
        if numel * item != end - begin:
            raise FormatError(f"tensor {name!r}: shape {list(shape)} × {dt} needs {numel * item} bytes, "
                              f"offsets give {end - begin}")
        if end > data_len:
            raise FormatError(f"tensor {name!r} ends at byte {end} of the data block, which has {data_len}: "
                              "the file is truncated", "truncated")
        spans.append((begin, end, name))
        tensors.append(TensorInfo(name, shape, tname, end - begin))
        offsets[name] = (begin, end)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"tensors {n0!r} and {n1!r} overlap in the data block")
    end = max((e for _, e, _ in spans), default=0)
    if end != data_len:
        # safetensors requires the tensors to cover the data block exactly ("incomplete buffer")
        raise FormatError(f"the tensors cover {end} bytes of a {data_len}-byte data block: the header length or "
                          "the offsets are wrong")
    return SafetensorsHeader(path, size, n, tensors, offsets, metadata)


def read_index(path: Path) -> dict:
    """A ``*.safetensors.index.json`` (or ``pytorch_model.bin.index.json``): {"weight_map": {...}, "metadata": {...}}."""
    path = as_path(path)
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
