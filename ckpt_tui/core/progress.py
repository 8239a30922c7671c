"""Progress reports and cancellation: the contract every long core function follows.

A long function takes ``on_progress: Callable[[Progress], None] | None`` and
``cancel: threading.Event | None``. It calls ``on_progress`` with cumulative
figures and calls :func:`check_cancel` between units of work.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Literal, Optional

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
CancelToken = threading.Event


class Cancelled(Exception):
    """Raised inside a core function when its cancel token is set."""


def check_cancel(cancel: Optional[threading.Event]) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled")


def report(on_progress: Optional[OnProgress], done: int, total: Optional[int], unit: Unit = "bytes", label: str = "") -> None:
    if on_progress is not None:
        on_progress(Progress(done, total, unit, label))
