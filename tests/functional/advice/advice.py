"""What ckpt-tui tells a user to run, collected from its output and run as a shell would run it.

A *command* is a backticked span (or a line of a result) whose first word is a program a user
would type: ``ckpt-tui``, ``accelerate``, ``python``, ``echo`` ... ``DIR`` in a command is the
user's choice of output folder; the test gives it a fresh path.
"""

from __future__ import annotations

import os
import pty
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = {"ckpt-tui", "accelerate", "python", "python3", "echo", "torchrun", "deepspeed"}
WRITING = {"export", "universal", "fix"}  # ckpt-tui subcommands that write (and take --dry-run)
PEERS = {"accelerate", "python", "python3", "torchrun", "deepspeed"}  # any other program a command runs
BIN = Path(sys.executable).parent  # the venv's bin: ckpt-tui, accelerate


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["COLUMNS"] = "200"  # one finding message per line: nothing wrapped inside a backticked span
    return e


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def is_command(span: str) -> bool:
    try:
        words = shlex.split(span)
    except ValueError:
        return False
    return bool(words) and words[0] in PROGRAMS and len(words) > 1


def commands_in(text: str) -> list[str]:
    """Commands in backticks, and result lines that are a command by themselves (``  ckpt-tui ...``)."""
    found = [s for s in backticked(text) if is_command(s)]
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("ckpt-tui ") and "`" not in s and is_command(s):
            found.append(s)
    return list(dict.fromkeys(found))


def words(cmd: str) -> list[str]:
    return shlex.split(cmd)


def subcommand(cmd: str) -> str:
    w = words(cmd)
    return w[1] if w[0] == "ckpt-tui" else w[0]


def writes(cmd: str) -> bool:
    w = words(cmd)
    return w[0] == "ckpt-tui" and w[1] in WRITING


def with_dir(cmd: str, out: str) -> str:
    """``cmd`` with the placeholder DIR replaced by ``out`` (quoted)."""
    return (
        " ".join(shlex.quote(out) if w == "DIR" else shlex.quote(w) for w in words(cmd)) if "DIR" in words(cmd) else cmd
    )


@dataclass
class Ran:
    cmd: str
    cwd: Path
    rc: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"$ (cd {self.cwd} && {self.cmd})  -> rc={self.rc}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


def run(cmd: str, cwd: Path, *, answer_yes: bool = False, timeout: int = 600) -> Ran:
    """Run ``cmd`` with bash, as typed, from ``cwd``. ``answer_yes``: on a terminal whose user types y
    at every prompt (``ckpt-tui fix`` asks before it writes)."""
    if not answer_yes:
        p = subprocess.run(
            ["bash", "-c", cmd],
            cwd=cwd,
            env=env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Ran(cmd, cwd, p.returncode, p.stdout, p.stderr)
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(
            ["bash", "-c", cmd],
            cwd=cwd,
            env=env(),
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(slave)
        slave = -1
        os.write(master, b"y\n" * 16)
        out, err = p.communicate(timeout=timeout)
        return Ran(cmd, cwd, p.returncode, out, err)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


@dataclass
class Tally:
    """What the corpus ran: printed at the end and quoted in the figures table of docs/safety.md."""

    commands: int = 0  # ckpt-tui commands run (dry runs and real runs counted once each)
    dry_runs: int = 0
    peers: int = 0
    snippets: int = 0
    cases: int = 0
    seen: set = field(default_factory=set)

    def line(self) -> str:
        return (
            f"advice corpus: {self.cases} checkpoints, {self.commands} suggested commands run "
            f"({self.dry_runs} of them with --dry-run first), {self.peers} peer commands, "
            f"{self.snippets} load snippets executed"
        )
