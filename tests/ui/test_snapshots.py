"""SVG snapshots of the main screen (dark, light, NO_COLOR) and the help screen at 80×24.

On a DeepSpeed fixture, whose file sizes do not depend on where the fixture cache lives.
Update with `pytest tests/ui/test_snapshots.py --snapshot-update` after a deliberate change.
"""

import time

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.details import TensorTable


def _ready(theme=None):
    async def run_before(pilot):
        app = pilot.app
        t0 = time.monotonic()
        tree = app.query_one("#tree")

        def settled():
            node = tree.cursor_node
            return (app.report is not None and app.query_one(TensorTable).rows and node is not None
                    and node.data is not None and app.selected is not None and node.data.path == app.selected.path
                    and node.data.path != ".")

        while not settled():
            if time.monotonic() - t0 > 30:
                break
            await pilot.pause(0.05)
        if theme:
            app.theme = theme
        await pilot.pause(0.2)

    return run_before


def test_main_dark(snap_compare, real_ckpt):
    assert snap_compare(make_app(real_ckpt("ds-zero2-bf16")), terminal_size=(80, 24), run_before=_ready())


def test_main_light(snap_compare, real_ckpt):
    assert snap_compare(make_app(real_ckpt("ds-zero2-bf16")), terminal_size=(80, 24),
                        run_before=_ready("textual-light"))


def test_main_no_color(snap_compare, real_ckpt, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(make_app(real_ckpt("ds-zero2-bf16")), terminal_size=(80, 24), run_before=_ready())


def test_help(snap_compare, real_ckpt):
    assert snap_compare(make_app(real_ckpt("ds-zero2-bf16")), terminal_size=(80, 24), run_before=_ready(),
                        press=["question_mark"])
