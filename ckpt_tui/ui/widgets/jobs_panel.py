"""Running and finished jobs, each with a ProgressBar, bytes done/total, rate and ETA."""

from __future__ import annotations

import humanize
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar, Static

from ..format import size

STATE_TEXT = {"running": "", "done": "✔ done", "failed": "✖ failed", "cancelled": "■ cancelled"}


class JobRow(Horizontal):
    DEFAULT_CSS = """
    JobRow { height: 1; }
    JobRow .title { width: 18; }
    JobRow ProgressBar { width: auto; }
    JobRow ProgressBar Bar { width: 14; }
    JobRow .status { width: 1fr; padding-left: 1; }
    """

    def __init__(self, job, clock=None):
        super().__init__(id=f"job-{job.id}")
        self.job = job
        self.clock = clock

    def compose(self) -> ComposeResult:
        yield Static(self.job.title[:17], classes="title")
        kw = {"clock": self.clock} if self.clock is not None else {}
        yield ProgressBar(total=None, show_eta=False, show_percentage=True, **kw)
        yield Static("", classes="status")

    def refresh_job(self) -> None:
        j = self.job
        p = j.progress
        bar = self.query_one(ProgressBar)
        status = self.query_one(".status", Static)
        if p is not None and p.total:
            bar.update(total=p.total, progress=p.done)
        if j.state != "running":
            if j.state == "done" and p is not None and p.total:
                bar.update(total=p.total, progress=p.total)
            status.update(f"{STATE_TEXT[j.state]} {j.cleanup_note if j.state == 'cancelled' else ''}".strip())
            return
        if p is None:
            status.update("starting…")
            return
        if p.unit == "bytes":
            text = f"{size(p.done)}/{size(p.total)}"
            if j.rate:
                text += f" {size(int(j.rate))}/s"
        else:
            text = f"{p.done}/{p.total or '?'} files"
        eta = j.eta
        if eta is not None:
            text += f" ETA {_short_delta(eta)}"
        if p.label:
            text = f"{p.label[:10]}: " + text
        status.update(text)


def _short_delta(seconds: float) -> str:
    if seconds < 1:
        return "<1s"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return humanize.naturaldelta(seconds)


class JobsPanel(Vertical):
    DEFAULT_CSS = """
    JobsPanel { height: auto; max-height: 6; border-top: solid $primary; display: none; }
    JobsPanel.active { display: block; }
    """

    def __init__(self, clock=None, **kw):
        super().__init__(**kw)
        self.clock = clock

    def add_job(self, job) -> None:
        self.add_class("active")
        row = JobRow(job, self.clock)
        self.mount(row)
        rows = list(self.query(JobRow))
        for old in rows[:-4]:  # keep the last few
            if old.job.state != "running":
                old.remove()

    def update_job(self, job) -> None:
        for row in self.query(JobRow):
            if row.job is job:
                row.refresh_job()

    def running(self):
        return [r.job for r in self.query(JobRow) if r.job.state == "running"]
