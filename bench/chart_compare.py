"""Issue 28's chart library choice: the run view's chart drawn by textual-plotext (what the app uses) or by
textual-plot, in the real app on a real run, so each is judged where it is read: under the run table, at 80x24 and
120x40, with and without NO_COLOR, in tmux. The comparison is in docs/tui.md (the run view's section).

    python bench/chart_compare.py RUN --lib plotext|plot              # the app, for tmux (q quits)
    python bench/chart_compare.py RUN --lib plot --svg out.svg --size 80x24

`--lib plot` needs textual-plot (`pip install textual-plot`; not a dependency of ckpt-tui). It replaces only the run
panel's chart: train loss and the eval metric on one plot, the learning rate on a panel of its own under it
(textual-plot has one y axis), each checkpoint's step a grey line, the selected one red; the same series as
textual-plotext gets (``plottable``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from textual.containers import Vertical  # noqa: E402
from textual.widgets import Static  # noqa: E402

from ckpt_tui.core.safetext import visible  # noqa: E402
from ckpt_tui.ui.widgets import run_view  # noqa: E402


def draw_with_textual_plot(self: run_view.RunPanel) -> None:
    """RunPanel._draw, with textual-plot's PlotWidget instead of textual-plotext's PlotextPlot."""
    from textual_plot import HiResMode, LegendLocation, PlotWidget

    self._draw_asked = False
    self.drawn = True
    view = self.view
    note = self.query_one("#run-no-chart", Static)
    if view is None or not view.series:
        note.update(f"no chart: {visible(view.no_history if view is not None else '')}")
        note.display = True
        self._show_chart_or_spark()
        return
    note.display = False
    if self.chart is None:
        loss_w = PlotWidget(id="tp-loss", allow_pan_and_zoom=False)
        lr_w = PlotWidget(id="tp-lr", allow_pan_and_zoom=False)
        loss_w.styles.height = "2fr"
        lr_w.styles.height = "1fr"
        self.chart = Vertical(loss_w, lr_w, id="run-chart")
        mounted = self.query_one("#run-chart-box").mount(self.chart)

        async def then_draw() -> None:  # a PlotWidget clears itself when mounted: plot after that
            await mounted
            self._draw()

        self.call_later(then_draw)
        return
    loss_w, lr_w = list(self.chart.query(PlotWidget))
    for w in (loss_w, lr_w):
        w.clear()
        w.margin_left = 7
        w.margin_top = 1
        w.margin_bottom = 2
    plotted: dict[str, tuple[list[int], list[float]]] = {}
    for name, series in view.series.items():
        xs, ys = run_view.plottable(series)
        if not xs:
            continue
        plotted[name] = (xs, ys)
        if name == "learning_rate":
            lr_w.plot(xs, ys, line_style="green", hires_mode=HiResMode.BRAILLE, label="lr")
        elif name == "loss":
            loss_w.plot(xs, ys, line_style="bright_blue", hires_mode=HiResMode.BRAILLE, label="train loss")
        else:
            loss_w.scatter(xs, ys, marker="x", marker_style="magenta", label=visible(name))
    for w in (loss_w, lr_w):
        for r in view.rows:
            if r.step != self.selected_step:
                w.add_v_line(r.step, "grey50")
        if self.selected_step is not None:
            w.add_v_line(self.selected_step, "red")
        w.show_legend(LegendLocation.TOPRIGHT)
    loss_w.set_xlabel(f"step (▲ {self.selected_step})" if self.selected_step is not None else "step")
    self.plotted = plotted
    self._show_chart_or_spark()


async def svg(run: Path, out: Path, size: tuple[int, int]) -> None:
    from ckpt_tui.ui.app import make_app

    app = make_app(run)
    async with app.run_test(size=size) as pilot:
        panel = app.main.query_one(run_view.RunPanel)
        for _ in range(2000):
            if app.report is not None and panel.drawn and panel.chart is not None and panel.plotted:
                break
            await pilot.pause(0.01)
        await pilot.pause(0.3)
        app.save_screenshot(out.name, str(out.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--lib", choices=("plotext", "plot"), default="plotext")
    ap.add_argument("--svg", type=Path)
    ap.add_argument("--size", default="80x24")
    a = ap.parse_args()
    if a.lib == "plot":
        patched: Any = draw_with_textual_plot
        run_view.RunPanel._draw = patched  # type: ignore[method-assign]
    if a.svg is not None:
        w, h = (int(v) for v in a.size.split("x"))
        asyncio.run(svg(a.run, a.svg.resolve(), (w, h)))
        return
    from ckpt_tui.ui.app import make_app

    make_app(a.run).run()


if __name__ == "__main__":
    main()
