"""Run the terminal UI; a crash becomes one line on stderr, a log file and exit code 1.

Textual restores the terminal on any exit. An exception that escapes the app (a missing stylesheet, a bug in a
handler) would otherwise end in a full-screen traceback and exit code 0; here it ends as::

    ckpt-tui: the terminal UI stopped on an error: StylesheetError: unable to read CSS file ...
    ckpt-tui: the full log is in ~/.cache/ckpt-tui/logs/tui-20261130-201500-4242.log (--debug shows it here)
"""

from __future__ import annotations

import sys
import traceback

from ..core.errors import EXIT_FINDINGS, EXIT_OK


def run_app(app, *, debug: bool = False) -> int:
    """Run ``app`` (a CkptApp) to its end; return the process exit code."""
    app.show_tracebacks = debug
    app.run()
    if app.crash is None and not app.return_code:
        return EXIT_OK
    err = app.crash
    if err is None:  # Textual set a non-zero return code without an exception we saw
        print(f"ckpt-tui: the terminal UI stopped with exit code {app.return_code}", file=sys.stderr)
        return EXIT_FINDINGS
    from ..core.safetext import visible

    first = (str(err).strip().splitlines() or [""])[0]
    print(visible(f"ckpt-tui: the terminal UI stopped on an error: {type(err).__name__}: {first}"), file=sys.stderr)
    if not debug:
        log = write_crash_log(err)
        where = f"the full log is in {log} (--debug shows it here)" if log else "run with --debug to see the traceback"
        print(f"ckpt-tui: {where}", file=sys.stderr)
    return EXIT_FINDINGS


def write_crash_log(err: BaseException):
    """The traceback and versions in a new file under the cache folder; None if it cannot be written."""
    import platform

    from .. import __version__
    from ..core.userdirs import log_file

    try:
        path = log_file("tui")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"ckpt-tui {__version__}, Python {platform.python_version()}, {platform.platform()}\n")
            f.write(f"argv: {sys.argv}\n\n")
            f.write("".join(traceback.format_exception(type(err), err, err.__traceback__)))
        return path
    except OSError:
        return None
