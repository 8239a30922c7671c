"""Filesystem safety for every writer (export, conversion, repair): once, here.

- ``fsync_file`` / ``fsync_dir``: make written bytes and a rename durable.
- ``atomic_write`` / ``atomic_path``: nothing half-written carries a final name (temp file beside the
  destination, fsync, ``os.replace``, fsync of the folder).
- ``stamp`` / ``snapshot`` / ``changed``: did the source change while we read it (size, mtime,
  inode, device)?
- ``check_writable`` / ``check_space`` / ``check_output_folder``: output preflight (folder exists and
  is writable, not read-only, enough free space, output empty, not inside the source). They raise
  :class:`OutputError`, an ``OSError`` with the matching errno and a ``kind``; each writer says it
  in its own words.
"""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

from .storage import is_url
from .storage import stamp as remote_stamp

# ---------------------------------------------------------------------------------------------
# fsync


def fsync_file(path) -> None:
    """fsync a file that was written by path (by a library that does not hand out its descriptor)."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def fsync_dir(folder, *, best_effort: bool = False) -> None:
    """fsync a folder, so that a rename or a new entry in it survives a crash. ``best_effort``:
    ignore errors (used where the rename has already happened and failing would misreport it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not best_effort:
            raise
    finally:
        os.close(fd)


def write_synced(path, data: Union[bytes, str]) -> None:
    """Write ``data`` to ``path`` (a new file inside a private temp folder) and fsync it."""
    with open(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())


# ---------------------------------------------------------------------------------------------
# atomic write


def _umask_mode(fd: int) -> None:
    """mkstemp creates 0600 files; give ours the mode a plain open() would (0666 & ~umask)."""
    um = os.umask(0)
    os.umask(um)
    try:
        os.fchmod(fd, 0o666 & ~um)
    except OSError:
        pass


@contextmanager
def atomic_path(dest) -> Iterator[Path]:
    """Yield a temp path beside ``dest`` (``.<name>.XXXX.tmp``, the mode a plain open() gives) for
    the caller to write; when the block ends normally fsync it, ``os.replace`` it onto ``dest`` and
    fsync the folder. On any exception the temp file is removed and ``dest`` is untouched."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        _umask_mode(fd)
        os.close(fd)
        yield Path(tmp)
        fsync_file(tmp)
        os.replace(tmp, dest)
        fsync_dir(dest.parent, best_effort=True)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write(dest, data: Union[bytes, str]) -> Path:
    """Write ``data`` to ``dest`` atomically (see :func:`atomic_path`). Returns ``dest``."""
    with atomic_path(dest) as tmp:
        write_synced(tmp, data)
    return Path(dest)


# ---------------------------------------------------------------------------------------------
# did the source change


@dataclass(frozen=True)
class Stamp:
    size: int
    mtime_ns: int
    ino: int
    dev: int


def stamp(path) -> Optional[Stamp]:
    """Size, mtime, inode and device of ``path``; None if it does not exist."""
    if is_url(path):  # an object in object storage: size and mtime, asked afresh
        got = remote_stamp(path)
        return None if got is None else Stamp(got[0], got[1], 0, 0)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return Stamp(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def snapshot(paths: Iterable) -> dict[str, Optional[Stamp]]:
    """{path: stamp} for ``paths`` (None: missing or unreadable). To watch a folder's entries, pass
    its listing: a file added or removed then shows as a change too."""
    out: dict[str, Optional[Stamp]] = {}
    for p in paths:
        try:
            out[str(p)] = stamp(p)
        except OSError:
            out[str(p)] = None
    return out


def changed(before: dict, after: dict) -> list[str]:
    """Paths whose stamp differs between two snapshots (added and removed ones included)."""
    return [p for p in sorted(set(before) | set(after)) if before.get(p, "absent") != after.get(p, "absent")]


# ---------------------------------------------------------------------------------------------
# output preflight


class OutputError(OSError):
    """An output cannot be written there. ``kind``: missing · read-only · not-writable · no-space ·
    not-a-folder · not-empty · inside-source; ``errno`` matches it; ``free``/``need`` for no-space."""

    ERRNO = {"missing": errno.ENOENT, "read-only": errno.EROFS, "not-writable": errno.EACCES,
             "no-space": errno.ENOSPC, "not-a-folder": errno.ENOTDIR, "not-empty": errno.ENOTEMPTY,
             "inside-source": errno.EINVAL}

    def __init__(self, kind: str, path, *, free: Optional[int] = None, need: Optional[int] = None):
        super().__init__(self.ERRNO[kind], os.strerror(self.ERRNO[kind]), str(path))
        self.kind = kind
        self.path = Path(path)
        self.free = free
        self.need = need


def free_bytes(folder) -> int:
    """Bytes an unprivileged process may still write on ``folder``'s filesystem (raises OSError)."""
    vfs = os.statvfs(folder)
    return vfs.f_bavail * vfs.f_frsize


def check_writable(folder) -> None:
    """``folder`` exists, its filesystem is not read-only and we may create files in it."""
    try:
        vfs = os.statvfs(folder)
    except (FileNotFoundError, NotADirectoryError):
        raise OutputError("missing", folder) from None
    except PermissionError:
        raise OutputError("not-writable", folder) from None
    if not os.path.isdir(folder):
        raise OutputError("missing", folder)
    if vfs.f_flag & os.ST_RDONLY:
        raise OutputError("read-only", folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError("not-writable", folder)


def check_space(folder, need: int) -> None:
    """At least ``need`` bytes free on ``folder``'s filesystem (skipped where that cannot be read)."""
    try:
        free = free_bytes(folder)
    except OSError:
        return
    if free < need:
        raise OutputError("no-space", folder, free=free, need=need)


def inside(path, root) -> bool:
    """Is ``path`` ``root`` or below it (symlinks resolved)?"""
    try:
        p, r = Path(path).resolve(), Path(root).resolve()
    except (OSError, RuntimeError):
        p, r = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    return p == r or r in p.parents


def check_output_folder(out, *, overwrite: bool = False) -> None:
    """``out`` is absent or an empty folder (or any folder, with ``overwrite``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError("not-a-folder", out)
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise OutputError("not-empty", out)


def preflight_output(out, *, need: int = 0, source=None, overwrite: bool = False) -> None:
    """Everything a writer of a new output folder checks before it starts, in this order: not inside
    ``source``; absent or empty (see :func:`check_output_folder`); its parent exists and is
    writable; ``need`` bytes free there. Raises :class:`OutputError`."""
    out = Path(out)
    if source is not None and not is_url(source) and inside(out, source):
        raise OutputError("inside-source", out)
    check_output_folder(out, overwrite=overwrite)
    check_writable(out.parent)
    check_space(out.parent, need)
