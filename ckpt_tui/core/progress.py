"""Progress reports and cancellation: the contract every long core function follows.

A long function takes ``on_progress: Callable[[Progress], None] | None`` and
``cancel: threading.Event | None``. It calls ``on_progress`` with cumulative
figures and calls :func:`check_cancel` between units of work.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Optional

Unit = Literal["bytes", "files"]


@dataclass(frozen=True)
class Progress:
    done: int
    total: Optional[int]
    unit: Unit = "bytes"
    label: str = ""

    @property
    def fraction(self) -> Optional[float]:
        if not self.total:
            return None
        return min(1.0, self.done / self.total)


OnProgress = Callable[[Progress], None]


class RateMeter:
    """Units per second of one job, from its successive :class:`Progress` reports, over the last
    ``window`` seconds (so a stall shows as a falling rate, not a lifetime average)."""

    def __init__(self, window: float = 3.0) -> None:
        self.window = window
        self._points: deque[tuple[float, int]] = deque()

    def update(self, p: Progress, now: float) -> Optional[float]:
        """Record ``p`` seen at ``now`` (seconds, any monotonic clock); the rate, or None before two reports
        a moment apart."""
        pts = self._points
        pts.append((now, p.done))
        while len(pts) > 2 and now - pts[0][0] > self.window:
            pts.popleft()
        (t0, d0), (t1, d1) = pts[0], pts[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 and d1 >= d0 else None


CancelToken = threading.Event


class Cancelled(Exception):
    """Raised inside a core function when its cancel token is set."""


def check_cancel(cancel: Optional[threading.Event]) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled")


def report(
    on_progress: Optional[OnProgress], done: int, total: Optional[int], unit: Unit = "bytes", label: str = ""
) -> None:
    if on_progress is not None:
        on_progress(Progress(done, total, unit, label))


# The progress callback and cancel token of the job running in this context, for a reader deep inside it (a DCP
# .metadata of 200 MB, read while a scan analyses its folder) that would otherwise sit silent and uncancellable.
_SCOPE: ContextVar[tuple[Optional[OnProgress], Optional[threading.Event]]] = ContextVar(
    "ckpt_tui_progress_scope", default=(None, None)
)


@contextmanager
def progress_scope(on_progress: Optional[OnProgress], cancel: Optional[threading.Event]) -> Iterator[None]:
    """Within: :func:`scoped` gives ``on_progress`` and ``cancel``."""
    token = _SCOPE.set((on_progress, cancel))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def scoped() -> tuple[Optional[OnProgress], Optional[threading.Event]]:
    """The progress callback and cancel token of the enclosing :func:`progress_scope`, or (None, None)."""
    return _SCOPE.get()
