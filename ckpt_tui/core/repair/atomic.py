"""Safe in-place writes shared by every repair: the staged output of one file (``core/staging.py``,
:func:`~ckpt_tui.core.staging.staged_file`) plus the backup.

A repair preflights the target's folder, locks the target, writes the new content to a temp file
beside it, checks that the source did not change while it worked (size, mtime, inode), keeps the old
file as a backup by hard link (no copy, no extra space), ``os.replace``s the temp file over the target
and fsyncs the folder. A crash at any point leaves under the final name either the old file or the new
one, and the backup intact; the next run removes its own dead temp files and reuses a backup that is
still a hard link of the target (left by a run killed before the replace).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as _stat
from pathlib import Path
from typing import BinaryIO, Callable, Optional

from ..fsutil import create_new
from ..names import BACKUP_SUFFIX  # the scan names backups by it too
from ..progress import CancelToken, OnProgress, check_cancel, report
from ..staging import REPAIR_TEMP_MARK, FileStage, message, staged_file

FREE_MARGIN = 64 << 20  # leave this much free beyond what a write needs


class RepairError(Exception):
    """A repair refused or failed with a clear reason; nothing was changed."""


def backup_path(target: Path) -> Path:
    """``.<name>.ckpt-tui-bak`` beside the target. Hidden on purpose: loaders pick files by prefix
    (DeepSpeed counts every ``mp_rank_*`` file of a tag folder as a model-states file), so a
    backup named ``mp_rank_00_model_states.pt.bak`` would break ds_to_universal."""
    return target.with_name(f".{target.name}{BACKUP_SUFFIX}")


def tmp_prefix(target: Path) -> str:
    """The name of a repair's temp file beside ``target``, before the pid (``staging.staged_file`` names it)."""
    return f".{target.name}{REPAIR_TEMP_MARK}"


def _os_error(e: OSError, what: str) -> RepairError:
    """A failure while writing, said as the preflight would have (the table in ``core/staging.py``)."""
    if e.errno == errno.EROFS:
        return RepairError(message("read-only", "repair", parent=what))
    if e.errno in (errno.EACCES, errno.EPERM):
        return RepairError(message("not-writable", "repair", parent=what))
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
    write: Callable[[BinaryIO], object],  # what it returns is not used (a lambda over fh.write)
    *,
    backup: bool,
    needed: int,
    watch: tuple[Path, ...] = (),
    verify: Optional[Callable[[Path], None]] = None,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
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
    with staged_file(target, writer="repair", error=RepairError, watch=watch, need_bytes=needed + FREE_MARGIN) as stage:
        return _replace(stage, write, backup, verify, on_progress, cancel, label)


def _replace(
    stage: FileStage,
    write: Callable[[BinaryIO], object],
    backup: bool,
    verify: Optional[Callable[[Path], None]],
    on_progress: Optional[OnProgress],
    cancel: Optional[CancelToken],
    label: str,
) -> Optional[Path]:
    """:func:`replace_file` inside its staged file: write, verify, the backup link, install."""
    target, tmp = stage.target, stage.path
    existed = stage.before[str(target)] is not None
    bak = backup_path(target) if backup and existed else None
    made_link = False
    if bak is not None:
        st = backup_state(target)
        if st == "other":
            raise RepairError(
                f"a backup {bak} already exists and is not the current file: move it away (it may be "
                "the only copy of an earlier version). Nothing was changed."
            )
    fd = None
    try:
        try:
            fd = create_new(tmp)
        except OSError as e:
            raise _os_error(e, str(target.parent)) from None
        with os.fdopen(fd, "wb") as f:
            fd = None
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if existed:
            try:
                shutil.copymode(target, tmp)
            except OSError:
                pass
        if verify is not None:
            verify(tmp)
        check_cancel(cancel)
        stage.check_unchanged()
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
        stage.check_unchanged()
        stage.install()
        made_link = False
        report(on_progress, 3, 3, "files", "replaced")
        return bak
    except OSError as e:
        raise _os_error(e, str(target)) from None
    finally:
        if fd is not None:
            os.close(fd)
        if made_link and bak is not None:
            try:
                os.unlink(bak)
            except OSError:
                pass
