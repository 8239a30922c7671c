"""Background jobs: the only code that runs workers. Each worker is a thin wrapper over a core
function; it never touches widgets — it posts messages, and the app's handlers own UI state."""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from textual.message import Message

from ..core.progress import Cancelled, Progress

_ids = itertools.count(1)


@dataclass
class Job:
    title: str
    kind: str  # scan | export | universal | repair | stats | verify | tensors
    id: int = field(default_factory=lambda: next(_ids))
    cancel: threading.Event = field(default_factory=threading.Event)
    progress: Optional[Progress] = None
    started: float = field(default_factory=time.monotonic)
    state: str = "running"  # running | done | failed | cancelled
    result: Any = None
    error: str = ""
    log: Optional[Path] = None
    cleanup_note: str = ""  # what a cancel removes, said to the user
    shown_out: str = ""  # the output path as the user typed it (export)
    rate: float = 0.0
    _last: tuple[float, int] = (0.0, 0)

    def update(self, p: Progress) -> None:
        now = time.monotonic()
        t0, d0 = self._last
        if p.unit == "bytes" and t0 and now > t0 and p.done >= d0:
            inst = (p.done - d0) / (now - t0)
            self.rate = inst if not self.rate else 0.7 * self.rate + 0.3 * inst
        self._last = (now, p.done)
        self.progress = p

    @property
    def eta(self) -> Optional[float]:
        p = self.progress
        if not p or not p.total or not self.rate or p.unit != "bytes":
            elapsed = time.monotonic() - self.started
            if p and p.total and p.done:
                return elapsed * (p.total - p.done) / p.done
            return None
        return max(0.0, (p.total - p.done) / self.rate)


class JobProgress(Message):
    def __init__(self, job: Job, progress: Progress) -> None:
        super().__init__()
        self.job = job
        self.progress = progress

    def can_replace(self, message: Message) -> bool:  # a flood collapses to the latest
        return isinstance(message, JobProgress) and message.job is self.job


class JobFinished(Message):
    def __init__(self, job: Job) -> None:
        super().__init__()
        self.job = job


def run_in_thread(app, job: Job, fn: Callable[..., Any]) -> None:
    """Run ``fn(on_progress=..., cancel=...)`` in a thread worker; report through messages."""

    def body():
        def on_progress(p: Progress) -> None:
            job.update(p)
            app.post_message(JobProgress(job, p))

        try:
            job.result = fn(on_progress=on_progress, cancel=job.cancel)
            job.state = "done"
        except Cancelled:
            job.state = "cancelled"
        except BaseException as e:  # shown in an error dialog, never as a traceback on screen
            if job.cancel.is_set():
                job.state = "cancelled"
            else:
                job.state = "failed"
                job.error = str(e) or type(e).__name__
                job.trace = traceback.format_exc()  # type: ignore[attr-defined]
        app.post_message(JobFinished(job))

    app.run_worker(body, thread=True, exclusive=False, exit_on_error=False, group="jobs", name=job.title)
