"""Helpers shared by the tests."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def torchrun(script, *args, nproc: int = 2, cwd=None, timeout: int = 400) -> list[dict]:
    """Run a script on ``nproc`` CPU ranks the way the fixtures are made; return the JSON of its
    ``RESULT {...}`` lines (asserting it succeeded)."""
    from ckpt_tui.samples import launch_env

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            str(script),
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        env=launch_env(),
        timeout=timeout,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]


def as_nobody(fn):
    """Run fn() in a forked child that dropped root (CI runs as root, which reads everything);
    return its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 99
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            os.write(w, json.dumps(fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)


F_SETSIG = getattr(fcntl, "F_SETSIG", 10)  # Linux; not every Python exposes it


class FileLease:
    """A file that makes whoever opens it wait until the test lets go: a kernel write lease
    (``fcntl(F_SETLEASE)``) held by the test. While it is held, any other ``open()`` of the file —
    by another process or by another thread of this one — waits in the kernel until
    :meth:`release`. A test uses it to stop a real run at a known point, whatever the machine's
    load: an export copies ``tokenizer.model`` after it wrote every tensor and before it verifies
    and renames; DeepSpeed's converter reads every rank's optimizer states mid-conversion.

    Only on a file the test made itself: it blocks every reader, other tests' too, so never a file
    of the shared fixture cache (copy it first). :meth:`blocked` says that an ``open()`` waits on
    it. The kernel ends that wait by itself after ``/proc/sys/fs/lease-break-time`` seconds (45 by
    default): act on it at once, or freeze the waiting process (:func:`freeze`) first.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.fd: int | None = os.open(self.path, os.O_RDONLY)
        try:
            # the kernel tells the holder that someone waits with a signal: SIGIO by default, which
            # would kill this process; SIGURG is ignored unless handled
            fcntl.fcntl(self.fd, F_SETSIG, signal.SIGURG)
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError:
            os.close(self.fd)
            raise

    def blocked(self) -> bool:
        """Whether an open() of the file is waiting for us (the lease is being broken)."""
        return self.fd is not None and fcntl.fcntl(self.fd, fcntl.F_GETLEASE) != fcntl.F_WRLCK

    def wait_blocked(self, proc=None, timeout: float = 120.0) -> None:
        """Wait until an open() of the file waits for us; fail at once if ``proc`` ends first."""
        end = time.monotonic() + timeout
        while not self.blocked():
            if proc is not None and proc.poll() is not None:
                err = proc.stderr.read() if getattr(proc, "stderr", None) else ""
                raise AssertionError(
                    f"the process ended (exit {proc.returncode}) before it opened {self.path.name}: {err}"
                )
            if time.monotonic() > end:
                raise AssertionError(f"nothing opened {self.path.name} within {timeout:.0f} s")
            time.sleep(0.01)

    def release(self) -> None:
        """Let the waiting open() (and every later one) through."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "FileLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, Z, …); "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def freeze(proc, timeout: float = 60.0) -> None:
    """SIGSTOP ``proc`` and wait until the kernel reports it stopped: from then on it does nothing
    until SIGCONT (or dies on SIGKILL), however long the test takes."""
    os.kill(proc.pid, signal.SIGSTOP)
    end = time.monotonic() + timeout
    while process_state(proc.pid) not in ("T", "t"):
        if proc.poll() is not None or process_state(proc.pid) in ("", "Z", "X"):
            raise AssertionError(f"the process ended (exit {proc.poll()}) before it could be frozen")
        if time.monotonic() > end:
            raise AssertionError(f"the process did not stop within {timeout:.0f} s")
        time.sleep(0.005)


def ckpt_tui(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed `ckpt-tui` command on this checkout (PYTHONPATH), run in ``cwd`` (``env``: variables added)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ,
        PYTHONPATH=str(root),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(env or {}),
    )
    return subprocess.run(["ckpt-tui", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def load_optimizer_export(out: Path) -> dict:
    """The tensors of an optimizer export in ``out``: its one file, or every shard its index names."""
    from safetensors.torch import load_file

    index = out / "optimizer.safetensors.index.json"
    if not index.exists():
        return load_file(out / "optimizer.safetensors")
    sd = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        sd.update(load_file(out / shard))
    return sd
