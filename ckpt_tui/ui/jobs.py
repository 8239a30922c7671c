"""Background jobs are Textual thread workers, each a thin wrapper over a core function.

The worker passes its own ``cancelled_event`` to the core function as the cancel token and posts the core's
``Progress`` as a message; it never touches widgets. The worker's state is the job's state: the main screen
handles every end in one ``on_worker_state_changed``. What a worker does not know -- the title shown to the user,
what a cancel removes -- is a frozen ``JobInfo`` kept beside it.

Cancelling a job sets its ``cancelled_event`` only (``request_cancel``): ``Worker.cancel`` would mark a thread
worker cancelled at once while its thread still runs, and the user would read "cancelled" before the core
function removed its temp output. Set the event, and the worker ends when the core function has cleaned up:
with ``Cancelled`` (shown as cancelled) or, when it was past its last check, with its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from textual.message import Message
from textual.worker import Worker, WorkerState, get_current_worker

from ..core.progress import Cancelled, Progress


@dataclass(frozen=True)
class JobInfo:
    kind: str  # scan | export | universal | repair | stats | tensors
    title: str
    cleanup_note: str = ""  # what a cancel removes, said to the user
    shown_out: str = ""  # the output path as the user typed it (export)


class JobProgress(Message):
    def __init__(self, worker: Worker, progress: Progress) -> None:
        super().__init__()
        self.worker = worker
        self.progress = progress

    def can_replace(self, message: Message) -> bool:  # a flood collapses to the latest
        return isinstance(message, JobProgress) and message.worker is self.worker


def run_job(node, info: JobInfo, fn: Callable[..., Any], *, exclusive: bool = False) -> Worker:
    """Run ``fn(on_progress=..., cancel=...)`` in a thread worker of ``node`` (group = the job's kind)."""

    def body():
        worker = get_current_worker()

        def on_progress(p: Progress) -> None:
            node.post_message(JobProgress(worker, p))

        return fn(on_progress=on_progress, cancel=worker.cancelled_event)

    return node.run_worker(
        body,
        name=info.kind,
        group=info.kind,
        description=info.title,
        thread=True,
        exclusive=exclusive,
        exit_on_error=False,
    )


def outcome(worker: Worker) -> str:
    """running | done | failed | cancelled, from the worker's state."""
    if worker.state in (WorkerState.PENDING, WorkerState.RUNNING):
        return "running"
    if worker.state == WorkerState.SUCCESS:
        return "done"
    if worker.state == WorkerState.CANCELLED or isinstance(worker.error, Cancelled) or worker.cancelled_event.is_set():
        return "cancelled"
    return "failed"


def request_cancel(worker: Worker) -> None:
    worker.cancelled_event.set()


def error_text(worker: Worker) -> str:
    e = worker.error
    return (str(e) or type(e).__name__) if e is not None else ""
