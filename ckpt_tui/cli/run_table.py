"""`ckpt-tui inspect RUN`'s run table (core/run_view.py): one line per checkpoint, at most 80 columns."""

from __future__ import annotations

import math
import time
from typing import Optional

from ..core.run_view import RunRow, RunView
from ..core.safetext import visible
from ..core.units import naturalsize

HOLDS = (("model", "M"), ("optimizer", "O"), ("scheduler", "S"), ("rng", "R"))
LEGEND = "holds: M model, O optimizer, S scheduler, R RNG state; ● newest complete, ★ best"
NAME_WIDTH = 9  # the eval metric's column: its name cut to this


def metric_text(v: Optional[float]) -> str:
    if v is None:
        return "—"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}"


def written_text(t: Optional[float]) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t)) if t is not None else "—"


def holds_text(row: RunRow) -> str:
    return "".join(letter if what in row.holds else "-" for what, letter in HOLDS)


def mark(row: RunRow) -> str:
    return ("★" if row.best else "") + ("●" if row.newest_complete else "") or " "


def size_text(n: int) -> str:
    return naturalsize(n) if n else "—"


def run_lines(view: RunView) -> list[str]:
    """The table and its totals as plain text lines (each at most 80 characters)."""
    if not view.rows:
        return []
    combined = any(r.combined_bytes for r in view.rows)
    eval_name = visible(view.eval_name or "eval")
    eval_head = eval_name if len(eval_name) <= NAME_WIDTH else eval_name[: NAME_WIDTH - 1] + "…"
    step_w = max(4, *(len(str(r.step)) for r in view.rows))
    head = ["", "step", "written", "holds", "model", "optim"] + (["mod+opt"] if combined else []) + ["other"]
    head += ["loss", eval_head, "state"]
    rows = []
    for r in view.rows:
        cells = [mark(r), str(r.step), written_text(r.written), holds_text(r), size_text(r.model_bytes)]
        cells += [size_text(r.optimizer_bytes)] + ([size_text(r.combined_bytes)] if combined else [])
        cells += [size_text(r.other_bytes), metric_text(r.loss), metric_text(r.eval_metric)]
        cells.append("✔" if r.complete else "✖")
        rows.append(cells)
    widths = [max(len(c[i]) for c in [head, *rows]) for i in range(len(head))]
    widths[1] = max(widths[1], step_w)
    right = {1, 4, 5, 6, 7, 8, 9} | ({10} if combined else set())
    right.discard(len(head) - 1)

    def line(cells: list[str]) -> str:
        return " ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(head)] + [line(c) for c in rows]
    for r in view.rows:
        if r.problems:
            out.append(f"  ✖ step {r.step}: {visible('; '.join(r.problems))}")
    total = f"run {naturalsize(view.total_bytes)} in {len(view.rows)} checkpoint{'s' if len(view.rows) != 1 else ''}"
    if view.total_bytes:
        share = 100 * view.optimizer_bytes / view.total_bytes
        total += f"; optimizer states {naturalsize(view.optimizer_bytes)} ({share:.0f}%)"
    if combined:
        total += f"; {naturalsize(sum(r.combined_bytes for r in view.rows))} model+optimizer files"
    out.append(total)
    if view.no_history:
        out.append(f"no metrics: {visible(view.no_history)}")
    elif view.history_from:
        out.append(f"metrics from {visible(view.history_from)}")
    best = view.best
    if best is not None:
        how = {"metric": f"lowest {eval_name}", "best_global_step": "best_global_step"}.get(
            view.best_source or "", view.best_source or ""
        )
        if view.best_source == "metric" and view.higher_is_better:
            how = f"highest {eval_name}"
        out.append(f"best: step {best.step} ({visible(best.path)}, by {how})")
    out.append(LEGEND)
    return out
