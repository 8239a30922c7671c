"""What ckpt-tui's own writers leave behind when a run is killed, recognised by name -- once, here.

Every temp or staging entry a command makes is swept by the next run of that command; until then the
scan lists it as one node (format ``leftover``, never descended: the partial files inside are no
finding) and diagnose reports it as ``leftover-temp``. Only what is provably ours is recognised, by the
names the writers use (``core/staging.py``'s one list, :data:`ckpt_tui.core.staging.STAGING_NAMES`):

- a staging folder beside OUT, ``.OUT.<mark>-PID`` (``tmp`` an export's, ``universal``, ``torch-dcp`` the
  conversions'), an ``--overwrite``'s ``.OUT.old-PID``, and what older versions' "both" left
  (``.OUT.model-PID`` / ``.OUT.optimizer-PID`` and their own ``..OUT.model-PID.tmp-PID``) -- each beside the
  lock file ``.OUT.ckpt-tui.lock`` a killed run leaves;
- older versions' conversion temp folders and verify's (``fsutil.owned_temp``: ``.ckpt-tui-universal-*``,
  ``.ckpt-tui-torch-dcp-*``, ``ckpt-tui-verify-*``) with their owner lock ``.ckpt-tui-owner`` inside;
- the lock files themselves (a repair's, beside the file it replaces, too);
- a repair's temp file ``.X.ckpt-tui-tmp-PID`` (``staging.staged_file``).

Whether a live run still holds it: the owner or OUT lock is tried with a shared, non-blocking flock
(released at once); a repair's temp file by its pid.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat as _stat
from pathlib import Path
from typing import Optional

from .facts import LeftoverFacts
from .fsutil import OWNER_FILE

# the names, once, in the writers' own module (the conversions' plans import their prefixes from here)
from .staging import (
    LOCK_SUFFIX,
    OWNED_TEMPS,
    REPAIR_TEMP_MARK,
    TORCH_DCP_TEMP,
    UNIVERSAL_TEMP,
    VERIFY_TEMP,
    parse_name,
    pid_alive,
    top_out,
)

__all__ = ["LOCK_SUFFIX", "REPAIR_TEMP_MARK", "TORCH_DCP_TEMP", "UNIVERSAL_TEMP", "VERIFY_TEMP", "recognise"]

_REPAIR = re.compile("^\\.(?P<target>.+)" + re.escape(REPAIR_TEMP_MARK) + r"(?P<pid>\d+)$")
_ENTRIES_CAP = 100_000  # a leftover folder's files counted up to this (its size then a lower bound)


def _held(lock: Path) -> bool:
    """Does a live process hold the flock on ``lock``? A shared non-blocking try, let go at once (a lock we
    cannot open is taken as held: we never advise removing what we cannot tell)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)  # closing lets go of the flock
    return False


def _alive(pid: int) -> bool:
    """Is the repair of ``pid`` still running? (This process's own temp file is live, unlike staging's view.)"""
    return pid == os.getpid() or pid_alive(pid)


def _regular(p: Path) -> bool:
    try:
        return _stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def recognise(folder: Path, name: str, is_dir: bool) -> Optional[LeftoverFacts]:
    """The leftover facts of entry ``name`` of ``folder`` (a real file or folder, not a link) when a ckpt-tui
    writer made it, else None: ``leftover_of`` (the command whose next run sweeps it), ``leftover_kind``
    (temp-folder, staging-folder, old-output, lock, temp-file), ``leftover_held`` (a live run holds it),
    ``leftover_out`` (an export's: the OUT it was for), ``leftover_restores`` (an --overwrite's old OUT
    whose OUT is gone: the next export renames it back)."""
    if not (name.startswith(".") or name.startswith(VERIFY_TEMP)):
        return None  # the cheap test first: every name below starts so
    if is_dir:
        for prefix, command in OWNED_TEMPS.items():
            if name.startswith(prefix) and len(name) > len(prefix):
                owner = folder / name / OWNER_FILE
                if not _regular(owner):
                    return None  # not known to be ours (sweep_stale leaves it too)
                return LeftoverFacts(leftover_of=command, leftover_kind="temp-folder", leftover_held=_held(owner))
        got = parse_name(name)
        if got is None:
            return None
        rule, out, _pid = got
        lock = folder / f".{out}{LOCK_SUFFIX}"
        if not _regular(lock):
            return None  # a staging folder has OUT's lock beside it while its run lives and once it is killed
        facts = LeftoverFacts(
            leftover_of=rule.command,
            leftover_kind=rule.kind,
            leftover_held=_held(lock),
            leftover_out=top_out(name),
        )
        if rule.kind == "old-output" and not os.path.lexists(folder / out):
            facts["leftover_restores"] = out
        return facts
    if name.endswith(LOCK_SUFFIX) and len(name) > len(LOCK_SUFFIX) + 1:
        return LeftoverFacts(
            leftover_of=_lock_of(folder, name),
            leftover_kind="lock",
            leftover_held=_held(folder / name),
            leftover_out=top_out(name),
        )
    m = _REPAIR.match(name)
    if m:
        return LeftoverFacts(
            leftover_of="ckpt-tui fix",
            leftover_kind="temp-file",
            leftover_held=_alive(int(m["pid"])),
            leftover_out=m["target"],
        )
    return None


def _lock_of(folder: Path, name: str) -> str:
    """The command whose next run takes (and removes) the lock ``name``: a repair's where it locks a file, the
    writer whose staging folder lies beside it, else an export's (any writer of that OUT would)."""
    target = name[1 : -len(LOCK_SUFFIX)]
    if _regular(folder / target):
        return "ckpt-tui fix"
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    for n in sorted(names):
        got = parse_name(n) if n.startswith(f".{target}.") else None
        if got is not None and got[1] == target and got[0].kind == "temp-folder":
            return got[0].command
    return "ckpt-tui export"


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files) below the folder ``path``, links not followed, counted up to a cap of entries."""
    total = files = 0
    stack = [path]
    while stack and files < _ENTRIES_CAP:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if _stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
            else:
                files += 1
                total += st.st_size
    return total, files
