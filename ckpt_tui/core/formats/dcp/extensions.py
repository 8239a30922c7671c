"""torch DCP's storage extensions (``FileSystemWriter(path, _extensions=[ZStandard()])``): what ckpt-tui reads of
them, and the bounds it reads them under.

A storage entry of ``.metadata`` lists its ``transform_descriptors`` (``["stream.zstd/1"]``): its bytes in the
``.distcp`` file are the item's torch.save bytes passed through each extension. torch's reader undoes ZStandard
with the ``zstandard`` module (ckpt-tui's dependency) or ``pyzstd``; without either it raises deep in a load. Here:

- :func:`problem` says, in one line, why a folder's extensions cannot be read here (none importable, or an
  extension torch has no reader for), before anything is loaded;
- :func:`decompress` undoes ZStandard for the small objects ckpt-tui reads itself (the optimizer's
  hyper-parameters), never past a bound: a crafted entry that inflates without end (a compression bomb) is refused
  when the bound is passed, not after memory ran out;
- :class:`BoundedTransforms` puts the same kind of bound under torch's own reader, per item: a tensor's item
  inflates to its declared chunk's bytes and a zip's few records, no more.
"""

from __future__ import annotations

import io
from typing import Any, Iterable, Optional

from ...safetext import visible
from .. import FormatError

ZSTD = "stream.zstd"
INSTALL = "pip install 'zstandard>=0.22'"
# what a torch.save zip adds around a tensor's bytes (records, data.pkl, the central directory), generously
ZIP_SLACK = 1 << 20
MAX_OBJECT = 64 << 20  # a BytesIO item (a param-group hyper-parameter, a list of names) larger than this is refused
READ = 4 << 20  # bytes asked of a decompressor at a time


def names(transforms: Iterable[tuple[str, ...]]) -> set[str]:
    """The extensions' registry names among a folder's storage entries' descriptors (``stream.zstd``)."""
    return {d.partition("/")[0] for t in transforms for d in t}


def zstd_importable() -> bool:
    """Can torch's ZStandard extension decompress here (``zstandard`` or ``pyzstd``, as torch looks for them)?"""
    for module in ("zstandard", "pyzstd"):
        try:
            __import__(module)
            return True
        except ImportError:
            continue
    return False


def problem(transforms: Iterable[tuple[str, ...]]) -> Optional[str]:
    """Why the items of a folder with these descriptors cannot be read here; None where they can."""
    found = names(transforms)
    unknown = sorted(found - {ZSTD})
    if unknown:
        shown = ", ".join(f"`{visible(n)}`" for n in unknown[:4])
        return f"its items are encoded by a torch DCP extension ckpt-tui does not read ({shown}; it reads `{ZSTD}`)"
    if ZSTD in found and not zstd_importable():
        return (
            "its items are zstd-compressed (torch's ZStandard extension) and neither `zstandard` (a ckpt-tui "
            f"dependency) nor `pyzstd` can be imported here: {INSTALL}"
        )
    return None


def decompress(raw: bytes, descriptors: tuple[str, ...], limit: int, what: str) -> bytes:
    """``raw`` with its extensions undone: one ZStandard stream, inflated to at most ``limit`` bytes (FormatError
    past it, on a stream that is cut short or corrupt, and on any other extension)."""
    if [d.partition("/")[0] for d in descriptors] != [ZSTD]:
        raise FormatError(f"{what}: stored with the extensions {visible(list(descriptors))}, which are not read")
    reason = problem([descriptors])
    if reason is not None:
        raise FormatError(f"{what}: {reason}")
    return read_bounded(_zstd_reader(io.BytesIO(raw)), limit, what)


def _zstd_reader(raw: Any) -> Any:
    try:
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw)
    except ImportError:
        import pyzstd  # type: ignore[import-not-found]

        return pyzstd.ZstdFile(raw, mode="rb")


def read_bounded(stream: Any, limit: int, what: str) -> bytes:
    """Everything ``stream`` gives, refused (FormatError) once it passes ``limit`` bytes."""
    pieces: list[bytes] = []
    done = 0
    while True:
        try:
            piece = stream.read(READ)
        except FormatError:
            raise
        except Exception as e:  # noqa: BLE001 - zstandard.ZstdError, pyzstd's, OSError: corrupt or cut short
            raise FormatError(f"{what}: its zstd stream cannot be decompressed ({visible(e)})") from None
        if not piece:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # one copy, at the end
        pieces.append(piece)
        done += len(piece)
        if done > limit:
            raise FormatError(
                f"{what}: its zstd stream inflates past {limit:,} bytes, more than the item can hold "
                "(a compression bomb?): not read further"
            )


class _Bounded(io.RawIOBase):
    """A decompressing stream torch reads, refused once it passes its item's bound."""

    def __init__(self, inner: Any, limit: int, what: str) -> None:
        self.inner, self.limit, self.what, self.done = inner, limit, what, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        piece = self.inner.read(min(len(view), READ))
        n = len(piece)
        self.done += n
        if self.done > self.limit:
            raise FormatError(
                f"{self.what}: its zstd stream inflates past {self.limit:,} bytes, more than the item can hold "
                "(a compression bomb?): not read further"
            )
        view[:n] = piece
        return n

    def read(self, size: Optional[int] = -1) -> bytes:
        if size is None or size < 0:  # torch's read(-1): everything, joined once
            data = read_bounded(self.inner, self.limit - self.done, self.what)
            self.done += len(data)
            return data
        piece: bytes = self.inner.read(min(size, READ))
        self.done += len(piece)
        if self.done > self.limit:
            raise FormatError(
                f"{self.what}: its zstd stream inflates past {self.limit:,} bytes, more than the item can hold "
                "(a compression bomb?): not read further"
            )
        return piece


class BoundedTransforms:
    """torch's ``_StorageReaderTransforms`` with each decompressing stream bounded by what its item can hold:
    ``bound(read_item)`` (a tensor chunk's bytes and a zip's slack; the object bound for a BytesIO item)."""

    def __init__(self, inner: Any, bound: Any) -> None:
        self.inner, self.bound = inner, bound

    def transform_load_stream(self, read_item: Any, transform_descriptors: Any, raw_stream: Any) -> Any:
        stream = self.inner.transform_load_stream(read_item, transform_descriptors, raw_stream)
        if not transform_descriptors:
            return stream  # the raw slice itself: its length is the entry's
        fqn = getattr(getattr(read_item, "storage_index", None), "fqn", "an item")
        return _Bounded(stream, self.bound(read_item), f"`{visible(str(fqn))}`")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
