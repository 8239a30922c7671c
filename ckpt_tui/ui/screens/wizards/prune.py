"""The prune wizard (key `p` on a run folder's run view): what to remove (`--what optimizer|checkpoint`), how many
of the newest checkpoints to keep (`--keep-last`), the two flags that lift a guard (`--no-keep-best`, `--force`),
then the core's plan -- every path it removes and the bytes it frees -- and a run button that names the total. It
returns a :class:`PruneChoice` (the core's Plan and whether it is forced); the main screen asks once more with the
total and runs exactly that plan as a job (ui/job_kinds.py: PruneJob), then rescans."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Button, Input, OptionList, SelectionList, Static
from textual.widgets.option_list import Option

from ....core.prune import Plan
from ....core.units import naturalsize
from .base import PlannedWizard

QUIET_FOR = 60.0  # the CLI's --quiet-for default

FLAGS = (
    (
        "no-keep-best",
        "--no-keep-best — prune the best checkpoint too (kept by default: trainer_state.json's best_global_step, "
        "else its best_model_checkpoint)",
    ),
    (
        "force",
        f"--force — prune even though a file of the run was modified in the last {QUIET_FOR:g} s (a job may still "
        "be writing it: refused without this)",
    ),
)


@dataclass(frozen=True)
class PruneChoice:
    """What the wizard returns: the plan to remove exactly, and whether a run written in the last minute is
    pruned anyway (``--force``)."""

    plan: Plan
    force: bool = False


class Flags(SelectionList[str]):
    """The flags step's list: space ticks or unticks the highlighted flag, enter goes on to the plan."""

    BINDINGS = [Binding("enter", "screen.next", "Next", show=False)]


WHATS = (
    ("optimizer", "optimizer — the older checkpoints' optimizer, scheduler and RNG state; their weights stay"),
    ("checkpoint", "checkpoint — the older checkpoints, whole"),
)


def plan_text(p: Plan) -> str:
    """The plan as `ckpt-tui prune RUN` prints it: each checkpoint's paths and bytes, what is kept and why, the
    total."""
    lines: list[str] = []
    for c in p.checkpoints:
        lines.append(f"{c.path}/  step {c.step}: remove {naturalsize(c.bytes)}" + (f"  ({c.note})" if c.note else ""))
        for e in c.entries:
            tail = "/" if e.kind == "dir" else " (link; its target untouched)" if e.kind == "link" else ""
            note = f"  ({e.link_note()})" if e.link_note() else ""
            lines.append(f"  {e.path}{tail}  {naturalsize(e.bytes)}{note}")
    for path, why in p.kept:
        lines.append(f"keep {path}/: {why}")
    for path, why in p.skipped:
        lines.append(f"skip {path}/: {why}")
    for path, why in p.refused:
        lines.append(f"refused {path}/: {why}")
    n = sum(len(c.entries) for c in p.checkpoints)
    lines.append(f"\n{n} path(s), {naturalsize(p.bytes)} in all." if p.checkpoints else "\nNothing to remove.")
    return "\n".join(lines)


class PruneWizard(PlannedWizard[PruneChoice]):
    STEPS = ("what", "keep", "flags", "confirm")
    TITLE = "Prune the run"
    READY = "Press enter to remove exactly this (you are asked once more, with the total). The plan:"
    FAILED = "Nothing can be pruned"

    def __init__(self, run: Path, report: Any) -> None:
        super().__init__()
        self.run = run
        self.report = report

    def step_titles(self) -> list[str]:
        return ["what to remove", "how many of the newest checkpoints to keep", "what else may go", "the plan"]

    def run_label(self) -> str:
        p = self.plan.plan if self.plan is not None else None
        return f"Remove {naturalsize(p.bytes)}" if p is not None and p.checkpoints else "Remove"

    def panes(self) -> ComposeResult:
        with Vertical(id="what", classes="pane"):
            yield Static(
                "Prune never removes the newest complete checkpoint, the one `latest` names, or the best one. "
                "What should go from the others?",
                classes="explain",
            )
            yield OptionList(*(Option(text, id=what) for what, text in WHATS), id="what-list")
        with Vertical(id="keep", classes="pane"):
            yield Static("Keep the newest N checkpoints untouched (--keep-last N):", classes="explain")
            yield Input("1", id="keep-last", type="integer")
        with Vertical(id="flags", classes="pane"):
            yield Static(
                "Each guard below holds unless ticked (space ticks or unticks; enter goes on to the plan):",
                classes="explain",
            )
            yield Flags(*((text, flag) for flag, text in FLAGS), id="flag-list")
        yield from self.confirm_pane()

    def flags(self) -> set[str]:
        return set(self.query_one("#flag-list", Flags).selected)

    def what(self) -> str:
        ol = self.query_one("#what-list", OptionList)
        idx = ol.highlighted if ol.highlighted is not None else 0
        return WHATS[idx][0]

    def validate_step(self, name: str) -> str | None:
        if name == "keep":
            v = self.query_one("#keep-last", Input).value.strip()
            if not v.isdigit() or int(v) < 1:
                return "keep at least the newest checkpoint: a whole number, 1 or more"
        return super().validate_step(name)

    def plan_inputs(self) -> Any:
        return self.what(), int(self.query_one("#keep-last", Input).value.strip()), self.flags()

    def build_plan(self, inputs: Any) -> tuple[PruneChoice, str]:
        from ....core.prune import PruneError, plan, require_quiet
        from ....core.report import inspect

        what, keep_last, flags = inputs
        p = plan(self.run, inspect(self.run), what=what, keep_last=keep_last, keep_best="no-keep-best" not in flags)
        if not p.checkpoints:
            raise PruneError(plan_text(p).strip())
        force = "force" in flags
        if not force:
            require_quiet(self.run, QUIET_FOR)  # refused here, with the reason, not after the confirmation
        given = [f"--{f}" for f, _ in FLAGS if f in flags]
        return PruneChoice(p, force), plan_text(p) + (f"\nWith {' '.join(given)}." if given else "")

    def _planned(self, plan: PruneChoice | None, text: str, err: str) -> None:
        super()._planned(plan, text, err)
        if self.step == len(self.STEPS) - 1:
            self.query_one("#next", Button).label = self.run_label() + " (enter)"
