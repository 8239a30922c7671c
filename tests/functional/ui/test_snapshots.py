"""SVG snapshots of the main screen (dark, light, NO_COLOR) and the help screen at 80×24, and of the main
screen at 80×24, 120×40 and 200×50 on a DeepSpeed ZeRO-2 and on an HF Trainer FSDP checkpoint (what is cut at
which width: issue 12; tests/functional/ui/test_widths.py asserts it on the rendered text).

On a DeepSpeed fixture, whose file sizes do not depend on where the fixture cache lives, opened by a relative
path from its parent folder (as a user there would), so the paths its findings show do not either.
Update with `pytest tests/functional/ui/test_snapshots.py --snapshot-update` after a deliberate change.
"""

import time

import pytest

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.details import TensorTable


def _ready(theme=None):
    async def run_before(pilot):
        app = pilot.app
        t0 = time.monotonic()

        def settled():
            if not app.query("#tree"):
                return False  # the main screen is not composed yet
            node = app.query_one("#tree").cursor_node
            tensors = app.query_one(TensorTable)
            return (
                app.report is not None
                and tensors.rows
                and node is not None
                and node.data is not None
                and app.selected is not None
                and node.data.path == app.selected.path
                and node.data.path != "."
                and tensors.is_drawn()
            )

        picked = False
        while not settled():
            assert time.monotonic() - t0 < 60, "the main screen did not settle"
            if not picked and app.report is not None and app.main.run_view is not None and app.selected is not None:
                # a run folder opens on its run view (issue 28): these snapshots are of its newest checkpoint
                app.query_one("#tree").select_path(app.main.run_view.rows[0].path)
                picked = True
            await pilot.pause(0.05)
        if theme:
            app.theme = theme
        # a state, not a number of seconds: the screen is drawn when two renders in a row are the same
        # (a screen covered by a dialog later keeps its last render, so it must be final before a key)
        last = None
        while (shot := app.export_screenshot()) != last:
            assert time.monotonic() - t0 < 60, "the main screen kept changing"
            last = shot
            await pilot.pause(0.1)

    return run_before


def _app(real_ckpt, monkeypatch, key="ds-zero2-bf16"):
    path = real_ckpt(key)
    monkeypatch.chdir(path.parent)
    return make_app(path.name)


def test_main_dark(snap_compare, real_ckpt, monkeypatch):
    assert snap_compare(_app(real_ckpt, monkeypatch), terminal_size=(80, 24), run_before=_ready())


def test_main_light(snap_compare, real_ckpt, monkeypatch):
    assert snap_compare(_app(real_ckpt, monkeypatch), terminal_size=(80, 24), run_before=_ready("textual-light"))


def test_main_no_color(snap_compare, real_ckpt, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(_app(real_ckpt, monkeypatch), terminal_size=(80, 24), run_before=_ready())


def test_help(snap_compare, real_ckpt, monkeypatch):
    assert snap_compare(
        _app(real_ckpt, monkeypatch), terminal_size=(80, 24), run_before=_ready(), press=["question_mark"]
    )


@pytest.mark.parametrize("key", ["ds-zero2-bf16", "hf-fsdp1"])
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_width(snap_compare, real_ckpt, monkeypatch, key, size):
    assert snap_compare(_app(real_ckpt, monkeypatch, key), terminal_size=size, run_before=_ready())
