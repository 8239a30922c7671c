"""Filesystem safety for every writer (export, conversion, repair): once, here.

- ``fsync_file`` / ``fsync_dir``: make written bytes and a rename durable.
- ``atomic_write`` / ``atomic_path``: nothing half-written carries a final name (temp file beside the
  destination, fsync, ``os.replace``, fsync of the folder).
- ``stamp`` / ``snapshot`` / ``changed``: did the source change while we read it (size, mtime,
  inode, device)?
- ``check_writable`` / ``check_space`` / ``check_output_folder``: output preflight (folder exists and
  is writable, not read-only, enough free space, output empty, not a source, holding none and not
  inside one: :func:`source_conflict`). They raise :class:`OutputError`, an ``OSError`` with the
  matching errno and a ``kind``; ``core/staging.py`` runs them for every writer and says each kind in
  one wording (its ``MESSAGES``).
- ``create_new`` / ``copy_new``: every file a writer creates is new (``O_CREAT|O_EXCL|O_NOFOLLOW``):
  nothing is ever written through a symbolic link planted under its name.
- ``regular_inside``: a side file (config, tokenizer) is copied only when it is a regular file whose
  real path lies inside the folder it was found in.
- ``owned_temp`` / ``sweep_stale``: a temp folder holds a lock for as long as its run lives; the next
  run removes those whose lock nobody holds (killed runs'), never a live run's.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat as _stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Union, cast

from .storage import LocationLike, is_url
from .storage import stamp as remote_stamp

StrPath = Union[str, "os.PathLike[str]"]  # a local path, as a string or a Path

# ---------------------------------------------------------------------------------------------
# fsync


def fsync_file(path: StrPath) -> None:
    """fsync a file that was written by path (by a library that does not hand out its descriptor)."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def fsync_dir(folder: StrPath, *, best_effort: bool = False) -> None:
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


NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def create_new(path: StrPath, mode: int = 0o644) -> int:
    """Open a new file ``path`` for writing (``O_CREAT|O_EXCL|O_NOFOLLOW``): FileExistsError where any
    entry, a symbolic link above all, already has that name. Returns the descriptor."""
    return os.open(path, NEW_FILE, mode)


def write_synced(path: StrPath, data: Union[bytes, str]) -> None:
    """Write ``data`` to ``path`` (a new file inside a private temp folder) and fsync it."""
    with os.fdopen(create_new(path), "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())


def copy_new(src: StrPath, dst: StrPath) -> None:
    """Copy the regular file ``src`` (its last component not followed if it is a link) into the new file
    ``dst`` (see :func:`create_new`), fsynced."""
    # not O_NONBLOCK: an open that waits (a lease, a hierarchical store) must wait, not fail; the caller
    # checked that ``src`` is a regular file (a FIFO would block here)
    with os.fdopen(os.open(src, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)), "rb") as inp:
        if not _stat.S_ISREG(os.fstat(inp.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(src))
        with os.fdopen(create_new(dst), "wb") as out:
            shutil.copyfileobj(inp, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())


def regular_inside(path: StrPath, folder: StrPath) -> Optional[str]:
    """Why ``path`` (found in ``folder``) may not be copied out of a checkpoint, or None: it must be a
    regular file whose real path lies inside ``folder``'s (a symbolic link to a file elsewhere, a
    private file above all, is refused)."""
    try:
        st = os.stat(path)
    except OSError:
        return "it cannot be read"
    if not _stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if os.path.islink(path) and not _under(real_path(path), real_path(folder)):
        return "it is a symbolic link to a file outside its folder"
    return None


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
def atomic_path(dest: StrPath) -> Iterator[Path]:
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


def atomic_write(dest: StrPath, data: Union[bytes, str]) -> Path:
    """Write ``data`` to ``dest`` atomically (as :func:`atomic_path`, through the descriptor of the new
    temp file: never reopened by name). Returns ``dest``."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        _umask_mode(fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        fsync_dir(dest.parent, best_effort=True)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return dest


# ---------------------------------------------------------------------------------------------
# did the source change


@dataclass(frozen=True)
class Stamp:
    size: int
    mtime_ns: int
    ino: int
    dev: int


def stamp(path: LocationLike) -> Optional[Stamp]:
    """Size, mtime, inode and device of ``path``; None if it does not exist."""
    if is_url(path):  # an object in object storage: size and mtime, asked afresh
        got = remote_stamp(path)
        return None if got is None else Stamp(got[0], got[1], 0, 0)
    try:
        st = os.stat(cast(StrPath, path))  # not a URL: a local path
    except FileNotFoundError:
        return None
    return Stamp(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def snapshot(paths: Iterable[LocationLike]) -> dict[str, Optional[Stamp]]:
    """{path: stamp} for ``paths`` (None: missing or unreadable). To watch a folder's entries, pass
    its listing: a file added or removed then shows as a change too."""
    out: dict[str, Optional[Stamp]] = {}
    for p in paths:
        try:
            out[str(p)] = stamp(p)
        except OSError:
            out[str(p)] = None
    return out


def changed(before: Mapping[str, Optional[Stamp]], after: Mapping[str, Optional[Stamp]]) -> list[str]:
    """Paths whose stamp differs between two snapshots (added and removed ones included)."""
    return [p for p in sorted(set(before) | set(after)) if before.get(p, "absent") != after.get(p, "absent")]


# ---------------------------------------------------------------------------------------------
# output preflight


class OutputError(OSError):
    """An output cannot be written there. ``kind``: missing · read-only · not-writable · no-space ·
    not-a-folder · not-empty · inside-source; ``errno`` matches it; ``free``/``need`` for no-space;
    ``relation`` ("is", "inside", "holds") and ``source`` for inside-source (see :func:`source_conflict`)."""

    ERRNO = {
        "missing": errno.ENOENT,
        "read-only": errno.EROFS,
        "not-writable": errno.EACCES,
        "no-space": errno.ENOSPC,
        "not-a-folder": errno.ENOTDIR,
        "not-empty": errno.ENOTEMPTY,
        "inside-source": errno.EINVAL,
    }

    def __init__(
        self,
        kind: str,
        path: StrPath,
        *,
        free: Optional[int] = None,
        need: Optional[int] = None,
        relation: str = "inside",
        source: Optional[str] = None,
    ) -> None:
        super().__init__(self.ERRNO[kind], os.strerror(self.ERRNO[kind]), str(path))
        self.kind = kind
        self.path = Path(path)
        self.free = free
        self.need = need
        self.relation = relation
        self.source = source


def free_bytes(folder: StrPath) -> int:
    """Bytes an unprivileged process may still write on ``folder``'s filesystem (raises OSError)."""
    vfs = os.statvfs(folder)
    return vfs.f_bavail * vfs.f_frsize


def check_writable(folder: StrPath) -> None:
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


def check_space(folder: StrPath, need: int) -> None:
    """At least ``need`` bytes free on ``folder``'s filesystem (skipped where that cannot be read)."""
    try:
        free = free_bytes(folder)
    except OSError:
        return
    if free < need:
        raise OutputError("no-space", folder, free=free, need=need)


def real_path(p: StrPath) -> Path:
    """``p`` absolute with every symbolic link resolved (what does not exist yet kept as written)."""
    return Path(os.path.realpath(os.fspath(p)))


def _under(p: Path, root: Path) -> bool:
    return p == root or root in p.parents


def source_conflict(
    out: StrPath, *, folders: Iterable[Optional[LocationLike]] = (), files: Iterable[Optional[LocationLike]] = ()
) -> Optional[tuple[str, str]]:
    """Why a command reading ``folders`` (the checkpoint, its tag, its components: OUT may not be one,
    hold one or lie inside one) and ``files`` (every file it reads or copies: OUT may not be one or
    hold one) may not write the output folder ``out``, compared as real paths: (relation, source) with
    relation "is", "inside" or "holds" -- or None. An ``--overwrite`` of OUT removes what it holds."""
    o = real_path(out)
    local_folders = [os.fspath(cast(StrPath, f)) for f in folders if f is not None and not is_url(f)]
    local_files = [os.fspath(cast(StrPath, f)) for f in files if f is not None and not is_url(f)]
    reals = [(f, real_path(f)) for f in local_folders]
    for shown, r in reals:
        if o == r:
            return "is", shown
    for shown, r in reals:
        if _under(o, r):
            return "inside", shown
    for f in [*local_folders, *local_files]:
        # the link itself and what it points to: removing either loses the source
        for r in {real_path(f), real_path(os.path.dirname(os.path.abspath(f))) / os.path.basename(f)}:
            if _under(r, o):
                return "holds", f
    return None


def inside(path: StrPath, root: StrPath) -> bool:
    """Is ``path`` ``root`` or below it (symlinks resolved)?"""
    try:
        p, r = Path(path).resolve(), Path(root).resolve()
    except (OSError, RuntimeError):
        p, r = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    return p == r or r in p.parents


def check_output_folder(out: StrPath, *, overwrite: bool = False) -> None:
    """``out`` is absent or an empty folder (or any folder, with ``overwrite``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError("not-a-folder", out)
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise OutputError("not-empty", out)


def check_sources(
    out: StrPath, *, folders: Iterable[Optional[LocationLike]] = (), files: Iterable[Optional[LocationLike]] = ()
) -> None:
    """OutputError("inside-source") where ``out`` is, holds or lies inside a source (:func:`source_conflict`)."""
    got = source_conflict(out, folders=folders, files=files)
    if got is not None:
        raise OutputError("inside-source", out, relation=got[0], source=got[1])


def preflight_output(
    out: StrPath,
    *,
    need: int = 0,
    source: Optional[LocationLike] = None,
    overwrite: bool = False,
    folders: Iterable[Optional[LocationLike]] = (),
    files: Iterable[Optional[LocationLike]] = (),
) -> None:
    """Everything a writer of a new output folder checks before it starts, in this order: not a source,
    holding none and not inside one (``source`` and ``folders``: folders it reads; ``files``: files it
    reads, see :func:`source_conflict`); absent or empty (see :func:`check_output_folder`); its parent
    exists and is writable; ``need`` bytes free there. Raises :class:`OutputError`."""
    out = Path(out)
    check_sources(out, folders=[source, *folders], files=files)
    check_output_folder(out, overwrite=overwrite)
    check_writable(out.parent)
    check_space(out.parent, need)


# ---------------------------------------------------------------------------------------------
# temp folders that say whose they are

OWNER_FILE = ".ckpt-tui-owner"  # inside a temp folder: flock'ed by the run that made it, for its life
_owned: dict[str, Optional[int]] = {}  # None: the owner lock was not got (another run took it first)

PROBE_RETRIES = 50  # x 5 ms: how long a lock taken by a run waits out inspect's probe of it (leftovers.held)


def flock_exclusive(fd: int) -> bool:
    """An exclusive, non-blocking flock on ``fd``: True once held, False while another run holds it. inspect's
    probe of a lock (a shared flock let go at once, :func:`ckpt_tui.core.leftovers.held`) is waited out: a run
    holds its lock for its whole life, a probe for microseconds."""
    import time

    for attempt in range(PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < PROBE_RETRIES:
                time.sleep(0.005)
    return False


def _take(path: StrPath, create: bool) -> Optional[int]:
    """A descriptor of the lock file ``path`` with an exclusive flock on it, or None where another process
    holds it. Never through a symbolic link; nothing is written to it."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if not flock_exclusive(fd):
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def owned_temp(folder: StrPath, prefix: str) -> Path:
    """Sweep the stale temp folders ``prefix*`` in ``folder`` (:func:`sweep_stale`), then create ours
    (``mkdtemp``) holding its owner lock until :func:`remove_temp`."""
    sweep_stale(folder, prefix)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
    try:
        fd = _take(tmp / OWNER_FILE, create=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _owned[str(tmp)] = fd
    return tmp


def remove_temp(tmp: StrPath) -> None:
    """Remove a folder of :func:`owned_temp` and let go of its lock."""
    shutil.rmtree(tmp, ignore_errors=True)
    fd = _owned.pop(str(tmp), None)
    if fd is not None:
        os.close(fd)


def sweep_stale(folder: StrPath, prefix: str) -> list[Path]:
    """Remove the folders ``prefix*`` in ``folder`` that are provably ours and dead: real folders (not
    links) of this user holding an owner lock (:data:`OWNER_FILE`) that nobody holds -- a killed run's.
    A live run holds its lock, a folder without one is not known to be ours: both are left. Returns what
    was removed."""
    removed: list[Path] = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return removed
    for n in names:
        p = Path(folder) / n
        if str(p) in _owned:
            continue
        try:
            st = os.lstat(p)
            if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = _take(p / OWNER_FILE, create=False)
        except OSError:
            continue
        if fd is None:  # its run is alive
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
        finally:
            os.close(fd)
        if not p.exists():
            removed.append(p)
    return removed
