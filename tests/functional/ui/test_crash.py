"""A crash of the terminal UI, made on purpose in a real terminal: the terminal is restored, the user sees one
line and where the full log is, the exit code is 1 — never a full-screen traceback and exit 0."""

import sys

import pytest

from tests.tmux import HAVE_TMUX, Tmux

pytestmark = pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")

# The same runner the CLI uses (ckpt-tui PATH -> ui.run.run_app), on an app broken in one of two ways.
BROKEN = """
import sys
from ckpt_tui.ui.app import CkptApp
from ckpt_tui.ui.run import run_app

class BadStylesheet(CkptApp):
    CSS_PATH = "/nonexistent/ckpt-tui.tcss"

class BadKey(CkptApp):
    def action_help(self):
        raise RuntimeError("broken on purpose by the test")

kind, path, debug = sys.argv[1], sys.argv[2], sys.argv[3] == "debug"
app = {"stylesheet": BadStylesheet, "key": BadKey}[kind](path)
sys.exit(run_app(app, debug=debug))
"""


def _run(tmp_path, kind: str, ckpt, debug: bool = False) -> Tmux:
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    return Tmux(
        f"{sys.executable} {script} {kind} {ckpt} {'debug' if debug else 'plain'}",
        {"TERM": "xterm-256color", "XDG_CACHE_HOME": tmp_path / "cache"},
        size=(100, 30),
    )


@pytest.mark.parametrize("kind,error", [("stylesheet", "StylesheetError"), ("key", "RuntimeError")])
def test_crash_restores_the_terminal_and_says_where_the_log_is(real_ckpt, tmp_path, kind, error):
    ck = real_ckpt("hf-fsdp1") / "checkpoint-2"
    with _run(tmp_path, kind, ck) as t:
        if kind == "key":
            t.wait_for("optimizer in")  # the UI is up and the scan is done
            t.keys("?")
        assert t.exit_code() == 1
        assert not t.alternate_screen()  # the terminal is back to normal
        screen = t.screen(history=200)
    lines = [ln for ln in screen.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("ckpt-tui: ")]
    assert said[0].startswith(f"ckpt-tui: the terminal UI stopped on an error: {error}: "), screen
    assert said[1].startswith("ckpt-tui: the full log is in ") and said[1].endswith("(--debug shows it here)")
    assert lines[-1] == "rc=1" and len(said) == 2, screen
    assert "Traceback" not in screen and "╭" not in screen
    log = tmp_path / "cache" / "ckpt-tui" / "logs"
    [logfile] = log.iterdir()
    assert str(logfile) in said[1]
    text = logfile.read_text()
    assert "Traceback" in text and error in text


def test_debug_shows_the_traceback(real_ckpt, tmp_path):
    ck = real_ckpt("hf-fsdp1") / "checkpoint-2"
    with _run(tmp_path, "stylesheet", ck, debug=True) as t:
        assert t.exit_code() == 1
        screen = t.screen(history=300)
    assert "StylesheetError" in screen and "unable to read CSS file" in screen
    assert "ckpt-tui: the terminal UI stopped on an error: StylesheetError" in screen
    assert not (tmp_path / "cache" / "ckpt-tui" / "logs").exists()  # the traceback is on the screen instead
