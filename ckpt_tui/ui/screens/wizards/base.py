"""The wizards' frame: keyboard-only modal steps; Esc goes back (or closes on the first step); every step says
what will happen. A wizard is a ``ModalScreen[R | None]``: it returns what to run (``R``, a dataclass) or None
when cancelled; the main screen runs it as a job (ui/job_kinds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, Optional, TypeVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, ContentSwitcher, Input, OptionList, Static

from ....core.report import Report
from ....core.storage import Location
from ....core.types import user_path
from ...format import plain, visible

R = TypeVar("R")  # what a wizard returns when it runs
P = TypeVar("P")  # a planned wizard's plan (what it returns)


class Wizard(ModalScreen[Optional[R]]):
    CSS_PATH = Path(__file__).with_name("wizards.tcss")  # type selectors on Wizard: every subclass
    STEPS: tuple[str, ...] = ()
    TITLE = ""
    BINDINGS = [Binding("escape", "back", "Back"), Binding("ctrl+n", "next", "Next", show=False)]

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.TITLE, classes="title")
            yield Static("", id="step-label", classes="step")
            with ContentSwitcher(initial=self.STEPS[0]):
                yield from self.panes()
            with Horizontal(classes="buttons"):
                yield Button("Back (esc)", id="back")
                yield Button("Next (enter)", id="next", variant="primary")

    def panes(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.show_step()

    def show_step(self) -> None:
        name = self.STEPS[self.step]
        self.query_one(ContentSwitcher).current = name
        self.query_one("#step-label", Static).update(
            f"Step {self.step + 1} of {len(self.STEPS)}: {self.step_titles()[self.step]}"
        )
        last = self.step == len(self.STEPS) - 1
        nxt = self.query_one("#next", Button)
        nxt.label = (self.run_label() if last else "Next") + " (enter)"
        # a Button ignores enter for 0.2 s after a press (its "-active" effect); that press belongs to the
        # previous step, so end it: enter on the next step's button must not be lost
        nxt.remove_class("-active")
        self.query_one("#back", Button).label = "Cancel (esc)" if self.step == 0 else "Back (esc)"
        nxt.disabled = not self.can_run() if last else False
        self.enter_step(name)
        self.focus_step(name)

    def step_titles(self) -> list[str]:
        return list(self.STEPS)

    def run_label(self) -> str:
        return "Run"

    def can_run(self) -> bool:
        """Whether the last step's button runs: False while there is nothing valid to run."""
        return True

    def enter_step(self, name: str) -> None:
        pass

    def focus_step(self, name: str) -> None:
        pane = self.query_one(f"#{name}")
        for w in pane.query("Input, OptionList, Select"):
            w.focus()
            return
        nxt = self.query_one("#next", Button)
        (self.query_one("#back", Button) if nxt.disabled else nxt).focus()

    def validate_step(self, name: str) -> Optional[str]:
        return None

    def action_back(self) -> None:
        if self.step == 0:
            self.dismiss(None)
        else:
            self.step -= 1
            self.show_step()

    def action_next(self) -> None:
        err = self.validate_step(self.STEPS[self.step])
        if err:
            self.notify(visible(err), severity="error", markup=False)  # it may name a path
            return
        if self.step == len(self.STEPS) - 1:
            self.dismiss(self.result())
        else:
            self.step += 1
            self.show_step()

    def result(self) -> R:
        raise NotImplementedError

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "next":
            self.action_next()
        else:
            self.action_back()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_next()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_next()


class PlannedWizard(Wizard[P], Generic[P]):
    """A wizard whose last step ("confirm") shows a plan (``P``) made in a worker from the values of the
    earlier steps; it returns that plan for the app to run."""

    READY = ""  # said above the plan once it is ready
    FAILED = ""  # prefix of the reason when it cannot be planned

    def __init__(self) -> None:
        super().__init__()
        self.plan: Optional[P] = None
        self.plan_error = ""

    def confirm_pane(self) -> ComposeResult:
        with Vertical(id="confirm", classes="pane"):
            yield Static("", id="plan-head", classes="explain")
            with VerticalScroll():
                yield Static("Planning…", id="plan-text")

    def plan_inputs(self) -> Any:
        """The earlier steps' values, read on the UI thread (build_plan's argument)."""
        raise NotImplementedError

    def build_plan(self, inputs: Any) -> tuple[P, str]:
        """(plan, its text) — runs in a worker thread: no widget access."""
        raise NotImplementedError

    def enter_step(self, name: str) -> None:
        if name == "confirm":
            self.plan, self.plan_error = None, ""
            self.query_one("#plan-head", Static).update("")
            self.query_one("#plan-text", Static).update("Planning (reading headers)…")
            self._plan_worker(self.plan_inputs())

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _plan_worker(self, inputs: Any) -> None:
        try:
            plan, text = self.build_plan(inputs)
            self.app.call_from_thread(self._planned, plan, text, "")
        except Exception as e:  # shown in the wizard, never a traceback
            self.app.call_from_thread(self._planned, None, "", str(e))

    def _planned(self, plan: Optional[P], text: str, err: str) -> None:
        self.plan, self.plan_error = plan, err
        self.query_one("#plan-head", Static).update(plain(self.READY if plan else f"{self.FAILED}: {err}"))
        self.query_one("#plan-text", Static).update(plain(text if plan else ""))  # a plan names files: never markup
        nxt = self.query_one("#next", Button)
        nxt.disabled = not self.can_run()
        if plan is None:
            self.query_one("#back", Button).focus()  # the run button is disabled: esc/back is what is left
        elif self.step == len(self.STEPS) - 1:
            nxt.focus()

    def can_run(self) -> bool:
        return self.plan is not None

    def validate_step(self, name: str) -> Optional[str]:
        if name == "confirm" and self.plan is None:
            return self.plan_error or "the plan is not ready yet"
        return None

    def result(self) -> P:
        assert self.plan is not None  # validate_step let the last step run
        return self.plan


def typed(report: Report, rel: str) -> str:
    """Node ``rel`` as the user would type it (relative to their folder if they opened a relative path):
    what the plans and results the core prints then name."""
    inv = report.inventory
    return user_path(inv.given or str(inv.root.abspath), rel)


def abs_path(report: Report, rel: str) -> Location:
    node = report.inventory.node(rel)
    return node.abspath if node is not None else report.inventory.root.abspath
