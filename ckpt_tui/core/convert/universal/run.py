"""Run a universal conversion: DeepSpeed's own converter in a watched subprocess, then verify, move
into place, write ``latest_universal`` (and the frozen parameters, if asked).

The converter runs under :mod:`.watchdog` (its own process group, killed with ckpt-tui: see there),
writing into the staged output beside OUT (``core/staging.py``: OUT locked, the result a folder inside
the staging folder, where the converter also writes its own ``latest_universal``, thrown away with it).
Cancel and any exception kill the group and remove the staging folder; a change of the source while it
ran discards the result.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ...fsutil import atomic_write
from ...jsondoc import JsonFields, as_json
from ...progress import Cancelled, CancelToken, OnProgress, report
from ...staging import Sources, staged_output
from .frozen import export_frozen
from .instructions import instructions
from .plan import UniversalError, UniversalPlan
from .verify import UniversalVerification, verify_universal

WATCHDOG_MODULE = "ckpt_tui.core.convert.universal.watchdog"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _count_state_files(zdir: Path) -> int:
    n = 0
    try:
        with os.scandir(zdir) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    try:
                        n += sum(1 for x in os.listdir(e.path) if x.endswith(".pt"))
                    except OSError:
                        pass
    except OSError:
        return 0
    return n


def watchdog_command(parent_pid: int, cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """The watchdog's argv and the environment additions that make ``-m`` run this very ckpt_tui
    (the converter gets the PYTHONPATH it would have had)."""
    import ckpt_tui

    # imported here, not at the top: ``-m`` must find the watchdog not yet imported by its package
    from .watchdog import PYTHONPATH_VAR

    root = str(Path(ckpt_tui.__file__).resolve().parent.parent)
    old = os.environ.get("PYTHONPATH")
    env = {
        PYTHONPATH_VAR: "-" if old is None else "+" + old,
        "PYTHONPATH": root if not old else root + os.pathsep + old,
    }
    return [sys.executable, "-m", WATCHDOG_MODULE, str(parent_pid), *cmd], env


def write_latest(folder: Path) -> Path:
    """``latest_universal`` naming ``folder``, in its parent (temp + fsync + os.replace)."""
    return atomic_write(folder.parent / "latest_universal", folder.name)


@dataclass
class UniversalResult(JsonFields):
    json_keys = (
        "out",
        "latest_file",
        "seconds",
        "files",
        "verification",
        "log=log_path",
        "frozen",
        "buffers",
        "frozen_file",
        "instructions",
        "warnings",
    )

    out: Path
    latest_file: Path
    seconds: float
    files: int
    verification: UniversalVerification
    log_path: Optional[Path]
    frozen: list[str]
    buffers: list[str]
    frozen_file: Optional[Path]
    instructions: str
    warnings: list[str] = field(default_factory=list)
    frozen_only: bool = False  # only the frozen parameters were written (the universal folder was there)

    def to_json(self) -> dict[str, Any]:
        return as_json(self, self.json_keys) | {"seconds": round(self.seconds, 3)}


def convert_to_universal(
    plan: UniversalPlan,
    *,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
    log_path: Optional[str | os.PathLike[str]] = None,
    export_frozen_params: Optional[bool] = None,
) -> UniversalResult:
    """Run DeepSpeed's converter for ``plan``, verify, move into place, write ``latest_universal``.

    The converter's output (tqdm, prints) goes to ``log_path`` (default: a file in the temp folder,
    kept beside the output as ``<out>.convert.log`` only on failure). Raises
    :class:`UniversalError` on failure, :class:`Cancelled` on cancel; either way the temp folder is
    removed, nothing is left under the final name and the source is untouched.
    """
    t0 = time.monotonic()
    out = plan.out
    if plan.frozen_only or plan.already:  # the universal folder is there and complete
        frozen_there = plan.frozen_file if (plan.frozen or plan.buffers) and plan.frozen_file.exists() else None
        if plan.frozen_only:  # write only what load_universal cannot restore
            export_frozen(plan.tag_dir, plan.frozen_file)
            frozen_there = plan.frozen_file
        return UniversalResult(
            out=out,
            latest_file=out.parent / "latest_universal",
            seconds=time.monotonic() - t0,
            files=0,
            verification=UniversalVerification(ok=True, checked=0),  # the command says "not converted again"
            log_path=None,
            frozen=list(plan.frozen),
            buffers=list(plan.buffers),
            frozen_file=plan.frozen_file if plan.frozen_only else None,
            instructions=instructions(plan, frozen_there),
            warnings=list(plan.warnings),
            frozen_only=True,
        )
    if export_frozen_params is None:
        export_frozen_params = plan.export_frozen
    own_log = log_path is None
    proc = None
    keep_log_on_failure = out.parent / f"{out.name}.convert.log"
    with staged_output(  # preflight again (time has passed since the plan), lock, the tag's files stamped
        out,
        writer="universal",
        error=UniversalError,
        sources=[Sources(folders=[plan.tag_dir])],
        watch_folders=[plan.tag_dir],
        need_bytes=2 * plan.estimated_bytes,
        scratch=True,
    ) as stage:
        inner = stage.path
        log_file = Path(log_path) if log_path else stage.root / "convert.log"
        try:
            env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
            env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
            cmd, wenv = watchdog_command(os.getpid(), plan.command(inner))
            env.update(wenv)
            with open(log_file, "ab") as log:
                log.write(("$ " + " ".join(plan.command(inner)) + "\n").encode())
                log.flush()
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(stage.root),
                    start_new_session=True,
                    close_fds=True,
                )
            total = plan.expected_files
            last = -1
            while True:
                if cancel is not None and cancel.is_set():
                    _kill_group(proc)
                    raise Cancelled("cancelled")
                try:
                    rc = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                done = min(_count_state_files(inner / "zero"), total)
                if done != last:
                    report(on_progress, done, total, "files", "converting")
                    last = done
            _kill_group(proc)  # pool workers left behind, if any
            if rc != 0:
                tail = _tail(log_file)
                if own_log:  # a new file renamed into place: never written through a link planted under that name
                    atomic_write(keep_log_on_failure, Path(log_file).read_bytes())
                raise UniversalError(
                    f"DeepSpeed's converter failed (exit {rc}): {tail}"
                    + (f" (full log: {keep_log_on_failure})" if own_log else f" (log: {log_file})")
                )
            report(on_progress, total, total, "files", "converting")
            stage.check_unchanged()
            report(on_progress, 0, None, "files", "verifying")
            ver = verify_universal(inner, plan.tag_dir, cancel=cancel)
            if not ver.ok:
                raise UniversalError("the converted checkpoint failed verification: " + "; ".join(ver.problems[:5]))
            files = sum(len(fs) for _, _, fs in os.walk(inner))
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled")
            stage.commit()
            latest = write_latest(out)
        except BaseException:
            if proc is not None and proc.poll() is None:
                _kill_group(proc)
            elif proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            raise
    final_log = None if own_log else log_file
    frozen_file = None
    if export_frozen_params and (plan.frozen or plan.buffers):
        export_frozen(plan.tag_dir, plan.frozen_file)
        frozen_file = plan.frozen_file
    return UniversalResult(
        out=out,
        latest_file=latest,
        seconds=time.monotonic() - t0,
        files=files,
        verification=ver,
        log_path=final_log,
        frozen=list(plan.frozen),
        buffers=list(plan.buffers),
        frozen_file=frozen_file,
        instructions=instructions(plan, frozen_file),
        warnings=list(plan.warnings) + ver.notes,
    )


def _tail(path: Path, n: int = 600) -> str:
    try:
        data = Path(path).read_bytes()[-8000:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    lines = [ln for ln in data.splitlines() if ln.strip() and "%|" not in ln]
    for ln in reversed(lines):
        if "Error" in ln or "assert" in ln.lower():
            return ln.strip()[:n]
    return (lines[-1].strip() if lines else "(empty log)")[:n]
