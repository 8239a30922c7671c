"""The frame of the wizards that convert a DeepSpeed ZeRO tag into a new folder (`u` universal, `m` resume
under torch FSDP2): why, where to write it, the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Generic, Protocol, TypeVar, cast

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Static

from ....core.facts import DeepSpeedZeroFacts
from ....core.report import Report
from ....core.types import Plan
from ...format import plain
from ...widgets.safe_input import SafeInput
from .base import PlannedWizard, abs_path, typed


class ConversionPlan(Protocol):
    """What the wizard needs of a conversion's plan (the core's UniversalPlan, TorchDcpPlan)."""

    out: Path

    def to_plan(self) -> Plan: ...


T = TypeVar("T", bound=ConversionPlan)  # the conversion's plan: what the wizard returns


class TagConversionWizard(PlannedWizard[T], Generic[T]):
    """Convert a DeepSpeed ZeRO tag (``tag_path``) into a new folder: why, where to write it (``#out``,
    ``default_out`` of the tag's folder), then the plan ``make_plan`` makes of the tag as the user
    would type it and that folder."""

    STEPS = ("why", "output", "confirm")
    FAILED = "Cannot convert"
    OUT_HELP = ""  # said above the output folder's input

    def __init__(self, report: Report, tag_path: str) -> None:
        super().__init__()
        self.report = report
        self.tag_path = tag_path

    def step_titles(self) -> list[str]:
        return ["why", "where to write it", "check the plan and run"]

    def run_label(self) -> str:
        return "Convert"

    def why(self, f: DeepSpeedZeroFacts) -> str:
        """The first step's text, from the tag's facts."""
        raise NotImplementedError

    def default_out(self, tag_dir: Path) -> Path:
        raise NotImplementedError

    def make_plan(self, src: str, out: Path) -> T:
        """The core's plan (runs in the worker)."""
        raise NotImplementedError

    def panes(self) -> ComposeResult:
        node = self.report.inventory.node(self.tag_path)
        f = cast(DeepSpeedZeroFacts, node.facts) if node else DeepSpeedZeroFacts()
        why = self.why(f)
        tag_dir = abs_path(self.report, self.tag_path)
        assert isinstance(tag_dir, Path)  # u and m convert local checkpoints only (actions.local)
        out = self.default_out(tag_dir)
        with Vertical(id="why", classes="pane"):
            yield Static(plain(why), classes="explain")  # it quotes the tag's path
        with Vertical(id="output", classes="pane"):
            yield Static(self.OUT_HELP, classes="explain")
            yield SafeInput(value=self.report.inventory.user_form(out), id="out")
        yield from self.confirm_pane()

    def plan_inputs(self) -> str:
        return self.query_one("#out", Input).value

    def build_plan(self, out: str) -> tuple[T, str]:
        plan = self.make_plan(typed(self.report, self.tag_path), Path(out).expanduser())
        return plan, plan.to_plan().describe()
