"""torch.save files: the zip directory and data.pkl only, through the restricted unpickler.

A torch zip holds ``<archive>/data.pkl`` (the object graph), ``<archive>/data/<key>``
(one stored, uncompressed entry per storage), ``byteorder`` and ``version``. We read
the central directory and data.pkl; tensor bytes are never read.
"""

from __future__ import annotations

import pickle as _pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

from ...names import STATE_DICT_WRAPPERS
from ...storage import Location, LocationLike, as_path, file_size, open_read
from ...storage import size as storage_size
from .. import FormatError
from ..unpickle import MAX_PICKLE_BYTES, Unpickled, iter_tensors, safe_loads

PICKLE_MAGICS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


@dataclass
class TorchFile:
    path: Location
    size: int
    unpickled: Unpickled
    is_zip: bool
    data_bytes: int  # bytes of tensor storage in the file

    @property
    def obj(self) -> Any:
        return self.unpickled.obj

    @property
    def unsafe(self) -> set[str]:
        return self.unpickled.unsafe


COMPOSER_MODEL = "state.model"  # where composer's checkpoint keeps the model's state dict


def is_composer(obj: Any) -> bool:
    """A checkpoint composer's Trainer saved (``ep0-ba2-rank0.pt``): its ``state`` holds the model's state dict beside
    the optimizers, the timestamp and the run's metadata."""
    state = obj.get("state") if isinstance(obj, dict) else None
    return (
        isinstance(state, dict)
        and isinstance(state.get("model"), dict)
        and any(True for _ in iter_tensors(state["model"]))
        and ("timestamp" in state or "optimizers" in state)
    )


def dig(obj: Any, wrapper: Optional[str]) -> Any:
    """The entry ``wrapper`` names in ``obj`` (a key, or composer's dotted ``state.model``)."""
    if not wrapper:
        return obj
    if wrapper == COMPOSER_MODEL:
        return obj["state"]["model"]
    return obj[wrapper]


def pick_state_dict(obj: Any) -> tuple[Any, Optional[str]]:
    """The model's state dict inside a torch file: the first of STATE_DICT_WRAPPERS (Lightning's
    ``state_dict``, DeepSpeed's ``module``, Megatron's ``model``...) that holds tensors, and its key;
    else the object itself and None."""
    if isinstance(obj, dict):
        if is_composer(obj):  # composer's Trainer: {"state": {"model": ..., "optimizers": ..., ...}, "rng": ...}
            return obj["state"]["model"], COMPOSER_MODEL
        for w in STATE_DICT_WRAPPERS:
            inner = obj.get(w)
            if isinstance(inner, dict) and any(True for _ in iter_tensors(inner)):
                return inner, w
    return obj, None


def sniff(path: LocationLike) -> str:
    """'zip' | 'pickle' | 'other' from the first bytes."""
    try:
        with open_read(path) as f:
            head = f.read(4)
    except OSError:
        return "other"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head[:2] in PICKLE_MAGICS:
        return "pickle"
    return "other"


def read(where: LocationLike) -> TorchFile:
    """Read a torch file's structure. Raises FormatError (kind 'truncated' or 'corrupt')."""
    path = as_path(where)
    size = storage_size(path)
    if size == 0:
        raise FormatError("the file is empty (0 bytes)", "truncated")
    kind = sniff(path)
    if kind == "zip":
        return _read_zip(path, size)
    if kind == "pickle":
        return _read_legacy(path, size)
    raise FormatError("not a torch file (neither a zip archive nor a pickle)")


def _read_zip(path: Location, size: int) -> TorchFile:
    try:
        zf = zipfile.ZipFile(path if isinstance(path, Path) else open_read(path))  # remote: ranged GETs
    except zipfile.BadZipFile:
        # starts like a zip but has no end-of-central-directory record: cut short while being written
        raise FormatError(
            f"zip archive without its central directory (file is {size} bytes): "
            "the file was cut short, most likely by an interrupted save",
            "truncated",
        ) from None
    except (OSError, ValueError, NotImplementedError, EOFError, UnicodeDecodeError, Exception) as e:
        # a corrupt directory can make zipfile raise almost anything (e.g. "zip file version 25.5")
        raise FormatError(f"unreadable zip archive: {type(e).__name__}: {e}") from None
    with zf:
        infos = zf.infolist()
        info, prefix = loader_record(infos)
        data_bytes = 0
        for i in infos:
            # local header (30 bytes + name + extra) + data must fit inside the file
            if i.header_offset + 30 + len(i.filename) + i.compress_size > size:
                raise FormatError(
                    f"entry {i.filename} runs past the end of the file ({size} bytes): truncated", "truncated"
                )
            if i.filename.startswith(prefix + "data/"):
                data_bytes += i.file_size
        if info.file_size > MAX_PICKLE_BYTES:
            raise FormatError(f"data.pkl of {info.file_size} bytes exceeds the {MAX_PICKLE_BYTES} byte limit")
        try:
            data = zf.read(info)
        except Exception as e:  # BadZipFile, zlib.error, NotImplementedError, EOFError, ...
            raise FormatError(f"cannot read data.pkl: {type(e).__name__}: {e}") from None
        up = safe_loads(data, persistent=True)
        names = {i.filename for i in infos}
        missing = [k for k in up.storages if f"{prefix}data/{k}" not in names]
        if missing:
            raise FormatError(
                f"{len(missing)} tensor storage(s) named in data.pkl are missing from the archive "
                f"(e.g. data/{missing[0]})"
            )
        return TorchFile(path, size, up, True, data_bytes)


def _raw_name(i: zipfile.ZipInfo) -> str:
    """An entry's name as stored (zipfile cuts a name at its first NUL; torch's reader does not)."""
    return i.orig_filename


def loader_record(infos: list[zipfile.ZipInfo]) -> tuple[zipfile.ZipInfo, str]:
    """The ``data.pkl`` entry torch.load will unpickle, and the archive's folder (``P/``): torch's
    PyTorchStreamReader takes ``P`` from the first entry's name (up to its first ``/``) and reads ``P/data.pkl``.
    An archive where another reader could take another record is refused (FormatError): an entry outside ``P/``,
    a name that appears twice, a second ``data.pkl`` anywhere, or a name with a NUL (zipfile and torch would read
    different names). torch.save writes none of these, so no real file is refused."""
    if not infos:
        raise FormatError("zip archive without entries: not a torch.save file")
    first = _raw_name(infos[0])
    if "/" not in first:
        raise FormatError(
            f"zip archive whose first entry {first!r} is in no folder: not a torch.save file (torch.load refuses it)"
        )
    prefix = first.split("/", 1)[0] + "/"
    seen: set[str] = set()
    pkls = []
    for i in infos:
        name = _raw_name(i)
        if "\x00" in name or name != i.filename:
            raise FormatError(f"zip entry name {name!r} holds a NUL byte: refused, readers would disagree on it")
        if name in seen:
            raise FormatError(
                f"zip archive names {name!r} twice: which copy a reader takes is its own choice, so "
                "the file is refused before anything unpickles it"
            )
        seen.add(name)
        if not name.startswith(prefix):
            raise FormatError(
                f"zip entry {name!r} lies outside the archive's folder {prefix!r}: refused (torch.save "
                "writes every entry there)"
            )
        if name == "data.pkl" or name.endswith("/data.pkl"):
            pkls.append(i)
    if not pkls:
        raise FormatError("zip archive without data.pkl: not a torch.save file")
    if len(pkls) > 1 or _raw_name(pkls[0]) != prefix + "data.pkl":
        names = ", ".join(_raw_name(i) for i in pkls[:4])
        raise FormatError(
            f"zip archive with {len(pkls)} data.pkl entries ({names}); torch.load reads only "
            f"{prefix}data.pkl: refused before anything unpickles it"
        )
    return pkls[0], prefix


def _read_legacy(path: Location, size: int) -> TorchFile:
    """Legacy (pre-1.6) torch.save format or a plain pickle: structure only."""
    if size > MAX_PICKLE_BYTES:
        # legacy torch files put tensor data after the pickles; read only the head
        with open_read(path) as f:
            data = f.read(MAX_PICKLE_BYTES)
    else:
        data = path.read_bytes()
    up = _legacy_loads(data)
    return TorchFile(path, size, up, False, 0)


def _legacy_loads(data: bytes) -> Unpickled:
    import io

    from ..unpickle import RestrictedUnpickler
    from ..unpickle import Unpickled as U

    # legacy torch: magic number, protocol version, sys info, then the object pickle with persistent ids
    f = io.BytesIO(data)
    result = U(None)
    try:
        first = _PlainUnpickler(f)  # the header pickles are plain ints/dicts
        magic = first.load()
        if isinstance(magic, int) and magic == 0x1950A86A20F9469CFC6C:
            first.load()  # protocol version
            first.load()  # sys info
            result.obj = RestrictedUnpickler(f, result, True).load()
        else:
            f.seek(0)
            result.obj = RestrictedUnpickler(f, result, False).load()
    except EOFError:
        raise FormatError("pickle ends early", "truncated") from None
    except FormatError:
        raise
    except Exception as e:
        raise FormatError(f"not a readable pickle: {type(e).__name__}: {e}") from None
    return result


class _PlainUnpickler(_pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise FormatError(f"unexpected global {module}.{name} in a torch file header")


def try_read(path: LocationLike) -> tuple[Optional[TorchFile], Optional[FormatError]]:
    try:
        return read(path), None
    except FormatError as e:
        return None, e


def storage_offsets(path: LocationLike, base: int = 0, length: Optional[int] = None) -> dict[str, tuple[int, int]]:
    """Absolute file offset and size of every ``data/<key>`` entry of a torch zip.

    ``base``/``length`` select a zip embedded in a larger file (a DCP ``.distcp`` holds one
    torch.save blob per chunk). Entries are stored uncompressed, so tensor bytes can be copied by
    offset without unpickling anything.
    """
    import struct

    out: dict[str, tuple[int, int]] = {}
    with open_read(path) as f:
        src = FileWindow(f, base, length if length is not None else file_size(f) - base)
        try:
            zf = zipfile.ZipFile(src)
        except Exception as e:  # a corrupt directory: any zipfile error
            raise FormatError(f"unreadable zip archive: {type(e).__name__}: {e}") from None
        with zf:
            for i in zf.infolist():
                if "/data/" not in i.filename and not i.filename.startswith("data/"):
                    continue
                if i.compress_type != zipfile.ZIP_STORED:
                    raise FormatError(f"{i.filename} is compressed; expected a stored entry")
                f.seek(base + i.header_offset)
                hdr = f.read(30)
                if len(hdr) < 30 or hdr[:4] != b"PK\x03\x04":
                    raise FormatError(f"bad local header for {i.filename}", "corrupt")
                name_len, extra_len = struct.unpack("<HH", hdr[26:30])
                start = base + i.header_offset + 30 + name_len + extra_len
                out[i.filename.rsplit("/", 1)[-1]] = (start, i.file_size)
    return out


class FileWindow:
    """A read-only, seekable view of [base, base+length) of an open file."""

    def __init__(self, f: BinaryIO, base: int, length: int) -> None:
        self.f, self.base, self.length, self.pos = f, base, length, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else self.length + off
        return self.pos

    def read(self, n: Optional[int] = -1) -> bytes:
        if n is None or n < 0:
            n = self.length - self.pos
        n = max(0, min(n, self.length - self.pos))
        self.f.seek(self.base + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data
