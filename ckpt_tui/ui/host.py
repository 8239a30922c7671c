"""What the actions (ui/actions.py: whether each can run) and the job kinds (ui/job_kinds.py: how each starts
and ends) ask of the main screen, declared once: the main screen (screens/main.py) is this ``Host``, and the
two registries depend on this protocol instead of importing the screen that imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol

from textual.app import App
from textual.worker import Worker

from ..core.report import Report
from ..core.types import Finding, Node, TensorInfo

if TYPE_CHECKING:
    from ..core.analysis import TensorStats
    from ..core.run_view import RunView
    from .jobs import JobFn, JobInfo

# what a tensors job returns: (the node it was asked for, the component listed, its rows, the table's note, whether
# they are the stored keys (`S`) rather than the names export writes)
TensorRows = tuple[str, str, tuple[TensorInfo, ...], str, bool]


class Host(Protocol):
    @property
    def app(self) -> App[Any]: ...

    @property
    def report(self) -> Optional[Report]: ...  # None while scanning

    @property
    def selected(self) -> Optional[Node]: ...

    @property
    def trust_pickles(self) -> bool: ...

    @property
    def run_view(self) -> Optional[RunView]: ...  # a run folder's (core/run_view.py), else None

    @property
    def shown_component(self) -> Optional[str]: ...  # the key of the component the tensor table shows

    @property
    def stored_names(self) -> bool: ...  # the tensor table lists the stored keys (`S`), not the names export writes

    # ---- what it knows
    def universal_choice(self) -> tuple[Optional[Node], str]: ...  # the DeepSpeed tag u and m convert, or why not

    def universal_tag(self) -> Optional[Node]: ...

    def fixable(self) -> list[Finding]: ...

    def component_for(self, node: Node) -> tuple[Optional[Node], str]: ...

    def running_jobs(self) -> list[Worker[Any]]: ...

    # ---- what it does
    def start_job(self, info: JobInfo, fn: JobFn, *, exclusive: bool = False) -> Worker[Any]: ...

    def scan_ended(self, worker: Worker[Report], end: str) -> None: ...

    def tensors_done(self, result: TensorRows) -> None: ...

    def show_stats(self, component: str, stats: tuple[TensorStats, ...]) -> None: ...

    def action_rescan(self) -> None: ...
