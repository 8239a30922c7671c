"""What ckpt-tui's own writers leave behind when a run is killed, recognised by name -- once, here.

Every temp or staging entry a command makes is swept by the next run of that command; until then the
scan lists it as one node (format ``leftover``, never descended: the partial files inside are no
finding) and diagnose reports it as ``leftover-temp``. Only what is provably ours is recognised, with
the same names the writers use (they take their prefixes from here or from ``export.write``):

- conversions' and verify's temp folders (``fsutil.owned_temp``): ``.ckpt-tui-universal-*``,
  ``.ckpt-tui-torch-dcp-*``, ``ckpt-tui-verify-*``, each holding its owner lock ``.ckpt-tui-owner``;
- an export into OUT: ``.OUT.tmp-PID``, the "both" export's ``.OUT.model-PID`` / ``.OUT.optimizer-PID``
  (and their own ``..OUT.model-PID.tmp-PID``), an ``--overwrite``'s ``.OUT.old-PID`` -- each beside the
  lock file ``.OUT.ckpt-tui.lock`` a killed export leaves; the lock files themselves;
- a repair's temp file ``.X.ckpt-tui-tmp-PID`` (``repair.atomic``).

Whether a live run still holds it: the owner or export lock is tried with a shared, non-blocking flock
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

from .export.write import LEFTOVER_PATTERNS, OutputLock
from .facts import LeftoverFacts
from .fsutil import OWNER_FILE

# owned_temp prefixes: the writers import them from here (a conversion's plan sits above the scan)
UNIVERSAL_TEMP = ".ckpt-tui-universal-"
TORCH_DCP_TEMP = ".ckpt-tui-torch-dcp-"
VERIFY_TEMP = "ckpt-tui-verify-"
REPAIR_TEMP_MARK = ".ckpt-tui-tmp-"  # a repair's temp file: .<target><mark><pid>

# prefix -> the command whose next run sweeps it
OWNED_TEMPS = {UNIVERSAL_TEMP: "ckpt-tui universal", TORCH_DCP_TEMP: "ckpt-tui convert", VERIFY_TEMP: "ckpt-tui verify"}

LOCK_SUFFIX = OutputLock(Path("OUT")).path.name[len(".OUT") :]  # ".ckpt-tui.lock", as the export names it


def _pattern(pat: str) -> re.Pattern:
    """One of export's LEFTOVER_PATTERNS (``.{}.tmp-*``) as a regex: OUT a group, ``*`` the writer's pid."""
    head, tail = pat.split("{}")
    return re.compile("^" + re.escape(head) + "(?P<out>.+)" + re.escape(tail.rstrip("*")) + r"\d+$")


# the entries an export into OUT makes beside it (the "..{}" ones are the same rules one level down)
_EXPORT = tuple(_pattern(p) for p in LEFTOVER_PATTERNS if p.startswith(".{}"))
_REPAIR = re.compile("^\\.(?P<target>.+)" + re.escape(REPAIR_TEMP_MARK) + r"(?P<pid>\d+)$")
_ENTRIES_CAP = 100_000  # a leftover folder's files counted up to this (its size then a lower bound)


def _held(lock) -> bool:
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
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _regular(p) -> bool:
    try:
        return _stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def export_out(name: str) -> Optional[str]:
    """The OUT an export staging name ``name`` was made for, one level up (``.m.tmp-12`` -> ``m``), or None."""
    for rx in _EXPORT:
        m = rx.match(name)
        if m:
            return m.group("out")
    return None


def top_out(name: str) -> str:
    """The OUT the user named, for an export's staging name nested any levels (``..m.model-1.tmp-1`` -> ``m``)."""
    if name.endswith(LOCK_SUFFIX) and name.startswith("."):
        name = name[1 : -len(LOCK_SUFFIX)]
    while (up := export_out(name)) is not None:
        name = up
    return name


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
        out = export_out(name)
        if out is None:
            return None
        lock = folder / f".{out}{LOCK_SUFFIX}"
        if not _regular(lock):
            return None  # an export's staging has its lock beside it while it lives and once killed
        facts = LeftoverFacts(
            leftover_of="ckpt-tui export",
            leftover_kind="temp-folder",
            leftover_held=_held(lock),
            leftover_out=top_out(name),
        )
        if name.startswith(f".{out}.old-"):
            facts["leftover_kind"] = "old-output"
            if not os.path.lexists(folder / out):
                facts["leftover_restores"] = out
        elif not name.startswith(f".{out}.tmp-"):
            facts["leftover_kind"] = "staging-folder"
        return facts
    if name.endswith(LOCK_SUFFIX) and len(name) > len(LOCK_SUFFIX) + 1:
        return LeftoverFacts(
            leftover_of="ckpt-tui export",
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
