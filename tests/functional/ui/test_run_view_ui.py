"""The TUI's run view (issue 28) on real run folders: selecting the run (the tree's top line) shows the run view, the chart
plots exactly log_history's series, the selected checkpoint is the chart's highlighted step, a run without history
has no chart and says why, a small pane a Sparkline; the chart library is loaded only then. Snapshots at 80×24,
120×40 and NO_COLOR (update with `pytest tests/functional/ui/test_run_view_ui.py --snapshot-update`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from textual.widgets import DataTable, Sparkline

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets import run_view as run_widget
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.fixtures import fixture_path


async def _settled(pilot):
    app = pilot.app
    t0 = time.monotonic()
    while (
        app.report is None
        or not app.query("#run-table")
        or not app.main.query_one("#run-table").row_count
        or not app.main.query_one(run_widget.RunPanel).drawn  # the chart is drawn after the table is painted
    ):
        assert time.monotonic() - t0 < 60, "the run view did not appear"
        await pilot.pause(0.05)
    app.main.query_one(CheckpointTree).select_path(".")  # the run itself: its run view
    await pilot.pause(0.3)


@pytest.mark.parametrize("variant,sub", [("hf-fsdp2", "."), ("hf-killed-save", "run"), ("hf-ds-zero2", ".")])
async def test_the_chart_plots_log_history(variant, sub):
    run = fixture_path(variant) / sub
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:
        await _settled(pilot)
        panel = app.main.query_one(run_widget.RunPanel)
        assert "run" in app.main.query_one("#right").classes  # the first screen is the run view
        view = app.main.run_view
        newest = view.newest_complete
        log = json.loads((run / newest.path / "trainer_state.json").read_text())["log_history"]
        for key in ("loss", "learning_rate"):
            pts = [(e["step"], e[key]) for e in log if key in e]
            assert panel.plotted[key] == ([s for s, _ in pts], [v for _, v in pts])
        assert panel.chart is not None and panel.chart.display
        # the selected checkpoint is the chart's highlighted step: the newest, selected at start, then a row moved to
        assert panel.selected_step == view.rows[0].step
        table = app.main.query_one("#run-table", DataTable)
        table.move_cursor(row=len(view.rows) - 1)
        await pilot.pause(0.2)
        assert panel.selected_step == view.rows[-1].step


@pytest.mark.parametrize("variant", ["torchtitan", "lightning-fsdp"])
async def test_no_history_no_chart_and_why(variant):
    app = make_app(fixture_path(variant))
    async with app.run_test(size=(120, 40)) as pilot:
        await _settled(pilot)
        panel = app.main.query_one(run_widget.RunPanel)
        assert panel.chart is None and panel.plotted == {}
        note = str(panel.query_one("#run-no-chart").render())
        assert note.startswith("no chart:") and "trainer_state.json" in note


async def test_a_small_pane_shows_a_sparkline():
    app = make_app(fixture_path("hf-fsdp2"))
    async with app.run_test(size=(60, 16)) as pilot:
        await _settled(pilot)
        panel = app.main.query_one(run_widget.RunPanel)
        assert panel.query_one(Sparkline).display and not panel.chart.display
        assert list(panel.query_one(Sparkline).data) == panel.plotted["loss"][1]


def test_the_chart_library_is_loaded_only_for_a_run_with_history():
    code = (
        "import sys; from ckpt_tui.ui.app import make_app; from ckpt_tui.cli import main\n"
        "print('LOADED', [m for m in ('textual_plotext', 'plotext') if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED []" in r.stdout, r.stdout + r.stderr


def _snap_app(monkeypatch):
    monkeypatch.setattr(run_widget, "written_text", lambda t, now=None: "10:00")  # the fixture cache's mtimes vary
    path = fixture_path("hf-killed-save")
    monkeypatch.chdir(path)
    return make_app("run")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_run_view_snapshot(snap_compare, monkeypatch, size):
    assert snap_compare(_snap_app(monkeypatch), terminal_size=size, run_before=_settled)


def test_run_view_snapshot_no_color(snap_compare, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(_snap_app(monkeypatch), terminal_size=(80, 24), run_before=_settled)


async def test_at_80x24_the_run_table_fits_without_scrolling_sideways():
    app = make_app(fixture_path("hf-killed-save") / "run")
    async with app.run_test(size=(80, 24)) as pilot:
        await _settled(pilot)
        table = app.main.query_one("#run-table", DataTable)
        assert table.virtual_size.width <= table.scrollable_content_region.width, "the run table scrolls sideways"
        assert not table.show_horizontal_scrollbar or table.max_scroll_x == 0
        compositor = app.screen._compositor
        r = compositor.find_widget(table).visible_region
        lines = [s.text[r.x : r.right] for s in compositor.render_strips()[r.y : r.bottom]]
        assert lines[0].split() == ["step", "saved", "hold", "model", "optim", "other", "loss", "eval", "state"]
        # every checkpoint's state shown: the complete one's ✔, the killed save's ✖ and the start of why
        assert lines[1].split()[0] == "4" and "✖ no" in lines[1]
        assert lines[2].split()[0] == "●2" and lines[2].rstrip().endswith("✔")


def test_compact_cells():
    assert [run_widget.short_size(n) for n in (0, 717, 9_400, 462_200, 999_600, 1_400_000, 21 * 10**9)] == [
        "—",
        "717B",
        "9.4K",
        "462K",
        "1.0M",
        "1.4M",
        "21G",
    ]
    assert [run_widget.short_step(s) for s in (0, 2, 999_999, 1_234_000, 12_300_000)] == [
        "0",
        "2",
        "999999",
        "1234k",
        "12.3M",
    ]
    now = time.mktime((2026, 12, 7, 16, 30, 0, 0, 0, -1))
    assert run_widget.written_text(now - 60, now=now) == "16:29"
    assert run_widget.written_text(now - 3 * 86400, now=now) == "12-04"
    assert run_widget.written_text(None) == "—"
