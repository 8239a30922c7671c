"""The run view's panel (core/run_view.py): a DataTable of the run's checkpoints over a chart of the training and
eval loss (the learning rate on its own, right-hand axis), each checkpoint's step a vertical line, the selected one
named in the title. The chart (textual-plotext) is imported when a run with a history is shown, never before:
`ckpt-tui --help` and the first paint do not load it. Below MIN_CHART a Sparkline of the loss; no history, no chart
and a line saying why."""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from ...core.run_view import RunView, Series
from ..format import visible

MIN_CHART = (40, 8)  # (width, height) below which the chart is a Sparkline
MAX_POINTS = 4000  # a longer series is thinned to this many points for the chart (the table reads every value)

HOLDS = (("model", "M"), ("optimizer", "O"), ("scheduler", "S"), ("rng", "R"))


def _metric(v: Optional[float]) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if math.isfinite(v) else str(v)


def _size(n: int) -> str:
    from ...core.units import naturalsize

    return naturalsize(n) if n else "—"


def written_text(t: Optional[float]) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t)) if t is not None else "—"


def plottable(series: Series) -> tuple[list[int], list[float]]:
    """(steps, values) of ``series`` as the chart plots them: the finite values, in log_history's order, thinned to
    at most MAX_POINTS (every k-th, and the last)."""
    pts = [(s, v) for s, v in series if math.isfinite(v)]
    if len(pts) > MAX_POINTS:
        k = math.ceil(len(pts) / MAX_POINTS)
        pts = pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])
    return [s for s, _ in pts], [v for _, v in pts]


class RunPanel(Vertical):
    """The run view: the checkpoints' table, and under it the loss chart (or a Sparkline, or why there is none)."""

    DEFAULT_CSS = """
    RunPanel { height: 1fr; }
    RunPanel #run-table { height: auto; max-height: 45%; }
    RunPanel #run-totals { height: auto; padding: 0 1; color: $text-muted; }
    RunPanel #run-chart-box { height: 1fr; min-height: 3; border-top: solid $primary; }
    RunPanel #run-no-chart { padding: 0 1; color: $text-muted; }
    RunPanel Sparkline { height: 2; margin: 0 1; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.view: Optional[RunView] = None
        self.selected_step: Optional[int] = None
        self.plotted: dict[str, tuple[list[int], list[float]]] = {}  # what the chart was last given, by series
        self.chart: Any = None  # the PlotextPlot, once a history is shown

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="run-table", cursor_type="row", zebra_stripes=False)
        yield table
        yield Static("", id="run-totals")
        with Vertical(id="run-chart-box"):
            yield Static("", id="run-no-chart")
            yield Sparkline([], id="run-spark")

    # ------------------------------------------------------------------ data
    def set_view(self, view: RunView) -> None:
        self.view = view
        table = self.query_one("#run-table", DataTable)
        table.clear(columns=True)
        eval_name = visible(view.eval_name or "eval")
        table.add_columns("", "step", "written", "holds", "model", "optim", "other", "loss", eval_name[:12], "state")
        for r in view.rows:
            mark = ("★" if r.best else "") + ("●" if r.newest_complete else "")
            holds = "".join(letter if what in r.holds else "-" for what, letter in HOLDS)
            state = Text("✔", style="green") if r.complete else Text("✖ " + visible("; ".join(r.problems)), style="red")
            table.add_row(
                mark,
                Text(str(r.step), justify="right"),
                written_text(r.written),
                holds,
                Text(_size(r.model_bytes + r.combined_bytes), justify="right"),
                Text(_size(r.optimizer_bytes), justify="right"),
                Text(_size(r.other_bytes), justify="right"),
                Text(_metric(r.loss), justify="right"),
                Text(_metric(r.eval_metric), justify="right"),
                state,
                key=r.path,
            )
        from ...core.units import naturalsize

        share = f" ({100 * view.optimizer_bytes / view.total_bytes:.0f}%)" if view.total_bytes else ""
        combined = sum(r.combined_bytes for r in view.rows)
        self.query_one("#run-totals", Static).update(
            Text(
                f"run {naturalsize(view.total_bytes)}, optimizer states {naturalsize(view.optimizer_bytes)}{share}"
                + (f", model+optimizer files {naturalsize(combined)}" if combined else "")
                + "   ● newest complete  ★ best"
            )
        )
        self._draw()

    def selected_path(self) -> Optional[str]:
        row = next((r for r in self.view.rows if r.step == self.selected_step), None) if self.view else None
        return row.path if row is not None else None

    def select(self, path: Optional[str]) -> None:
        """Highlight the checkpoint at ``path`` (a run checkpoint's relative path) in the table and the chart."""
        if self.view is None:
            return
        row = self.view.row(path) if path else None
        step = row.step if row is not None else None
        if row is not None:
            table = self.query_one("#run-table", DataTable)
            idx = [r.path for r in self.view.rows].index(row.path)
            if table.cursor_row != idx:
                table.move_cursor(row=idx)
        if step != self.selected_step:
            self.selected_step = step
            self._draw()

    # ------------------------------------------------------------------ the chart
    def on_resize(self) -> None:
        self._show_chart_or_spark()

    def _small(self) -> bool:
        box = self.query_one("#run-chart-box")
        return box.size.width < MIN_CHART[0] or box.size.height < MIN_CHART[1]

    def _show_chart_or_spark(self) -> None:
        has = bool(self.view is not None and self.view.series)
        small = self._small()
        if self.chart is not None:
            self.chart.display = has and not small
        self.query_one("#run-spark", Sparkline).display = has and small

    def _draw(self) -> None:
        view = self.view
        note = self.query_one("#run-no-chart", Static)
        if view is None or not view.series:
            self.plotted = {}
            note.update(Text(f"no chart: {visible(view.no_history if view is not None else '')}"))
            note.display = True
            self._show_chart_or_spark()
            return
        note.display = False
        loss = view.series.get("loss") or next(iter(view.series.values()))
        self.query_one("#run-spark", Sparkline).data = plottable(loss)[1] or [0.0]
        if self.chart is None:
            from textual_plotext import PlotextPlot  # the chart library: loaded now, not at start-up

            self.chart = PlotextPlot(id="run-chart")
            self.query_one("#run-chart-box").mount(self.chart)
        plt = self.chart.plt
        plt.clear_figure()
        plotted: dict[str, tuple[list[int], list[float]]] = {}
        for name, series in view.series.items():
            xs, ys = plottable(series)
            if not xs:
                continue
            plotted[name] = (xs, ys)
            shown = visible(name)
            if name == "learning_rate":
                plt.plot(xs, ys, yside="right", label="lr (right)", marker="dot")
            elif name == "loss":
                plt.plot(xs, ys, label="train loss", marker="braille")
            else:
                plt.plot(xs, ys, label=shown, marker="x" if len(xs) < 50 else "braille")
        for r in view.rows:
            if r.step != self.selected_step:
                plt.vline(r.step, "gray")
        if self.selected_step is not None:
            plt.vline(self.selected_step, "red")
            plt.title(f"▲ step {self.selected_step}")
        plt.xlabel("step")
        self.plotted = plotted
        self.chart.refresh()
        self._show_chart_or_spark()
