"""Add one key to the top-level dict of a torch zip file without unpickling anything.

The pickle stream (``<archive>/data.pkl``) gets a few plain opcodes inserted just before its final
STOP — push the key, push the value, SETITEM — so every other byte of the stream stays as it was:
no object is ever rebuilt in Python and written back (Lightning hyper-parameters, callbacks and
loops stay exactly what the framework wrote). The zip is then rebuilt the way torch's
``PyTorchFileWriter`` (miniz) lays it out: stored records, data descriptors, an ``FB`` extra field
padding each record's data to the archive's storage alignment (``.storage_alignment``, default 64),
zip64 end records. Every other record's data is copied byte for byte; their CRCs come from the
central directory and are re-checked while copying.
"""

from __future__ import annotations

import pickletools
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Optional

from ..formats.unpickle import safe_loads
from ..progress import check_cancel

U32 = 0xFFFFFFFF
LOCAL_SIG = 0x04034B50
CENTRAL_SIG = 0x02014B50
DESC_SIG = 0x08074B50
EOCD_SIG = 0x06054B50
EOCD64_SIG = 0x06064B50
LOC64_SIG = 0x07064B50
CHUNK = 8 << 20


class EditError(Exception):
    """The file cannot be edited this way; nothing was written."""


@dataclass
class Entry:
    name: bytes
    offset: int  # of the local header
    crc: int
    comp_size: int
    size: int
    method: int
    flags: int
    data_offset: int = 0


# ------------------------------------------------------------------ zip reading


def read_entries(f: BinaryIO, file_size: int) -> list[Entry]:
    """The central directory (zip64 aware), in its order."""
    tail_len = min(file_size, 65536 + 22)
    f.seek(file_size - tail_len)
    tail = f.read(tail_len)
    i = tail.rfind(struct.pack("<I", EOCD_SIG))
    if i < 0:
        raise EditError("not a zip file (no end-of-central-directory record)")
    (_, disk, cd_disk, n_disk, n, cd_size, cd_off, clen) = struct.unpack("<IHHHHIIH", tail[i : i + 22])
    if disk or cd_disk or n_disk != n:
        raise EditError("multi-disk zip archives are not supported")
    eocd_pos = file_size - tail_len + i
    if n == 0xFFFF or cd_off == U32 or cd_size == U32:
        loc = tail[i - 20 : i]
        if len(loc) != 20 or struct.unpack("<I", loc[:4])[0] != LOC64_SIG:
            raise EditError("zip64 end-of-central-directory locator missing")
        (_, _, e64_off, _) = struct.unpack("<IIQI", loc)
        f.seek(e64_off)
        e64 = f.read(56)
        if struct.unpack("<I", e64[:4])[0] != EOCD64_SIG:
            raise EditError("zip64 end-of-central-directory record missing")
        (_, _, _, _, _, _, _, n, cd_size, cd_off) = struct.unpack("<IQHHIIQQQQ", e64)
    if cd_off + cd_size > eocd_pos:
        raise EditError("central directory lies outside the file (truncated?)")
    f.seek(cd_off)
    cd = f.read(cd_size)
    out: list[Entry] = []
    p = 0
    for _ in range(n):
        if cd[p : p + 4] != struct.pack("<I", CENTRAL_SIG):
            raise EditError("corrupt central directory")
        (_, _, _, flags, method, _, _, crc, csize, usize, nl, el, cl, _, _, _, off) = struct.unpack(
            "<IHHHHHHIIIHHHHHII", cd[p : p + 46]
        )
        name = cd[p + 46 : p + 46 + nl]
        extra = cd[p + 46 + nl : p + 46 + nl + el]
        if usize == U32 or csize == U32 or off == U32:
            vals = _zip64_extra(extra)
            k = 0
            if usize == U32:
                usize = vals[k]
                k += 1
            if csize == U32:
                csize = vals[k]
                k += 1
            if off == U32:
                off = vals[k]
                k += 1
        out.append(Entry(name, off, crc, csize, usize, method, flags))
        p += 46 + nl + el + cl
    for e in out:
        f.seek(e.offset)
        lh = f.read(30)
        if len(lh) != 30 or struct.unpack("<I", lh[:4])[0] != LOCAL_SIG:
            raise EditError(f"corrupt local header for {e.name.decode(errors='replace')}")
        nl, el = struct.unpack("<HH", lh[26:30])
        e.data_offset = e.offset + 30 + nl + el
        if e.data_offset + e.comp_size > file_size:
            raise EditError(f"record {e.name.decode(errors='replace')} runs past the end of the file (truncated)")
    return out


def _zip64_extra(extra: bytes) -> list[int]:
    p = 0
    while p + 4 <= len(extra):
        hid, hl = struct.unpack("<HH", extra[p : p + 4])
        if hid == 1:
            body = extra[p + 4 : p + 4 + hl]
            return [struct.unpack("<Q", body[i : i + 8])[0] for i in range(0, len(body) - 7, 8)]
        p += 4 + hl
    raise EditError("zip64 sizes announced but no zip64 extra field")


# ------------------------------------------------------------------ pickle edit


def _op_binunicode(s: str) -> bytes:
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def encode_value(v: object) -> bytes:
    """Plain opcodes (protocol 2) for a small JSON-like value: dict/str/float/int/bool/None."""
    if v is None:
        return b"N"
    if v is True:
        return b"\x88"
    if v is False:
        return b"\x89"
    if isinstance(v, float):
        return b"G" + struct.pack(">d", v)
    if isinstance(v, int):
        if -(2**31) <= v < 2**31:
            return b"J" + struct.pack("<i", v)
        raise EditError("integer too large")
    if isinstance(v, str):
        return _op_binunicode(v)
    if isinstance(v, dict):
        out = b"}"
        for k, x in v.items():
            out += _op_binunicode(str(k)) + encode_value(x) + b"s"
        return out
    raise EditError(f"cannot encode {type(v).__name__}")


def add_top_level_key(pkl: bytes, key: str, value: object) -> bytes:
    """``pkl`` with ``top[key] = value`` set just before the final STOP. The top-level object must be
    a plain dict (checked with the restricted reader, which runs nothing)."""
    if len(pkl) < 3 or pkl[0] != 0x80 or pkl[1] < 2:
        raise EditError("data.pkl is not a protocol-2+ pickle")
    stop = None
    frames: list[tuple[int, int]] = []  # (position of FRAME opcode, length)
    try:
        for op, arg, pos in pickletools.genops(pkl):
            assert pos is not None  # genops over bytes knows every opcode's position
            if op.name == "FRAME":
                assert isinstance(arg, int)  # FRAME's argument: the frame's length
                frames.append((pos, arg))
            if op.name == "STOP":
                stop = pos
                break
    except Exception as e:  # noqa: BLE001 - a malformed stream
        raise EditError(f"data.pkl is not a valid pickle: {e}") from None
    if stop is None or stop != len(pkl) - 1:
        raise EditError("data.pkl has bytes after its STOP opcode")
    top = safe_loads(pkl, persistent=True).obj
    if type(top) is not dict:
        raise EditError(f"the top-level object is a {type(top).__name__}, not a plain dict")
    if key in top:
        raise EditError(f"key {key!r} already present")
    insert = _op_binunicode(key) + encode_value(value) + b"s"
    out = bytearray(pkl[:stop] + insert + pkl[stop:])
    if frames:
        fpos, flen = frames[-1]
        if fpos + 9 + flen < stop + 1:
            raise EditError("unexpected pickle framing")
        struct.pack_into("<Q", out, fpos + 1, flen + len(insert))
    return bytes(out)


# ------------------------------------------------------------------ zip writing (torch/miniz layout)


def _local_header(name: bytes, offset: int, size: int, align: int, flags: int) -> bytes:
    """A local header as PyTorchFileWriter writes it: sizes and CRC in the data descriptor, an
    ``FB`` extra field padding the data start to a multiple of ``align``."""
    z64 = b""
    if size >= U32 or offset >= U32:
        vals = []
        if size >= U32:
            vals += [size, size]
        if offset >= U32:
            vals.append(offset)
        z64 = struct.pack("<HH", 1, 8 * len(vals)) + b"".join(struct.pack("<Q", v) for v in vals)
    start = offset + 30 + len(name) + len(z64) + 4
    pad = (-start) % align
    extra = z64 + b"FB" + struct.pack("<H", pad) + b"Z" * pad
    csz = U32 if size >= U32 else 0
    hdr = struct.pack("<IHHHHHIIIHH", LOCAL_SIG, 0, flags, 0, 0, 0, 0, csz, csz, len(name), len(extra))
    return hdr + name + extra


def _descriptor(crc: int, size: int) -> bytes:
    if size >= U32:
        return struct.pack("<IIQQ", DESC_SIG, crc, size, size)
    return struct.pack("<IIII", DESC_SIG, crc, size, size)


def _central(name: bytes, offset: int, crc: int, size: int, flags: int) -> bytes:
    vals = []
    if size >= U32:
        vals += [size, size]
    if offset >= U32:
        vals.append(offset)
    extra = struct.pack("<HH", 1, 8 * len(vals)) + b"".join(struct.pack("<Q", v) for v in vals) if vals else b""
    s = U32 if size >= U32 else size
    o = U32 if offset >= U32 else offset
    return (
        struct.pack(
            "<IHHHHHHIIIHHHHHII", CENTRAL_SIG, 0, 0, flags, 0, 0, 0, crc, s, s, len(name), len(extra), 0, 0, 0, 0, o
        )
        + name
        + extra
    )


def _end_records(n: int, cd_off: int, cd_size: int) -> bytes:
    e64_off = cd_off + cd_size
    e64 = struct.pack("<IQHHIIQQQQ", EOCD64_SIG, 44, 0x031E, 0x2D, 0, 0, n, n, cd_size, cd_off)
    loc = struct.pack("<IIQI", LOC64_SIG, 0, e64_off, 1)
    eocd = struct.pack(
        "<IHHHHIIH", EOCD_SIG, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(cd_size, U32), min(cd_off, U32), 0
    )
    return e64 + loc + eocd


def storage_alignment(src: BinaryIO, entries: list[Entry]) -> int:
    for e in entries:
        if e.name.endswith(b"/.storage_alignment") and e.size < 32:
            src.seek(e.data_offset)
            try:
                v = int(src.read(e.size).decode().strip())
            except ValueError:
                break
            if 0 < v <= 1 << 20:
                return v
    return 64


def rewrite_zip(
    src: BinaryIO,
    entries: list[Entry],
    replacements: dict[bytes, bytes],
    dst: BinaryIO,
    on_bytes: Optional[Callable[[int], None]] = None,
    cancel: Optional[threading.Event] = None,
) -> int:
    """Write the archive to ``dst`` with ``replacements`` (record name -> new data); every other
    record's data is copied byte for byte, its CRC re-checked. Returns bytes written."""
    align = storage_alignment(src, entries)
    pos = 0
    central = []
    for e in entries:
        check_cancel(cancel)
        if e.method != 0:
            raise EditError(f"record {e.name.decode(errors='replace')} is compressed; torch writes stored records only")
        flags = e.flags & ~0x08
        if e.name in replacements:
            data = replacements[e.name]
            crc = zlib.crc32(data) & U32
            size = len(data)
        else:
            data = None
            crc, size = e.crc, e.size
        if size:  # miniz: sizes and CRC in a data descriptor, except for empty records
            flags |= 0x08
        hdr = _local_header(e.name, pos, size, align, flags)
        dst.write(hdr)
        central.append(_central(e.name, pos, crc, size, flags))
        pos += len(hdr)
        if data is not None:
            dst.write(data)
        else:
            src.seek(e.data_offset)
            left, c = size, 0
            while left:
                check_cancel(cancel)
                buf = src.read(min(CHUNK, left))
                if not buf:
                    raise EditError(f"{e.name.decode(errors='replace')}: file shorter than its zip directory says")
                c = zlib.crc32(buf, c)
                dst.write(buf)
                left -= len(buf)
                if on_bytes:
                    on_bytes(len(buf))
            if (c & U32) != e.crc:
                raise EditError(
                    f"record {e.name.decode(errors='replace')} fails its CRC check: the file is corrupt "
                    "or is being written"
                )
        pos += size
        if flags & 0x08:
            d = _descriptor(crc, size)
            dst.write(d)
            pos += len(d)
    cd = b"".join(central)
    dst.write(cd)
    dst.write(_end_records(len(entries), pos, len(cd)))
    return pos + len(cd) + 98


def pickle_entry(entries: list[Entry]) -> Entry:
    cands = [e for e in entries if e.name.endswith(b"/data.pkl") and e.name.count(b"/") == 1]
    if len(cands) != 1:
        raise EditError("not a torch zip file (no single <archive>/data.pkl record)")
    return cands[0]


def read_pickle(f: BinaryIO, e: Entry, limit: int = 512 << 20) -> bytes:
    if e.method != 0:
        raise EditError("data.pkl is compressed; torch writes stored records only")
    if e.size > limit:
        raise EditError(f"data.pkl is {e.size} bytes, larger than the {limit} byte limit")
    f.seek(e.data_offset)
    data = f.read(e.size)
    if len(data) != e.size or (zlib.crc32(data) & U32) != e.crc:
        raise EditError("data.pkl fails its CRC check (corrupt or being written)")
    return data
