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


class _Latest:
    """A job's latest progress, shared by its thread and the message that carries it: while a JobProgress is posted
    and not yet read, later reports only replace the progress it will read (one wake-up of the UI per read, not per
    report: each wake-up takes the GIL from the job's thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.progress: Progress | None = None
        self.posted = False

    def put(self, p: Progress) -> bool:
        """Keep ``p``; True where a message must be posted to carry it (none is waiting)."""
        with self.lock:
            self.progress = p
            if self.posted:
                return False
            self.posted = True
            return True

    def take(self, fallback: Progress) -> Progress:
        with self.lock:
            self.posted = False
            return self.progress if self.progress is not None else fallback


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
