"""One staged output for every writer -- the commit point exists once, here.

Every command that writes (export, the TUI's model + optimizer export, the multi-process export, the
conversions, the repairs, and the writers to come) goes through :func:`staged_output` (a new output
folder) or :func:`staged_file` (one file replaced in place, with a backup). Either one:

1. **preflights**: OUT is no source, holds none and lies in none; absent or empty (or any folder, with
   ``--overwrite``); its folder exists and is writable; enough space is free there;
2. **locks OUT itself**: the lock file ``.OUT.ckpt-tui.lock`` beside it (``O_CREAT|O_EXCL|O_NOFOLLOW``,
   flock'ed for the run's life, nothing ever written to it): one writer of OUT at a time;
3. **sweeps** what killed runs into OUT left beside it (every name form in :data:`STAGING_NAMES`, older
   versions' too, and the conversions' older temp folders), of dead pids only;
4. **stages** in one hidden folder beside OUT (``.OUT.<mark>-PID``, on OUT's filesystem; OUT's lock beside it
   says whether its run lives): the result is ``stage.path``;
5. **commits** (:meth:`Stage.commit`): the sources did not change (the stamps taken at the start), every
   file and folder staged is fsynced, and one install renames the result into place (an old OUT moves
   aside first and comes back if anything fails; the next run puts it back after a kill);
6. says every refusal with **one table** (:data:`MESSAGES`): one wording per kind, sizes for people.

A file target (:func:`staged_file`) takes the same steps: the lock names the file, the stage is the temp
file ``.X.ckpt-tui-tmp-PID`` beside it, the install an ``os.replace`` over it after the backup link.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat as _stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from .fsutil import (
    OutputError,
    Stamp,
    changed,
    check_output_folder,
    check_sources,
    check_space,
    check_writable,
    flock_exclusive,
    fsync_dir,
    snapshot,
    sweep_stale,
)
from .storage import LocationLike

LOCK_SUFFIX = ".ckpt-tui.lock"  # .OUT.ckpt-tui.lock: the lock of OUT itself, beside it
REPAIR_TEMP_MARK = ".ckpt-tui-tmp-"  # a file target's stage: .<target><mark><pid>

# the conversions' temp folders of older versions (fsutil.owned_temp, a random suffix, not named after
# OUT) -- and verify's own, which is not an output's
UNIVERSAL_TEMP = ".ckpt-tui-universal-"
TORCH_DCP_TEMP = ".ckpt-tui-torch-dcp-"
VERIFY_TEMP = "ckpt-tui-verify-"
OWNED_TEMPS = {UNIVERSAL_TEMP: "ckpt-tui universal", TORCH_DCP_TEMP: "ckpt-tui convert", VERIFY_TEMP: "ckpt-tui verify"}


@dataclass(frozen=True)
class StagingName:
    """One name a writer gives an entry beside its output OUT: ``.{out}.{mark}-{pid}``."""

    mark: str  # "tmp", "universal", ...
    kind: str  # what core/leftovers.py calls it: temp-folder, staging-folder, old-output
    command: str  # the command whose next run sweeps it

    def name(self, out: str, pid: int) -> str:
        return f".{out}.{self.mark}-{pid}"

    @property
    def regex(self) -> re.Pattern[str]:
        return re.compile(r"^\.(?P<out>.+)\." + re.escape(self.mark) + r"-(?P<pid>\d+)$")


@dataclass(frozen=True)
class Writer:
    """Who writes, as its messages name it: ``what`` ("export": "the export needs …", "the source changed
    during the export"), ``again`` (how to run it again), whether it offers ``--overwrite``, ``file``: a file
    replaced in place (a repair) rather than a new output folder; ``mark``: its staging folder's
    ``.OUT.<mark>-PID``, and ``command``: what inspect says sweeps it. A writer to come (an adapter or merge
    export, ``--to hf``, a prune journal) is one more line here, or writes as one already here."""

    what: str
    again: str
    command: str
    mark: str = ""
    overwrite: bool = False
    file: bool = False


WRITERS: dict[str, Writer] = {
    "export": Writer("export", "export again", "ckpt-tui export", "tmp", overwrite=True),
    "universal": Writer("conversion", "convert again", "ckpt-tui universal", "universal"),
    "torch-dcp": Writer("conversion", "convert again", "ckpt-tui convert", "torch-dcp"),
    "repair": Writer("repair", "run the repair again", "ckpt-tui fix", file=True),
    "prune": Writer("prune", "run the prune again", "ckpt-tui prune", file=True),  # its marker in each checkpoint
}


# Every entry a run writing OUT makes beside it (and every one older versions made): one list, read by
# the sweep below and by core/leftovers.py. Where ``{out}`` is itself such a name (``..OUT.model-PID.tmp-PID``:
# an older "both" staged each half as an export of its own), the same rules apply one level down.
STAGING_NAMES: tuple[StagingName, ...] = (
    *(StagingName(w.mark, "temp-folder", w.command) for w in WRITERS.values() if w.mark),
    StagingName("model", "staging-folder", "ckpt-tui export"),  # an older "both": the model's half
    StagingName("optimizer", "staging-folder", "ckpt-tui export"),  # ... and the optimizer's
    StagingName("old", "old-output", "ckpt-tui export"),  # an --overwrite's old OUT, moved aside
)
_BY_MARK = {n.mark: n for n in STAGING_NAMES}
_NAME_RX = tuple((n, n.regex) for n in STAGING_NAMES)


def parse_name(name: str) -> Optional[tuple[StagingName, str, int]]:
    """(the rule, the OUT it was made for, the writer's pid) of a staging name one level up, or None."""
    for rule, rx in _NAME_RX:
        m = rx.match(name)
        if m:
            return rule, m["out"], int(m["pid"])
    return None


def top_out(name: str) -> str:
    """The OUT the user named, for a staging name or lock nested any levels (``..m.model-1.tmp-1`` -> ``m``)."""
    if name.endswith(LOCK_SUFFIX) and name.startswith("."):
        name = name[1 : -len(LOCK_SUFFIX)]
    while (got := parse_name(name)) is not None:
        name = got[1]
    return name


def lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}{LOCK_SUFFIX}"


# ---------------------------------------------------------------------------------------------
# one table from refusal to message


@dataclass(frozen=True)
class Wording:
    """A refusal: ``text`` (the same for every writer), then what to do about it for a new output folder
    (``folder``) and for a file replaced in place (``file``); ``sep`` joins them."""

    text: str
    folder: str = ""
    file: str = ""
    sep: str = "; "


MESSAGES: dict[str, Wording] = {
    # the preflight (fsutil.OutputError kinds)
    "missing": Wording("{parent} does not exist", "create it first"),
    "read-only": Wording(
        "{parent} is on a read-only filesystem",
        "choose --out on a writable one",
        "copy the checkpoint to a writable place and repair the copy",
    ),
    "not-writable": Wording(
        "cannot write in {parent}: permission denied",
        "choose another --out",
        "run as the checkpoint's owner or fix its mode (`ls -l`)",
    ),
    "no-space": Wording("no space left on {parent}: {subject} needs {need}, {free} is free"),
    "not-a-folder": Wording("{out} exists and is not a folder", "choose another --out"),
    "not-empty": Wording("{out} is not empty", "choose another --out{or_overwrite}"),
    "inside-source": Wording(
        "the output folder {out} {relation} the source {source}{overwrite_deletes}",
        "ckpt-tui never writes into or removes a source; choose --out outside it",
        sep=": ",
    ),
    # the lock
    "lock-link": Wording(
        "{lock} is a symbolic link: ckpt-tui never writes through one",
        "remove it (someone else may have planted it) or choose another --out",
        "remove it (someone else may have planted it)",
    ),
    "lock-not-regular": Wording(
        "{lock} is not a regular file", "remove it or choose another --out", "remove it", sep=": "
    ),
    "locked": Wording("another ckpt-tui is writing {out}", "wait for it or choose another --out", "wait for it"),
    "lock-unstable": Wording("cannot take the lock {lock}: it keeps changing"),
    "no-stage": Wording("cannot create a staging folder in {parent}: {reason}"),
    # the commit
    "source-changed": Wording(
        "the source changed during the {what} ({names})",
        "nothing was written; {again} once the checkpoint is complete",
        "{again} once the checkpoint is complete",
        sep=": ",
    ),
    "appeared": Wording("{out} appeared and is not empty; nothing was replaced"),
}

_RELATION = {"is": "is", "inside": "is inside", "holds": "holds"}


def message(
    kind: str,
    writer: str,
    *,
    out: object = "",
    parent: object = "",
    source: object = "",
    relation: str = "inside",
    need: Optional[int] = None,
    free: Optional[int] = None,
    names: Sequence[str] = (),
    lock: object = "",
    reason: str = "",
    what: Optional[str] = None,
) -> str:
    """The one wording of refusal ``kind`` (a key of :data:`MESSAGES`) for ``writer`` (a key of :data:`WRITERS`)."""
    from .units import naturalsize

    w = WRITERS[writer]
    wording = MESSAGES[kind]
    fields = {
        "out": out,
        "parent": parent,
        "source": source,
        "relation": _RELATION.get(relation, relation),
        "overwrite_deletes": " (--overwrite would delete it)" if relation == "holds" and w.overwrite else "",
        "or_overwrite": " or pass --overwrite" if w.overwrite else "",
        "what": w.what,
        "subject": what or f"the {w.what}",
        "need": naturalsize(need or 0),
        "free": naturalsize(free or 0),
        "names": ", ".join(names[:3]) + (" …" if len(names) > 3 else ""),
        "lock": lock,
        "reason": reason,
        "again": w.again,
    }
    text = wording.text.format(**fields)
    if w.file:  # a repair's refusals end saying that nothing changed
        hint = wording.file.format(**fields)
        return f"{text}. Nothing was changed" + (f"; {hint}." if hint else ".")
    hint = wording.folder.format(**fields)
    return f"{text}{wording.sep}{hint}" if hint else text


def refusal(
    e: OutputError,
    writer: str,
    *,
    out: object = None,
    shown: Callable[[str], str] = str,
    what: Optional[str] = None,
) -> str:
    """What the preflight found (``e``), said for ``writer``: ``out`` as the user gave it (default the path),
    ``shown`` a source as the user can type it."""
    if e.kind in _FOLDER_KINDS:  # said of the folder OUT goes in (the error's path)
        shown_path: object = e.path
        parent: Path = e.path
    else:  # said of OUT itself
        shown_path = e.path if out is None or e.kind != "inside-source" else out
        parent = e.path.parent
    return message(
        e.kind,
        writer,
        out=shown_path,
        parent=parent,
        source=shown(str(e.source)) if e.source is not None else "",
        relation=e.relation,
        need=e.need,
        free=e.free,
        what=what,
    )


_FOLDER_KINDS = ("missing", "read-only", "not-writable", "no-space")


# ---------------------------------------------------------------------------------------------
# preflight


@dataclass
class Sources:
    """What a writer reads: ``folders`` OUT may not be, hold or lie inside; ``files`` OUT may not be or hold
    (``fsutil.source_conflict``); ``shown``: a source path as the user can type it (for the refusal)."""

    folders: Sequence[LocationLike] = ()
    files: Sequence[LocationLike] = ()
    shown: Callable[[str], str] = str


def preflight(
    out: Path,
    writer: str,
    error: type[Exception],
    *,
    sources: Sequence[Sources] = (),
    overwrite: bool = False,
    need_bytes: int = 0,
    shown_out: object = None,
    what: Optional[str] = None,
) -> None:
    """Every check before anything is written, in this order: OUT is no source, holds none and lies in none;
    absent or empty (any folder with ``overwrite``); its folder exists and is writable; ``need_bytes`` free
    there. Raises ``error`` with the table's wording. A plan (``--dry-run``) runs it too."""
    out = Path(out)
    try:
        for s in sources:
            try:
                check_sources(out, folders=s.folders, files=s.files)
            except OutputError as e:
                raise error(refusal(e, writer, out=shown_out, shown=s.shown, what=what)) from None
        check_output_folder(out, overwrite=overwrite)
        check_writable(out.parent)
        check_space(out.parent, need_bytes)
    except OutputError as e:
        raise error(refusal(e, writer, out=shown_out, what=what)) from None


def preflight_file(folder: Path, writer: str, error: type[Exception], *, need_bytes: int = 0) -> None:
    """A file target's preflight: ``folder`` exists and is writable, ``need_bytes`` free there."""
    try:
        check_writable(folder)
        check_space(folder, need_bytes)
    except OutputError as e:
        raise error(refusal(e, writer)) from None
    except OSError as e:
        raise error(message("no-stage", writer, parent=folder, reason=e.strerror or str(e))) from None


# ---------------------------------------------------------------------------------------------
# the lock of OUT itself


class OutLock:
    """The lock beside OUT (``.OUT.ckpt-tui.lock``) that one writer of OUT holds for its life. Created with
    ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a killed run's is reused, never through a symbolic link); nothing is
    ever written to it; let go and removed by :meth:`release`."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.path = lock_path(self.out)
        self.fd: Optional[int] = None

    def acquire(self, writer: str, error: type[Exception]) -> None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        for _ in range(100):
            try:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    fd = os.open(self.path, flags)  # a killed run's lock file
            except FileNotFoundError:  # its holder removed it meanwhile
                continue
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EMLINK):
                    raise error(message("lock-link", writer, lock=self.path)) from None
                raise
            st = os.fstat(fd)
            if not _stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise error(message("lock-not-regular", writer, lock=self.path))
            if not flock_exclusive(fd):
                os.close(fd)
                raise error(message("locked", writer, out=self.out))
            try:
                now: Optional[os.stat_result] = os.lstat(self.path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                self.fd = fd
                return
            os.close(fd)  # the holder let go and removed it between our open and our flock: again
        raise error(message("lock-unstable", writer, lock=self.path))

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            st, now = os.fstat(self.fd), os.lstat(self.path)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


# ---------------------------------------------------------------------------------------------
# sweeping what killed runs left

_active: set[str] = set()  # this process's live staging (a TUI runs several writers in one process)


def pid_alive(pid: int) -> bool:
    """Is ``pid`` a live process on this host other than ours? (Ours: a staging this process left in an
    earlier call, while it is not in :data:`_active`.)"""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _free_lock_file(p: Path) -> bool:
    """Unlink the lock file ``p`` when nobody holds it; True when gone."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(p)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove(p: Path) -> None:
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p, ignore_errors=True)
    else:
        os.unlink(p)


def sweep(out: Path) -> list[Path]:
    """Remove what killed runs into ``out`` left beside it (the caller holds OUT's lock, so none of it is a live
    run's of this version), returning what went: every :data:`STAGING_NAMES` entry of OUT (nested ones too:
    an older "both"'s ``..OUT.model-PID.tmp-PID`` and its lock) whose pid is no live process here -- an
    ``--overwrite``'s old OUT is renamed back where OUT is missing (killed between the two renames), else
    removed -- and the conversions' older temp folders in that folder (``fsutil.sweep_stale``: by their
    owner lock). Links are never followed, other users' entries are left."""
    out = Path(out)
    folder = out.parent
    removed: list[Path] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    mine = lock_path(out).name
    for n in sorted(names):
        p = folder / n
        if not n.startswith(f".{out.name}.") and not n.startswith(f"..{out.name}.") or n == mine:
            continue
        lock = n.endswith(LOCK_SUFFIX)
        got = parse_name(n[1 : -len(LOCK_SUFFIX)] if lock else n)
        if got is None or top_out(n) != out.name or str(p) in _active:
            continue
        rule, of, pid = got
        try:
            st = os.lstat(p)
            if st.st_uid != os.geteuid() or pid_alive(pid):
                continue
            if lock:
                if _free_lock_file(p):
                    removed.append(p)
                continue
            if rule.kind == "old-output" and of == out.name and not os.path.lexists(out):
                os.replace(p, out)  # killed between the two renames of an --overwrite: the old OUT comes back
                continue
            _remove(p)
        except OSError:
            continue
        if not os.path.lexists(p):
            removed.append(p)
    for prefix in (UNIVERSAL_TEMP, TORCH_DCP_TEMP):
        removed += sweep_stale(folder, prefix)
    return removed


def sweep_file_temps(target: Path) -> list[Path]:
    """Remove the temp files killed runs replacing ``target`` left beside it (``.X.ckpt-tui-tmp-PID``, the pid
    not alive here; regular files only). The caller holds the target's lock."""
    removed: list[Path] = []
    pre = f".{target.name}{REPAIR_TEMP_MARK}"
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for n in names:
        if not n.startswith(pre):
            continue
        pid = n[len(pre) :].split(".", 1)[0]
        p = target.parent / n
        if (pid.isdigit() and pid_alive(int(pid))) or str(p) in _active:
            continue
        try:
            if _stat.S_ISREG(os.lstat(p).st_mode):
                os.unlink(p)
                removed.append(p)
        except OSError:
            pass
    return removed


# ---------------------------------------------------------------------------------------------
# durability and the install


def fsync_tree(top: Path) -> None:
    """fsync every file and folder below ``top`` and ``top`` itself (links not followed), deepest first."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for dirpath, _dirs, files in os.walk(top, topdown=False):
        for f in files:
            p = os.path.join(dirpath, f)
            if not _stat.S_ISREG(os.lstat(p).st_mode):
                continue
            fd = os.open(p, flags)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def install_folder(staged: Path, out: Path, *, overwrite: bool, writer: str, error: type[Exception]) -> None:
    """Rename the complete, fsynced ``staged`` to ``out``: the one install. An existing ``out`` (empty, or any
    with ``overwrite``) is first renamed aside to ``.OUT.old-PID`` and removed only once the new one is in
    place; should the second rename fail it is renamed back. A kill between the two leaves the old one
    aside, which the next run (:func:`sweep`) renames back -- and inspect says how to."""
    if os.path.lexists(out):
        real_dir = os.path.isdir(out) and not os.path.islink(out)
        if not overwrite and not (real_dir and not any(Path(out).iterdir())):
            raise error(message("appeared", writer, out=out))
        trash = out.parent / _BY_MARK["old"].name(out.name, os.getpid())
        os.replace(out, trash)  # a link at OUT (--overwrite) is moved aside itself, never what it points to
        try:
            os.replace(staged, out)
        except BaseException:
            os.replace(trash, out)
            raise
        try:
            _remove(trash)
        except OSError:
            pass
    else:
        os.replace(staged, out)
    fsync_dir(out.parent)


# ---------------------------------------------------------------------------------------------
# the staged output


@dataclass
class Stage:
    """A writer's staging beside OUT (:attr:`root`, ``.OUT.<mark>-PID``): write the result at :attr:`path` (the
    root itself, or a folder to create inside it: ``staged_output(scratch=True)``); then :meth:`commit`."""

    out: Path
    root: Path
    path: Path
    writer: str
    error: type[Exception]
    overwrite: bool = False
    watched: list[LocationLike] = field(default_factory=list)
    watched_folders: list[Path] = field(default_factory=list)
    before: dict[str, Optional[Stamp]] = field(default_factory=dict)
    committed: bool = False

    def _now(self) -> dict[str, Optional[Stamp]]:
        return snapshot([*self.watched, *listing(self.watched_folders)])

    def check_unchanged(self) -> None:
        """The sources as they were when the stage began, else refuse (a job still writing them?)."""
        check_unchanged(self.before, self._now(), self.writer, self.error)

    def commit(self) -> None:
        """Sources unchanged, everything staged fsynced, installed as OUT (see :func:`install_folder`)."""
        self.check_unchanged()
        fsync_tree(self.path)
        install_folder(self.path, self.out, overwrite=self.overwrite, writer=self.writer, error=self.error)
        self.committed = True


def listing(folders: Iterable[Path]) -> list[Path]:
    """Every entry of ``folders`` (a file added or removed there then shows as a change)."""
    got: list[Path] = []
    for f in folders:
        try:
            got += sorted(Path(f).iterdir())
        except OSError:
            got.append(Path(f))
    return got


def check_unchanged(
    before: dict[str, Optional[Stamp]], after: dict[str, Optional[Stamp]], writer: str, error: type[Exception]
) -> None:
    """Refuse the result where a source's stamp changed between two snapshots."""
    moved = changed(before, after)
    if moved:  # a live job is writing the checkpoint: what we read may be half old, half new
        raise error(message("source-changed", writer, names=[Path(c).name for c in moved]))


@contextmanager
def staged_output(
    out: Path,
    *,
    writer: str,
    error: type[Exception],
    sources: Sequence[Sources] = (),
    watch: Iterable[LocationLike] = (),
    watch_folders: Iterable[Path] = (),
    overwrite: bool = False,
    need_bytes: int = 0,
    shown_out: object = None,
    what: Optional[str] = None,
    checked: bool = False,
    scratch: bool = False,
) -> Iterator[Stage]:
    """Preflight OUT (:func:`preflight`; ``checked``: the caller just did), lock it, sweep what killed runs
    left, stamp ``watch`` (files) and ``watch_folders`` (their entries), and yield a :class:`Stage` beside
    OUT; the block writes ``stage.path`` and calls ``stage.commit()``. ``scratch``: the staging folder
    holds the result as ``stage.path`` (not created) and room for anything else beside it (a converter's
    log, the ``latest`` file it writes beside its output); else it is the result. Whatever happens, the
    staging folder is removed and the lock let go at the end: a block that raises (or never commits)
    leaves no OUT it did not find, and the old OUT where it was."""
    out = Path(out)
    if not checked:
        preflight(
            out,
            writer,
            error,
            sources=sources,
            overwrite=overwrite,
            need_bytes=need_bytes,
            shown_out=shown_out,
            what=what,
        )
    stage_lock = OutLock(out)
    stage_lock.acquire(writer, error)
    root: Optional[Path] = None
    try:
        sweep(out)
        watched, folders = list(watch), list(watch_folders)
        before = snapshot([*watched, *listing(folders)])
        root = out.parent / _BY_MARK[WRITERS[writer].mark].name(out.name, os.getpid())
        try:
            os.mkdir(root)
        except OSError as e:
            root = None
            raise error(message("no-stage", writer, parent=out.parent, reason=e.strerror or str(e))) from None
        _active.add(str(root))
        path = root / out.name if scratch else root
        yield Stage(out, root, path, writer, error, overwrite, watched, folders, before)
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
            _active.discard(str(root))
        stage_lock.release()


# ---------------------------------------------------------------------------------------------
# a file replaced in place


@dataclass
class FileStage:
    """A file target's staging: write the new content at :attr:`path` (a new temp file beside the target,
    not yet created), then :meth:`check_unchanged` / :meth:`install`."""

    target: Path
    path: Path
    writer: str
    error: type[Exception]
    watched: list[LocationLike]
    before: dict[str, Optional[Stamp]]

    def check_unchanged(self) -> None:
        check_unchanged(self.before, snapshot(self.watched), self.writer, self.error)

    def install(self) -> None:
        """fsync the temp file, ``os.replace`` it over the target, fsync the folder."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.path, self.target)
        fsync_dir(self.target.parent)


@contextmanager
def staged_file(
    target: Path, *, writer: str, error: type[Exception], watch: Iterable[LocationLike] = (), need_bytes: int = 0
) -> Iterator[FileStage]:
    """The :func:`staged_output` of one file replaced in place: preflight its folder, lock the target (its
    lock file beside it), sweep killed runs' temp files, stamp the target and ``watch``; the block writes
    ``stage.path`` and installs it. The temp file is removed and the lock let go at the end."""
    target = Path(target)
    preflight_file(target.parent, writer, error, need_bytes=need_bytes)
    lk = OutLock(target)
    try:
        lk.acquire(writer, error)
    except OSError as e:
        raise error(refusal(OutputError(_KIND_BY_ERRNO.get(e.errno or 0, "not-writable"), target.parent), writer))
    tmp = target.parent / f".{target.name}{REPAIR_TEMP_MARK}{os.getpid()}"
    _active.add(str(tmp))
    try:
        sweep_file_temps(target)
        watched = [target, *watch]
        yield FileStage(target, tmp, writer, error, watched, snapshot(watched))
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        _active.discard(str(tmp))
        lk.release()


_KIND_BY_ERRNO = {errno.EROFS: "read-only", errno.EACCES: "not-writable", errno.EPERM: "not-writable"}
