"""Running and finished jobs: a row per worker with Textual's ProgressBar (its ETA), and bytes or files
done/total from the core's Progress. A row's ``progress`` and ``outcome`` are reactive: the main screen sets
them from the worker's messages, the watchers repaint."""

from __future__ import annotations

import time
from typing import Any, Optional

from textual.app import ComposeResult
from textual.clock import Clock
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static

from ...core.progress import Progress, RateMeter
from ..format import plain, size

OUTCOME_TEXT = {
    "running": "",
    "done": "✔ done",
    "failed": "✖ failed",
    "cancelling": "■ cancelling…",
    "cancelled": "■ cancelled",
}


class JobRow(Horizontal):
    DEFAULT_CSS = """
    JobRow { height: 1; }
    JobRow .title { width: 18; }
    JobRow ProgressBar { width: auto; }
    JobRow ProgressBar Bar { width: 14; }
    JobRow .status { width: 1fr; padding-left: 1; }
    """

    progress: reactive[Optional[Progress]] = reactive(None, init=False)
    outcome: reactive[str] = reactive("running", init=False)

    def __init__(self, worker, info, clock=None):
        super().__init__()
        self.worker = worker
        self.info = info
        self.clock = clock
        self._rate = RateMeter()

    def compose(self) -> ComposeResult:
        yield Static(plain(self.info.title[:17], lines=False), classes="title")
        kw = {"clock": self.clock} if self.clock is not None else {}
        yield ProgressBar(total=None, show_eta=True, show_percentage=True, **kw)
        yield Static("starting…", classes="status")

    def watch_progress(self, p: Optional[Progress]) -> None:
        if p is None or self.outcome != "running":  # a report read after the end (reads are paced) changes nothing
            return
        if p.total:
            self.query_one(ProgressBar).update(total=p.total, progress=p.done)
        now = self.clock.time if self.clock is not None else time.monotonic()
        self.query_one(".status", Static).update(plain(progress_text(p, self._rate.update(p, now)), lines=False))

    def watch_outcome(self, outcome: str) -> None:
        p = self.progress
        if outcome == "done" and p is not None and p.total:
            self.query_one(ProgressBar).update(total=p.total, progress=p.total)
        if outcome != "running":
            note = self.info.cleanup_note if outcome == "cancelled" else ""
            self.query_one(".status", Static).update(plain(f"{OUTCOME_TEXT[outcome]} {note}".strip(), lines=False))


def progress_text(p: Progress, rate: Optional[float] = None) -> str:
    """``done/total  rate  label`` of a job (the rate from the core's RateMeter, when known): the label, the
    least useful, last, where a narrow row cuts it."""
    if p.unit == "bytes":
        text = f"{size(p.done)}/{size(p.total)}" + (f"  {size(rate)}/s" if rate else "")
    else:
        text = f"{p.done}/{p.total or '?'} files" + (f"  {rate:.1f} files/s" if rate else "")
    return f"{text}  {p.label}" if p.label else text


class JobsPanel(Vertical):
    DEFAULT_CSS = """
    JobsPanel { height: auto; max-height: 6; border-top: solid $primary; display: none; }
    JobsPanel.active { display: block; }
    """

    def __init__(self, clock: Optional[Clock] = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.clock = clock

    def add_job(self, worker, info) -> JobRow:
        self.add_class("active")
        row = JobRow(worker, info, self.clock)
        self.mount(row)
        rows = list(self.query(JobRow))
        for old in rows[:-4]:  # keep the last few
            if old.outcome != "running":
                old.remove()
        return row

    def row(self, worker) -> Optional[JobRow]:
        return next((r for r in self.query(JobRow) if r.worker is worker), None)
