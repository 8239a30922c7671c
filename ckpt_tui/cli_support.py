"""What every command shares: the error message + exit code, and running a long core function
under a progress bar with the exit-code contract (0 ok · 1 failed · 2 bad path/usage · 130 interrupted).

Kept apart from ``cli.py`` so that the commands defined in their own modules (``cli_fix``,
``cli_universal``) can import it without importing the main group.
"""

from __future__ import annotations

import sys

import click

from .core.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_USAGE


def fail(msg: str, code: int) -> "NoReturn":  # noqa: F821
    click.echo(f"ckpt-tui: {msg}", err=True)
    sys.exit(code)


def _progress(as_json: bool, unit: str):
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)

    cols = [TextColumn("{task.description}"), BarColumn()]
    cols += [DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else [MofNCompleteColumn()]
    cols.append(TimeRemainingColumn())
    return Progress(*cols, console=Console(stderr=True), transient=True, disable=as_json)


def run_core(fn, *, as_json: bool, unit: str = "bytes", label: str = "", cleanup: str = ""):
    """Call ``fn(on_progress=..., cancel=...)`` with a progress bar on stderr (one bar per step
    label, e.g. writing / verifying) and map its errors to the exit codes. ``cleanup`` is said
    after an interruption (e.g. "the partial output was removed")."""
    import threading

    from .core.export.write import ExportError
    from .core.formats import FormatError
    from .core.progress import Cancelled
    from .core.scan import ScanError

    cancel = threading.Event()
    after = f"; {cleanup}" if cleanup else ""
    with _progress(as_json, unit) as bar:
        tasks: dict[str, int] = {}

        def on_progress(p):
            step = label or p.label or "working"
            if step not in tasks:
                tasks[step] = bar.add_task(step[:40], total=p.total)
            bar.update(tasks[step], completed=p.done, total=p.total)

        try:
            return fn(on_progress=on_progress, cancel=cancel)
        except KeyboardInterrupt:
            cancel.set()
            fail("interrupted" + after, EXIT_INTERRUPTED)
        except Cancelled:
            fail("cancelled" + after, EXIT_INTERRUPTED)
        except ScanError as e:
            fail(str(e), EXIT_USAGE)
        except (ExportError, FormatError, ValueError) as e:
            fail(str(e), EXIT_FINDINGS)
        except OSError as e:
            fail(f"{e.strerror or e}: {getattr(e, 'filename', '') or ''}{after}", EXIT_FINDINGS)
