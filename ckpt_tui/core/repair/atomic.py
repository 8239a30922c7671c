"""Safe in-place writes shared by every repair.

A repair writes the new content to a temp file beside the target, fsyncs it, checks that the
source did not change while it worked (size, mtime, inode), keeps the old file as a backup by hard
link (no copy, no extra space), ``os.replace``s the temp file over the target and fsyncs the
folder. A crash at any point leaves under the final name either the old file or the new one, and
the backup intact; the next run removes its own dead temp files and reuses a backup that is still a
hard link of the target (left by a run killed before the replace).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as _stat
from pathlib import Path
from typing import BinaryIO, Callable, Optional

from ..fsutil import OutputError, Stamp, check_space, check_writable, create_new, fsync_dir, stamp
from ..leftovers import REPAIR_TEMP_MARK
from ..names import BACKUP_SUFFIX  # the scan names backups by it too
from ..progress import check_cancel, report

TMP_MARK = REPAIR_TEMP_MARK  # inspect lists a killed run's temp file by the same name (core/leftovers.py)
FREE_MARGIN = 64 << 20  # leave this much free beyond what a write needs


class RepairError(Exception):
    """A repair refused or failed with a clear reason; nothing was changed."""


def backup_path(target: Path) -> Path:
    """``.<name>.ckpt-tui-bak`` beside the target. Hidden on purpose: loaders pick files by prefix
    (DeepSpeed counts every ``mp_rank_*`` file of a tag folder as a model-states file), so a
    backup named ``mp_rank_00_model_states.pt.bak`` would break ds_to_universal."""
    return target.with_name(f".{target.name}{BACKUP_SUFFIX}")


def tmp_prefix(target: Path) -> str:
    return f".{target.name}{TMP_MARK}"


def check_unchanged(path: Path, before: Optional[Stamp]) -> None:
    now = stamp(path)
    if now != before:
        raise RepairError(
            f"{path} changed while the repair ran (size/mtime/inode differ): a job may still be "
            "writing this checkpoint. Nothing was replaced; run the repair again once it has finished."
        )


def _os_error(e: OSError, what: str) -> RepairError:
    if e.errno == errno.EROFS:
        return RepairError(
            f"{what}: the filesystem is read-only. Nothing was changed; copy the checkpoint to a "
            "writable place and repair the copy."
        )
    if e.errno in (errno.EACCES, errno.EPERM):
        return RepairError(
            f"{what}: permission denied. Nothing was changed; run as the checkpoint's owner or fix its mode (`ls -l`)."
        )
    if e.errno == errno.ENOSPC:
        return RepairError(f"{what}: no space left on the device. Nothing was changed.")
    return RepairError(f"{what}: {e.strerror or e}. Nothing was changed.")


def link_on_path(root: Path, target: Path) -> Optional[Path]:
    """The first symbolic link among the entries from ``root`` (exclusive: the folder the user named) down
    to ``target`` (inclusive), or None. A repair through one would change the file it points to: another
    checkpoint's, or anyone's."""
    root, target = Path(os.path.abspath(root)), Path(os.path.abspath(target))
    try:
        parts = target.relative_to(root).parts
    except ValueError:
        return target  # not below the checkpoint at all: treated as a link out of it
    p = root
    for part in parts:
        p = p / part
        try:
            if _stat.S_ISLNK(os.lstat(p).st_mode):
                return p
        except FileNotFoundError:
            return None
    return None


def refuse_links(root: Path, target: Path) -> None:
    """RepairError where a symbolic link lies between ``root`` and ``target`` (:func:`link_on_path`)."""
    link = link_on_path(root, target)
    if link is not None:
        raise RepairError(link_refusal(link))


def link_refusal(link: Path, shown: Optional[str] = None) -> str:
    """Why a repair refuses the symbolic link ``link`` (``shown``: it as the user can type it)."""
    return (
        f"{shown or link} is a symbolic link (to {os.path.realpath(link)}): a repair through it would change "
        "what it points to, not this checkpoint. Nothing was changed; repair the checkpoint it points to "
        "there, or replace the link with a copy"
    )


def preflight(folder: Path, needed: int) -> None:
    """Refuse read-only filesystems, folders we may not write and too little free space (``needed``
    plus a margin), before touching anything."""
    try:
        check_writable(folder)
        check_space(folder, needed + FREE_MARGIN)
    except OutputError as e:
        if e.kind == "no-space":
            from ..units import naturalsize

            raise RepairError(
                f"{folder}: not enough free space: the repair writes {naturalsize(needed)} (the old "
                f"file is kept as the backup) and only {naturalsize(e.free)} is free. Nothing was "
                "changed."
            ) from None
        raise _os_error(e, str(folder)) from None
    except OSError as e:
        raise _os_error(e, str(folder)) from None


def cleanup_leftovers(target: Path) -> list[Path]:
    """Remove temp files a killed earlier run left beside ``target`` (ours only: our name pattern,
    and the pid in the name no longer alive). Returns what was removed."""
    removed = []
    pre = tmp_prefix(target)
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for n in names:
        if not n.startswith(pre):
            continue
        pid = n[len(pre) :].split(".", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        p = target.parent / n
        try:
            if _stat.S_ISREG(os.lstat(p).st_mode):
                os.unlink(p)
                removed.append(p)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # a leftover from an earlier call in this process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def backup_state(target: Path) -> str:
    """'none' (no backup), 'ours' (a hard link of the current target: a killed run's, reusable),
    'other' (an older backup that differs: refuse)."""
    b = backup_path(target)
    try:
        bs = os.lstat(b)
    except FileNotFoundError:
        return "none"
    try:
        ts = os.stat(target)
    except FileNotFoundError:
        return "other"
    return "ours" if (bs.st_ino, bs.st_dev) == (ts.st_ino, ts.st_dev) else "other"


def replace_file(
    target: Path,
    write: Callable[[BinaryIO], None],
    *,
    backup: bool,
    needed: int,
    watch: tuple[Path, ...] = (),
    verify: Optional[Callable[[Path], None]] = None,
    on_progress=None,
    cancel=None,
    label: str = "",
    root: Optional[Path] = None,
) -> Optional[Path]:
    """Write ``target`` anew through ``write(fileobj)``: temp file beside it, fsync, checks, backup by
    hard link, ``os.replace``, fsync of the folder. ``verify(tmp)`` re-reads the written temp file
    before anything is replaced (raise to abort). ``watch``: files (besides the target) whose
    change during the write aborts it. ``root``: the checkpoint the user named; a symbolic link
    between it and ``target`` (the target itself included) is refused (without ``root``: the target
    itself). Returns the backup path (or None). On any error nothing is changed: the temp file is
    removed, and a backup link this call made is removed again."""
    target = Path(target)
    folder = target.parent
    refuse_links(root if root is not None else folder, target)
    preflight(folder, needed)
    cleanup_leftovers(target)
    watched = (target, *watch)
    before = {p: stamp(p) for p in watched}
    bak = backup_path(target) if backup and before[target] is not None else None
    made_link = False
    if bak is not None:
        st = backup_state(target)
        if st == "other":
            raise RepairError(
                f"a backup {bak} already exists and is not the current file: move it away (it may be "
                "the only copy of an earlier version). Nothing was changed."
            )
    tmp = folder / f"{tmp_prefix(target)}{os.getpid()}"
    fd = None
    try:
        try:
            fd = create_new(tmp)
        except OSError as e:
            raise _os_error(e, str(folder)) from None
        with os.fdopen(fd, "wb") as f:
            fd = None
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before[target] is not None:
            try:
                shutil.copymode(target, tmp)
            except OSError:
                pass
        if verify is not None:
            verify(tmp)
        check_cancel(cancel)
        for p in watched:
            check_unchanged(p, before[p])
        report(on_progress, 1, 3, "files", label or "written")
        if bak is not None and backup_state(target) == "none":
            try:
                os.link(target, bak)
            except OSError as e:
                if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise RepairError(
                        f"cannot keep a backup of {target}: this filesystem does not allow hard "
                        f"links ({e.strerror}). Nothing was changed."
                    ) from None
                raise _os_error(e, str(bak)) from None
            made_link = True
            report(on_progress, 2, 3, "files", "backup kept")
        check_cancel(cancel)
        for p in watched:
            check_unchanged(p, before[p])
        os.replace(tmp, target)
        made_link = False
        fsync_dir(folder)
        report(on_progress, 3, 3, "files", "replaced")
        return bak
    except OSError as e:
        raise _os_error(e, str(target)) from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp.exists():
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if made_link and bak is not None:
            try:
                os.unlink(bak)
            except OSError:
                pass
