"""The run view's panel (core/run_view.py): a DataTable of the run's checkpoints over a chart of the training and
eval loss (the learning rate on its own, right-hand axis), each checkpoint's step a vertical line, the selected one
named in the title. The chart (textual-plotext) is imported when a run with a history is shown, after the table is
painted, never before: `ckpt-tui --help` and the first paint do not load it. Below MIN_CHART a Sparkline of the loss; no history, no chart
and a line saying why."""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.widgets import DataTable, Sparkline, Static

from ...core.run_view import RunView, Series
from ..format import visible

MIN_CHART = (40, 8)  # (width, height) below which the chart is a Sparkline
TABLE_SHARE = 45  # the table's most height, in percent of the panel's (its rows scroll beyond)
MAX_POINTS = 4000  # a longer series is thinned to this many points for the chart (the table reads every value)

HOLDS = (("model", "M"), ("optimizer", "O"), ("scheduler", "S"), ("rng", "R"))


def _metric(v: Optional[float]) -> str:
    if v is None:
        return "—"
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def short_size(n: int) -> str:
    """A size in at most 4 cells, 1000-based as the rest of the UI (naturalsize): 717B, 9.4K, 462K, 1.4M, 21G."""
    if not n:
        return "—"
    v = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if unit == "B" and v < 1000:
            return f"{n}B"
        if unit != "B":
            if v < 9.95:
                return f"{v:.1f}{unit}"
            if v < 999.5:
                return f"{v:.0f}{unit}"
        v /= 1000
    return f"{v:.0f}E"


def short_step(step: int) -> str:
    """A step in at most 6 cells: as is up to 999999, then in thousands (1234k) or millions (12.3M)."""
    if step < 1_000_000:
        return str(step)
    if step < 10_000_000:
        return f"{step // 1000}k"
    return f"{step / 1e6:.1f}M" if step < 1e9 else f"{step / 1e9:.1f}G"


def written_text(t: Optional[float], now: Optional[float] = None) -> str:
    """When a checkpoint was written, in 5 cells: its time (16:17) if today, else its date (12-07)."""
    if t is None:
        return "—"
    today = time.localtime(time.time() if now is None else now)[:3]
    return time.strftime("%H:%M" if time.localtime(t)[:3] == today else "%m-%d", time.localtime(t))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


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

    DEFAULT_CSS = f"""
    RunPanel {{ height: 1fr; }}
    RunPanel #run-table {{ height: auto; max-height: {TABLE_SHARE}%; }}
    RunPanel #run-totals {{ height: auto; padding: 0 1; color: $text-muted; }}
    RunPanel #run-chart-box {{ height: 1fr; min-height: 3; border-top: solid $primary; }}
    RunPanel #run-no-chart {{ padding: 0 1; color: $text-muted; }}
    RunPanel Sparkline {{ height: 2; margin: 0 1; }}
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.view: Optional[RunView] = None
        self.selected_step: Optional[int] = None
        self.plotted: dict[str, tuple[list[int], list[float]]] = {}  # what the chart was last given, by series
        self.chart: Any = None  # the PlotextPlot, once a history is shown
        self.drawn = False  # the chart (its Sparkline, or why there is none) shows the view and the selection
        self._draw_asked = False
        self._selected_path: Optional[str] = None  # the highlighted row's, kept for a table filled later
        self._filled_width = -1  # the table's width when its rows were last made
        self._draw_after_layout = False  # a view set before the panel was laid out: drawn after that layout

    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="run-table", cursor_type="row", zebra_stripes=False, cell_padding=0)
        yield table
        yield Static("", id="run-totals")
        with Vertical(id="run-chart-box"):
            yield Static("", id="run-no-chart")
            spark = Sparkline([], id="run-spark")
            spark.display = False
            yield spark

    # ------------------------------------------------------------------ data
    def set_view(self, view: RunView, size_hint: Optional[Size] = None) -> None:
        """Show ``view``. The table is filled at once at this panel's size, or while the panel is not laid out yet
        (hidden until now) at ``size_hint``, the size its screen expects it to get: filled before the layout that
        shows it, the table is in that layout's frame; a wrong guess is filled again at the real width (on_resize).
        The chart is drawn after the next refresh (``_ask_draw``), so the table is painted first."""
        self.view = view
        self._filled_width = -1
        self.drawn = False
        laid_out = bool(self.size.width)
        self._draw_after_layout = not laid_out  # the chart waits for the frame that shows the table
        size = self.size if laid_out else size_hint
        if size is not None and size.width:
            self._fill(size)
        from ...core.units import naturalsize

        share = f" ({100 * view.optimizer_bytes / view.total_bytes:.0f}%)" if view.total_bytes else ""
        combined = sum(r.combined_bytes for r in view.rows)
        self.query_one("#run-totals", Static).update(
            Text(
                f"run {naturalsize(view.total_bytes)}, optimizer states {naturalsize(view.optimizer_bytes)}{share}"
                + (f", model+optimizer files {naturalsize(combined)}" if combined else "")
                + f"   eval: {visible(view.eval_name or '—')}\n● newest complete  ★ best"  # the legend: a line of its own
            )
        )
        self._ask_draw()

    def _fill(self, size: Optional[Size] = None) -> None:
        """The table, fitted to its width: each cell a leading space and its compact text (no cell padding), the
        state column what is left, its problems cut with … -- no sideways scrolling at 80 columns. Whether its rows
        overflow (a scrollbar takes room) is reckoned from the panel's height and the table's share of it: filled
        before it is laid out, the table's own height says nothing yet."""
        view = self.view
        if view is None:
            return
        table = self.query_one("#run-table", DataTable)
        cursor = table.cursor_row
        size = size or self.size
        room = size.width  # the table's, less a scrollbar when its rows overflow its height
        self._filled_width = room
        overflows = len(view.rows) + 1 > max(2, size.height * TABLE_SHARE // 100)  # its rows and the header
        bar = table.styles.scrollbar_size_vertical if overflows else 0
        cells = []
        for r in view.rows:
            mark = ("★" if r.best else "") + ("●" if r.newest_complete else "")
            cells.append(
                [
                    f"{mark}{short_step(r.step)}",
                    written_text(r.written),
                    "".join(letter if what in r.holds else "-" for what, letter in HOLDS),
                    short_size(r.model_bytes + r.combined_bytes),
                    short_size(r.optimizer_bytes),
                    short_size(r.other_bytes),
                    _metric(r.loss),
                    _metric(r.eval_metric),
                ]
            )
        heads = ["step", "saved", "hold", "model", "optim", "other", "loss", "eval"]
        widths = [max([len(h)] + [len(c[i]) for c in cells]) + 1 for i, h in enumerate(heads)]
        state_room = max(2, room - bar - sum(widths) - 1)
        table.clear(columns=True)
        for h, w in zip(heads, widths):
            table.add_column(Text(" " + h, justify="right"), width=w)
        table.add_column(Text(" state"), width=state_room + 1)
        for r, c in zip(view.rows, cells):
            state = (
                Text(" ✔", style="green")
                if r.complete
                else Text(" " + _cut("✖ " + visible("; ".join(r.problems)), state_room), style="red")
            )
            table.add_row(*(Text(" " + v, justify="right") for v in c), state, key=r.path)
        paths = [r.path for r in view.rows]
        if self._selected_path in paths:
            cursor = paths.index(self._selected_path)
        if 0 <= cursor < len(view.rows):
            table.move_cursor(row=cursor)

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
            self._selected_path = row.path
            table = self.query_one("#run-table", DataTable)
            idx = [r.path for r in self.view.rows].index(row.path)
            if table.row_count and table.cursor_row != idx:  # an empty table: _fill moves it there
                table.move_cursor(row=idx)
        if step != self.selected_step:
            self.selected_step = step
            self._ask_draw()

    # ------------------------------------------------------------------ the chart
    def on_resize(self) -> None:
        if self.view is not None and self.size.width != self._filled_width:
            self._fill()
        if self._draw_after_layout:  # laid out at last: the chart after the frame that paints the table
            self._draw_after_layout = False
            self.call_after_refresh(self._ask_draw)
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

    def _ask_draw(self) -> None:
        """Draw the chart after the next refresh: what changed with it (the table, the cursor) is painted first,
        and a burst of changes (a new view, then its selection; a held j) draws once."""
        self.drawn = False
        if self._draw_asked or self._draw_after_layout:
            return  # asked already; or the panel is not laid out yet, and its layout asks (on_resize)
        self._draw_asked = True
        if not self.call_after_refresh(self._draw):  # not running
            self._draw_asked = False

    def _draw(self) -> None:
        self._draw_asked = False
        self.drawn = True
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
