"""The converter's watchdog: ``python -m ckpt_tui.core.convert.universal.watchdog PARENT_PID CMD...``.

Started by :func:`~ckpt_tui.core.convert.universal.run.convert_to_universal` with
``start_new_session`` (so it leads its own process group), it runs CMD in that group and SIGKILLs the
whole group — CMD and its pool workers (grandchildren) — when PARENT_PID goes away or it is
signalled:

- it sets its own parent-death signal (``prctl(PR_SET_PDEATHSIG)``; done here rather than in a
  ``preexec_fn`` of the caller, so callers with threads — the TUI — stay safe) and checks that its
  parent is still the one that started it;
- it starts CMD with ``PR_SET_PDEATHSIG(SIGKILL)`` in ``preexec_fn`` (this process has no threads);
- it polls its parent pid: when ckpt-tui dies (even by ``kill -9``) it is reparented, or its death
  signal fires, and it kills the group;
- when CMD ends it kills what CMD left in the group and exits with CMD's status (128 + N for a
  signal N).

Standard library only. ``-m`` first imports the packages above it (``universal/__init__`` brings
``plan``, ``run``, ``verify``: no torch, tens of milliseconds); a parent that dies before ``main``
sets the death signal is caught by the ``getppid`` check. ``run`` imports this module only inside
a function, so ``-m`` finds it not yet imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
# The caller puts the folder holding its own ckpt_tui first on PYTHONPATH, so that ``-m`` runs this
# very copy from any working directory; CMD gets the PYTHONPATH it had, saved in this variable as
# "+<value>", or "-" where it was unset.
PYTHONPATH_VAR = "CKPT_TUI_WATCHDOG_PYTHONPATH"


def _killgroup(*_: object) -> None:  # a signal handler: (signum, frame)
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(137)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    saved = env.pop(PYTHONPATH_VAR, None)
    if saved == "-":
        env.pop("PYTHONPATH", None)
    elif saved is not None:
        env["PYTHONPATH"] = saved[1:]
    return env


def main(argv: list[str]) -> int:
    parent, cmd = int(argv[0]), argv[1:]
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, _killgroup)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        _killgroup()

    def pdeath() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    p = subprocess.Popen(cmd, preexec_fn=pdeath, stdin=subprocess.DEVNULL, env=_child_env())
    while True:
        try:
            rc = p.wait(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                _killgroup()
    me = os.getpid()
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != me:
            try:
                if os.getpgid(int(d)) == me:
                    os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
