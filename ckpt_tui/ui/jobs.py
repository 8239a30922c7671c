"""Background jobs are Textual thread workers, each a thin wrapper over a core function.

The worker passes its own ``cancelled_event`` to the core function as the cancel token and posts the core's
``Progress`` as a message; it never touches widgets. The worker's state is the job's state: the main screen
hands every end to the job's kind (ui/job_kinds.py, keyed by the worker's name). What a worker does not know -- the title shown to the user,
what a cancel removes -- is a frozen ``JobInfo`` kept beside it.

Cancelling a job sets its ``cancelled_event`` only (``request_cancel``): ``Worker.cancel`` would mark a thread
worker cancelled at once while its thread still runs, and the user would read "cancelled" before the core
function removed its temp output. Set the event, and the worker ends when the core function has cleaned up:
with ``Cancelled`` (shown as cancelled) or, when it was past its last check, with its result.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from textual.dom import DOMNode
from textual.message import Message
from textual.worker import Worker, WorkerState, get_current_worker

from ..core.progress import Cancelled, Progress


@dataclass(frozen=True)
class JobInfo:
    kind: str  # the name of its kind in job_kinds.JOB_KINDS: scan | tensors | repair | export | universal | ...
    title: str
    cleanup_note: str = ""  # what a cancel removes, said to the user
    shown_out: str = ""  # the output path as the user typed it (export)


# a job's body: ``fn(on_progress=..., cancel=...)``, run in a thread worker; what it returns is the worker's result
JobFn = Callable[..., Any]


PROGRESS_EVERY = 0.1  # seconds: the UI reads a job's progress at most this often (10 a second)


class _Latest:
    """A job's latest progress, shared by its thread and the UI. While a JobProgress is posted or a read is due,
    later reports only replace the progress the UI will read: the UI reads it (``take``), and again after
    PROGRESS_EVERY (``again``) while reports keep coming; when none came, the next report posts anew. So a flood of
    reports wakes the UI at most 10 times a second: each wake-up takes the GIL from the job's thread (a scan of a run
    folder reporting each of 1,400 files was twice as slow with the UI woken for every report it could read)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.progress: Progress | None = None
        self.posted = False  # a message is on its way, or a read is due: reports are only kept
        self.fresh = False  # a report came since the last read

    def put(self, p: Progress) -> bool:
        """Keep ``p``; True where a message must be posted to carry it (none is on its way, no read due)."""
        with self.lock:
            self.progress = p
            self.fresh = True
            if self.posted:
                return False
            self.posted = True
            return True

    def take(self, fallback: Progress) -> Progress:
        """The UI's read of a posted message: the latest report (the next read is ``again``, PROGRESS_EVERY later)."""
        with self.lock:
            self.fresh = False
            return self.progress if self.progress is not None else fallback

    def again(self) -> Progress | None:
        """The UI's read after a pause: the latest report if one came since the last read (another read is then
        due), else None, and the next report posts a message."""
        with self.lock:
            if self.fresh:
                self.fresh = False
                return self.progress
            self.posted = False
            return None


class JobProgress(Message):
    def __init__(self, worker: Worker[Any], progress: Progress, latest: _Latest | None = None) -> None:
        super().__init__()
        self.worker = worker
        self._progress = progress
        self._latest = latest
        self._read: Progress | None = None

    @property
    def progress(self) -> Progress:
        """The job's latest progress when this message is handled (reports made since it was posted included)."""
        if self._read is None:
            self._read = self._latest.take(self._progress) if self._latest is not None else self._progress
        return self._read

    def again(self) -> Progress | None:
        """PROGRESS_EVERY after reading ``progress``: the report made since, or None (then the next report posts a
        new message). The handler shows it and calls this again after another PROGRESS_EVERY, until None."""
        if self._latest is None:
            return None
        p = self._latest.again()
        if p is not None:
            self._read = p
        return p

    def can_replace(self, message: Message) -> bool:  # a flood collapses to the latest
        return isinstance(message, JobProgress) and message.worker is self.worker


def run_job(node: DOMNode, info: JobInfo, fn: JobFn, *, exclusive: bool = False) -> Worker[Any]:
    """Run ``fn(on_progress=..., cancel=...)`` in a thread worker of ``node`` (name and group: the job's kind)."""

    def body() -> Any:
        worker = get_current_worker()

        latest = _Latest()

        def on_progress(p: Progress) -> None:
            if latest.put(p):
                node.post_message(JobProgress(worker, p, latest))

        cancel: threading.Event = worker.cancelled_event
        return fn(on_progress=on_progress, cancel=cancel)

    return node.run_worker(
        body,
        name=info.kind,
        group=info.kind,
        description=info.title,
        thread=True,
        exclusive=exclusive,
        exit_on_error=False,
    )


def outcome(worker: Worker[Any]) -> str:
    """running | done | failed | cancelled, from the worker's state."""
    if worker.state in (WorkerState.PENDING, WorkerState.RUNNING):
        return "running"
    if worker.state == WorkerState.SUCCESS:
        return "done"
    if worker.state == WorkerState.CANCELLED or isinstance(worker.error, Cancelled) or worker.cancelled_event.is_set():
        return "cancelled"
    return "failed"


def request_cancel(worker: Worker[Any]) -> None:
    worker.cancelled_event.set()


def error_text(worker: Worker[Any]) -> str:
    e = worker.error
    return (str(e) or type(e).__name__) if e is not None else ""
