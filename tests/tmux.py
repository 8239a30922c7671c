"""A real terminal for end-to-end tests: a command inside a detached tmux session (a pty, as over SSH)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid

HAVE_TMUX = shutil.which("tmux") is not None


class Tmux:
    """``Tmux(cmd, env)`` runs ``cmd`` in a fresh session; after it ends the shell prints ``rc=N`` and the
    pane stays open, so a test can read what was left on the screen and the exit code.

    Each instance has its own tmux server (``-L``), started with this process's environment plus ``env``:
    a server left running by someone else would otherwise hand the command its own environment (another
    checkout's PYTHONPATH, say)."""

    def __init__(self, cmd: str, env: dict | None = None, size: tuple[int, int] = (80, 24), cwd=None):
        self.name = f"ckpt-{uuid.uuid4().hex[:8]}"
        envs = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
        shell = f"env {envs} {cmd}; echo rc=$?; sleep 600"
        args = ["new-session", "-d", "-s", self.name, "-x", str(size[0]), "-y", str(size[1])]
        if cwd is not None:
            args += ["-c", str(cwd)]
        self._tmux(*args, shell, check=True)

    def _tmux(self, *args: str, check: bool = False) -> str:
        return subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True, check=check).stdout

    def keys(self, *keys: str) -> None:
        for k in keys:
            self._tmux("send-keys", "-t", self.name, k, check=True)

    def resize(self, width: int, height: int) -> None:
        """Resize the terminal, as a user dragging the window's edge does."""
        self._tmux("resize-window", "-t", self.name, "-x", str(width), "-y", str(height), check=True)

    def screen(self, history: int = 0) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-t", self.name, *(["-S", f"-{history}"] if history else []))

    def alternate_screen(self) -> bool:
        """True while a full-screen program holds the terminal's alternate screen."""
        return self._tmux("display-message", "-p", "-t", self.name, "#{alternate_on}").strip() == "1"

    def wait_for(self, text: str, timeout: float = 60.0, history: int = 0) -> str:
        """Wait until ``text`` is on the screen (a state, not a number of seconds: the timeout only
        bounds a failure)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.screen(history)
            if text in s:
                return s
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not on screen:\n{self.screen(history)}")

    def wait_for_all(self, *texts: str, timeout: float = 60.0) -> str:
        """Wait until every one of ``texts`` is on the screen; the screen then. One capture can land while a frame is
        still being written to the terminal: what a test asserts on is waited for, never read off the capture that
        showed something else."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.screen()
            if all(t in s for t in texts):
                return s
            time.sleep(0.1)
        s = self.screen()
        raise AssertionError(f"{[t for t in texts if t not in s]!r} not on screen:\n{s}")

    def wait_gone(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text in self.screen():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} still on screen:\n{self.screen()}")
            time.sleep(0.1)

    def enter_through(self, *steps: str) -> None:
        """Press enter once per wizard step, each after the screen shows the step: a key pressed
        before the step is drawn could land on the previous one."""
        for label in steps:
            self.keys("Enter")
            self.wait_for(label)

    def export_with_defaults(self, timeout: float = 60.0) -> str:
        """Press `e` and take every default of the export wizard; the screen once the export finished."""
        self.keys("e")
        self.wait_for("Export to safetensors")
        self.wait_for("Step 1 of 5")
        self.enter_through("Step 2 of 5", "Step 3 of 5", "Step 4 of 5", "Step 5 of 5")  # source, output, dtype, shards
        self.wait_for("Press enter to export")
        self.keys("Enter")
        return self.wait_for("Export finished", timeout=timeout)

    def close_dialog_and_quit(self, dialog: str) -> int:
        """Close the dialog showing ``dialog`` with enter, quit with `q`: the app's exit code."""
        self.keys("Enter")
        self.wait_gone(dialog)
        self.keys("q")
        return self.exit_code()

    def exit_code(self, timeout: float = 60.0) -> int:
        s = self.wait_for("rc=", timeout, history=200)
        return int(s.rsplit("rc=", 1)[1].split()[0])

    def close(self) -> None:
        self._tmux("kill-server")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
