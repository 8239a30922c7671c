"""Run the inspector over a list of paths under a memory limit and a per-case time limit.

    python -m tests.functional.hardening.corpus_runner LIMIT_MB SECONDS PATH...

Prints one JSON line per case: {"path", "outcome": "ok"|"scan-error"|"crash"|"timeout", "codes", "detail"}.
A breach of RLIMIT_AS shows as MemoryError -> "crash"; a hang as "timeout".
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import traceback


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def main(argv: list[str]) -> int:
    limit_mb, seconds, paths = int(argv[0]), float(argv[1]), argv[2:]
    from ckpt_tui.core.report import inspect  # imported before the limit is set
    from ckpt_tui.core.scan import ScanError

    resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    signal.signal(signal.SIGALRM, _alarm)
    for p in paths:
        out = {"path": p}
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            rep = inspect(p)
            out["outcome"] = "ok"
            out["codes"] = sorted({f.code for f in rep.findings})
            out["error"] = rep.has_errors
        except ScanError as e:
            out["outcome"] = "scan-error"
            out["detail"] = str(e)
        except _Timeout:
            out["outcome"] = "timeout"
        except BaseException as e:  # anything else is a bug
            out["outcome"] = "crash"
            out["detail"] = "".join(traceback.format_exception(e))[-2000:]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
