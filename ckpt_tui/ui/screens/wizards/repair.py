"""The repair wizard (key `x`, or x in the findings): the dry run's diff and the backup, then confirm; it
returns the core's Repair to apply."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from ....core.repair.run import Repair
from ...format import plain
from .base import Wizard


class RepairWizard(Wizard[Repair]):
    STEPS = ("diff", "confirm")
    TITLE = "Repair"

    def __init__(self, repair: Repair) -> None:
        super().__init__()
        self.repair = repair

    def step_titles(self) -> list[str]:
        return ["what will change (dry run)", "confirm"]

    def run_label(self) -> str:
        return "Repair"

    def panes(self) -> ComposeResult:
        with Vertical(id="diff", classes="pane"):
            with VerticalScroll():  # the plan's description begins with the repair's title
                yield Static(plain(self.repair.plan.describe()))  # it quotes the file: never markup
        with Vertical(id="confirm", classes="pane"):
            yield Static(
                "The original is kept as a backup (named in the plan above); the new file is written to a "
                "temp name, fsynced and moved into place. Afterwards ckpt-tui re-inspects the checkpoint."
                "\n\nPress enter to repair.",
                classes="explain",
            )

    def result(self) -> Repair:
        return self.repair
