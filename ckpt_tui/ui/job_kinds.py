"""Every kind of job is one registered object (``JOB_KINDS``): how it starts (its wizard, then its worker over a
core function) and what its end does. The main screen (screens/main.py) keeps the jobs and hands every end of
one to its kind (``JobKind.ended``), keyed by the worker's name, which is the kind's name; its keys (x e u m s)
call the kinds' ``open``, and whether they can run now is the action's own question (ui/actions.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Iterable, Optional, TypeVar

from textual.worker import Worker, get_current_worker

from ..core.types import SEVERITY_RANK, Finding, Node
from .format import plain, size
from .host import Host, TensorRows
from .jobs import JobFn, JobInfo, error_text
from .screens.dialogs import MessageDialog

if TYPE_CHECKING:
    from ..core.analysis import TensorStats
    from ..core.convert.torch_dcp.plan import TorchDcpPlan
    from ..core.convert.torch_dcp.run import TorchDcpResult
    from ..core.convert.universal.plan import UniversalPlan
    from ..core.convert.universal.run import UniversalResult
    from ..core.export.plan import ExportPlan
    from ..core.export.write import ExportResult
    from ..core.prune import Result as PruneResult
    from ..core.repair.run import Repair, RepairResult
    from ..core.report import Report
    from .screens.wizards import ExportChoice
    from .screens.wizards.prune import PruneChoice

P = TypeVar("P")  # what a wizard returns
R = TypeVar("R")  # what a kind's worker returns


def by_severity(findings: Iterable[Finding], here: Optional[Node] = None) -> list[Finding]:
    """Errors first; within a severity, the findings under ``here`` first; then by path and code."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY_RANK[f.severity], here is not None and not here.contains(f.path), f.path, f.code),
    )


def _run_plan(run: Callable[[P], object]) -> Callable[[Optional[P]], None]:
    """A wizard's dismiss callback: ``run(result)`` once it returns one (not when it was cancelled)."""

    def go(plan: Optional[P]) -> None:
        if plan is not None:
            run(plan)

    return go


class JobKind(Generic[R]):
    """One kind of job. ``start`` runs its worker (``R``: what the worker returns) on the main screen; ``ended``
    says how it ended: a failure in a dialog, a cancel in a notification, a success as ``done`` shows it."""

    name: ClassVar[str]
    listed: ClassVar[bool] = True  # in the jobs panel, and what quit and cancel ask about

    def start(self, screen: Host, info: JobInfo, fn: JobFn, *, exclusive: bool = False) -> Worker[R]:
        assert info.kind == self.name
        return screen.start_job(info, fn, exclusive=exclusive)

    def ended(self, screen: Host, worker: Worker[R], info: JobInfo, end: str) -> None:
        if end == "failed":
            screen.app.push_screen(MessageDialog(f"{info.title} failed", error_text(worker), error=True))
        elif end == "cancelled":
            screen.app.notify(plain(f"{info.title}: cancelled. {info.cleanup_note}".strip()).plain, markup=False)
        elif end == "done":
            self.done(screen, worker.result, info)

    def done(self, screen: Host, result: Optional[R], info: JobInfo) -> None:
        pass


class ScanJob(JobKind["Report"]):
    """The scan: its progress in the summary line, its end in the tree and the summary (Host)."""

    name = "scan"
    listed = False

    def ended(self, screen: Host, worker: Worker[Report], info: JobInfo, end: str) -> None:
        screen.scan_ended(worker, end)


class TensorsJob(JobKind["TensorRows"]):
    """The tensor table's rows of the shown component; a failure is the table's caption, never a dialog."""

    name = "tensors"
    listed = False

    def ended(self, screen: Host, worker: Worker[TensorRows], info: JobInfo, end: str) -> None:
        if end == "done" and worker.result is not None:
            screen.tensors_done(worker.result)


class RepairJob(JobKind["RepairResult"]):
    name = "repair"

    def open(self, screen: Host, finding: Finding) -> None:
        """The repair wizard on ``finding``'s repair (an export finding opens the export wizard). Planning a
        repair reads the file it would change (a pickle inside a torch zip): in a worker, not on the UI thread."""
        if finding.fix == "export":
            EXPORT.open(screen)
            return
        report = screen.report
        if report is None:
            return

        def plan() -> None:
            from ..core.repair import repairs_for

            repairs = repairs_for(report)
            reps = [r for r in repairs if r.id == finding.fix and r.path == finding.path] or [
                r for r in repairs if r.id == finding.fix
            ]
            if not get_current_worker().is_cancelled:  # x pressed again: the newer plan opens its wizard
                screen.app.call_from_thread(self._planned, screen, finding, reps[0] if reps else None)

        screen.app.run_worker(plan, name="repair-plan", group="repair-plan", thread=True, exclusive=True)

    def _planned(self, screen: Host, finding: Finding, repair: Optional[Repair]) -> None:
        if repair is None:
            screen.app.push_screen(
                MessageDialog(
                    "No repair",
                    f"No automatic repair applies to {finding.code} at {finding.path}.\n\n{finding.message}",
                )
            )
            return
        from .screens.wizards import RepairWizard

        def run(repair: Repair) -> None:
            self.run(screen, repair)

        screen.app.push_screen(RepairWizard(repair), _run_plan(run))

    def run(self, screen: Host, repair: Repair) -> Worker[RepairResult]:
        info = JobInfo(self.name, f"repair {repair.id}", "nothing was replaced; the original is untouched")
        return self.start(
            screen, info, lambda on_progress, cancel: repair.apply(on_progress=on_progress, cancel=cancel)
        )

    def done(self, screen: Host, result: Optional[RepairResult], info: JobInfo) -> None:
        gone = getattr(result, "finding_gone", None)
        text = getattr(result, "summary", None) or str(result)
        title = "Repaired ✔" + (" — the finding is gone" if gone else "")
        screen.app.push_screen(MessageDialog(title, text))
        screen.action_rescan()


class ExportJob(JobKind["tuple[ExportResult, ...]"]):
    name = "export"

    def open(self, screen: Host) -> None:
        from .screens.wizards import ExportWizard

        if screen.report is None:
            return

        def run(choice: ExportChoice) -> None:
            self.run(screen, choice.plan, choice.optimizer)

        sel = screen.selected.path if screen.selected else None
        screen.app.push_screen(ExportWizard(screen.report, sel), _run_plan(run))

    def run(
        self, screen: Host, plan: ExportPlan, optimizer: Optional[ExportPlan] = None
    ) -> Worker[tuple[ExportResult, ...]]:
        """Export ``plan`` or, with ``optimizer`` (the wizard's "both"), it and the optimizer state's plan side by
        side into the one folder."""
        shown = plan.out_given or str(plan.out)  # the output folder as the user typed it
        info = JobInfo(
            self.name,
            f"export {plan.out.name}",
            f"the temp output was removed; {shown} was not created",
            shown_out=shown,
        )

        def export(on_progress: Any, cancel: Any) -> tuple[ExportResult, ...]:
            if optimizer is not None:
                from ..core.export.both import execute_both

                return execute_both(plan, optimizer, verify=True, on_progress=on_progress, cancel=cancel)
            from ..core.export.write import execute

            return (execute(plan, verify=True, on_progress=on_progress, cancel=cancel),)

        return self.start(screen, info, export)

    def done(self, screen: Host, result: Optional[tuple[ExportResult, ...]], info: JobInfo) -> None:
        parts = []
        for r in result or ():  # the model, then (the wizard's "both") the optimizer state beside it
            notes = "\n".join(f"• {n}" for n in r.notes)
            code = "\n".join(f"  {line}" if line else "" for line in r.load_code.splitlines())
            parts.append(
                f"{len(r.files)} file(s), {size(r.bytes)}, {r.tensors} tensors in {info.shown_out or r.out}\n"
                f"{'verified ✔ — every tensor re-read and compared bit-exact' if r.verified else 'not verified'}"
                f"\n\n{notes}\n\nLoad it with:\n{code}"
            )
        body = "\n\n".join(parts)
        screen.app.push_screen(MessageDialog("Export finished ✔", plain(body)))  # never markup: code has [brackets]


def _open_tag_wizard(screen: Host, wizard: Callable[[Report, str], Any], run: Callable[[Any], object]) -> None:
    """Open ``wizard`` (a TagConversionWizard class) on the tag `u` and `m` convert; ``run`` its plan."""
    tag = screen.universal_tag()
    if tag is None or screen.report is None:
        return
    screen.app.push_screen(wizard(screen.report, tag.path), _run_plan(run))


class UniversalJob(JobKind["UniversalResult"]):
    name = "universal"

    def open(self, screen: Host) -> None:
        from .screens.wizards import UniversalWizard

        _open_tag_wizard(screen, UniversalWizard, lambda plan: self.run(screen, plan))

    def run(self, screen: Host, plan: UniversalPlan) -> Worker[UniversalResult]:
        from ..core.convert.universal import convert_to_universal

        info = JobInfo(self.name, "universal", "the converter was stopped and its temp output removed")
        return self.start(
            screen, info, lambda on_progress, cancel: convert_to_universal(plan, on_progress=on_progress, cancel=cancel)
        )

    def done(self, screen: Host, result: Optional[UniversalResult], info: JobInfo) -> None:
        text = getattr(result, "instructions", None) or str(result)
        screen.app.push_screen(MessageDialog("Universal checkpoint ready ✔", text))
        screen.action_rescan()


class ResumeJob(JobKind["TorchDcpResult"]):
    """Resume a DeepSpeed run under torch FSDP2: the tag as a torch DCP folder (`ckpt-tui convert`)."""

    name = "resume"

    def open(self, screen: Host) -> None:
        from .screens.wizards import ResumeWizard

        # the same DeepSpeed tag `ckpt-tui convert` would take
        _open_tag_wizard(screen, ResumeWizard, lambda plan: self.run(screen, plan))

    def run(self, screen: Host, plan: TorchDcpPlan) -> Worker[TorchDcpResult]:
        from ..core.convert.torch_dcp import convert_to_torch_dcp

        info = JobInfo(self.name, f"torch DCP {plan.out.name}", "the temp output was removed; the source is untouched")
        return self.start(
            screen, info, lambda on_progress, cancel: convert_to_torch_dcp(plan, on_progress=on_progress, cancel=cancel)
        )

    def done(self, screen: Host, result: Optional[TorchDcpResult], info: JobInfo) -> None:
        text = result.instructions if result is not None else ""
        screen.app.push_screen(MessageDialog("Ready to resume under torch FSDP2 ✔", plain(text)))  # literal


class StatsJob(JobKind["tuple[str, list[TensorStats]]"]):
    """min/max/NaN of every tensor of the shown component; the table shows them (Host.stats)."""

    name = "stats"

    def open(self, screen: Host) -> None:
        comp, _ = screen.component_for(screen.selected) if screen.selected is not None else (None, "")
        if comp is None:
            return
        from ..core.analysis import stats

        trust = screen.trust_pickles
        self.start(
            screen,
            JobInfo(self.name, f"stats {comp.name}"),
            lambda on_progress, cancel: (
                comp.path,
                stats(comp.abspath, trust_pickles=trust, on_progress=on_progress, cancel=cancel),
            ),
        )

    def done(self, screen: Host, result: Optional[tuple[str, list[TensorStats]]], info: JobInfo) -> None:
        if result is None:
            return
        component, rows = result
        screen.show_stats(component, tuple(rows))


class PruneJob(JobKind["PruneResult"]):
    """Prune a run folder (`ckpt-tui prune RUN --yes`) from its run view: the wizard's plan, confirmed once more
    with its total, removed exactly (core/prune.apply re-checks each path), then a rescan. Cancelling it sets the
    core's cancel token: the prune stops before its next removal, and the rescan shows what it left."""

    name = "prune"

    def open(self, screen: Host) -> None:
        from .screens.dialogs import ConfirmDialog
        from .screens.wizards.prune import PruneWizard

        report = screen.report
        if report is None:
            return
        run = report.inventory.root.abspath
        if not isinstance(run, Path):
            return  # object storage: prune removes local files only (the action's `local` check says so)

        def confirm(choice: PruneChoice) -> None:
            from ..core.units import naturalsize

            plan = choice.plan
            n = sum(len(c.entries) for c in plan.checkpoints)

            def answer(yes: bool | None) -> None:
                if yes:
                    self.run(screen, choice)

            screen.app.push_screen(
                ConfirmDialog(
                    f"Remove {n} path(s), {naturalsize(plan.bytes)}?",
                    f"from {len(plan.checkpoints)} checkpoint(s) of {plan.run}. This cannot be undone.",
                    yes="Remove",
                    no="Keep everything",
                ),
                answer,
            )

        screen.app.push_screen(PruneWizard(run, report), _run_plan(confirm))

    def run(self, screen: Host, choice: PruneChoice) -> Worker[PruneResult]:
        from ..core.prune import apply

        plan = choice.plan
        info = JobInfo(
            self.name,
            f"prune {plan.run.name}",
            "the prune stops before its next removal: a checkpoint it was half way through stays marked half "
            "pruned (prune again to finish it), the others are untouched or finished",
        )

        def prune(on_progress: Any, cancel: Any) -> PruneResult:
            return apply(plan, force=choice.force, on_progress=on_progress, cancel=cancel)

        return self.start(screen, info, prune, exclusive=True)

    def ended(self, screen: Host, worker: Worker[PruneResult], info: JobInfo, end: str) -> None:
        from ..core.prune import PruneCancelled

        if end == "cancelled":
            err = worker.error
            if isinstance(err, PruneCancelled):
                left = (
                    f"`{err.marked}/` is marked half pruned: prune again to finish it"
                    if err.marked
                    else "every checkpoint untouched or finished"
                )
                text = f"{info.title}: cancelled after removing {len(err.result.removed)} path(s) ({size(err.result.bytes_freed)}); {left}."
            else:
                text = f"{info.title}: cancelled. {info.cleanup_note}"
            screen.app.notify(plain(text).plain, markup=False)
            screen.action_rescan()  # what the prune left: the marked checkpoint shows as half pruned
            return
        super().ended(screen, worker, info, end)

    def done(self, screen: Host, result: Optional[PruneResult], info: JobInfo) -> None:
        if result is not None:
            failed = "".join(f"\n✖ {path}: {why}" for path, why in result.failed)
            body = f"Removed {len(result.removed)} path(s), freed {size(result.bytes_freed)}.{failed}"
            screen.app.push_screen(
                MessageDialog("Pruned ✔" if not result.failed else "Pruned, with failures", plain(body))
            )
        screen.action_rescan()


SCAN, TENSORS = ScanJob(), TensorsJob()
REPAIR, EXPORT, UNIVERSAL, RESUME, STATS = RepairJob(), ExportJob(), UniversalJob(), ResumeJob(), StatsJob()
PRUNE = PruneJob()
JOB_KINDS: dict[str, JobKind[Any]] = {
    k.name: k for k in (SCAN, TENSORS, REPAIR, EXPORT, UNIVERSAL, RESUME, STATS, PRUNE)
}
