"""The keys that start work on the checkpoint -- fix (x), export (e), universal (u), resume under torch
FSDP2 (m), stats (s): each opens
its wizard, runs the core function as a job (a worker) and shows the result. Mixed into MainScreen
(screens/main.py), which owns ``start_job`` and calls ``_done_<kind>(worker, info)`` when a job succeeds.
``check_action`` keeps these from running while they cannot (``why_not``)."""

from __future__ import annotations

from typing import Callable, Optional, TypeVar

from ..core.formats.registry import format_of
from ..core.types import SEVERITY_RANK
from .jobs import JobInfo
from .screens.dialogs import MessageDialog

P = TypeVar("P")


def by_severity(findings, here=None) -> list:
    """Errors first; within a severity, the findings under ``here`` first; then by path and code."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY_RANK[f.severity], here is not None and not here.contains(f.path), f.path, f.code),
    )


def _run_plan(run: Callable[[P], object]) -> Callable[[Optional[P]], None]:
    """A planned wizard's dismiss callback: ``run(plan)`` once it returns one (not when it was cancelled)."""

    def go(plan: Optional[P]) -> None:
        if plan is not None:
            run(plan)

    return go


class JobActions:
    # ------------------------------------------------------------------ fix
    def fixable(self) -> list:
        """Fixable findings, errors first, the selected node's first within a severity."""
        if self.report is None:
            return []
        return by_severity([f for f in self.report.findings if f.fix], self.selected)

    def action_fix(self) -> None:
        pick = self.fixable()
        if pick:
            self.start_fix(pick[0])

    def start_fix(self, finding) -> None:
        if finding.fix == "export":
            self.action_export()
            return
        from ..core.repair import repairs_for

        reps = [r for r in repairs_for(self.report) if r.id == finding.fix and r.path == finding.path] or [
            r for r in repairs_for(self.report) if r.id == finding.fix
        ]
        if not reps:
            self.app.push_screen(
                MessageDialog(
                    "No repair",
                    f"No automatic repair applies to {finding.code} at {finding.path}.\n\n{finding.message}",
                )
            )
            return
        from .screens.wizards import RepairWizard

        self.app.push_screen(RepairWizard(reps[0]), _run_plan(self.run_repair))

    def run_repair(self, repair):
        info = JobInfo("repair", f"repair {repair.id}", "nothing was replaced; the original is untouched")
        return self.start_job(info, lambda on_progress, cancel: repair.apply(on_progress=on_progress, cancel=cancel))

    def _done_repair(self, worker, info) -> None:
        res = worker.result
        gone = getattr(res, "finding_gone", None)
        text = getattr(res, "summary", None) or str(res)
        title = "Repaired ✔" + (" — the finding is gone" if gone else "")
        self.app.push_screen(MessageDialog(title, text))
        self.action_rescan()

    # ------------------------------------------------------------------ export
    def action_export(self) -> None:
        from .screens.wizards import ExportWizard

        sel = self.selected.path if self.selected else None
        self.app.push_screen(
            ExportWizard(self.report, sel), _run_plan(lambda choice: self.run_export(choice.plan, choice.optimizer))
        )

    def run_export(self, plan, optimizer=None):
        """Export ``plan`` or, with ``optimizer`` (the wizard's "both"), it and the optimizer state's plan side by
        side into the one folder."""
        from ..core.export.write import execute

        shown = plan.out_given or str(plan.out)  # the output folder as the user typed it
        info = JobInfo(
            "export",
            f"export {plan.out.name}",
            f"the temp output was removed; {shown} was not created",
            shown_out=shown,
        )
        if optimizer is not None:
            from ..core.export.both import execute_both

            return self.start_job(
                info,
                lambda on_progress, cancel: execute_both(
                    plan, optimizer, verify=True, on_progress=on_progress, cancel=cancel
                ),
            )
        return self.start_job(
            info, lambda on_progress, cancel: execute(plan, verify=True, on_progress=on_progress, cancel=cancel)
        )

    def _done_export(self, worker, info) -> None:
        from .format import plain, size

        results = worker.result if isinstance(worker.result, tuple) else (worker.result,)
        parts = []
        for r in results:  # the model, then (the wizard's "both") the optimizer state beside it
            notes = "\n".join(f"• {n}" for n in r.notes)
            code = "\n".join(f"  {line}" if line else "" for line in r.load_code.splitlines())
            parts.append(
                f"{len(r.files)} file(s), {size(r.bytes)}, {r.tensors} tensors in {info.shown_out or r.out}\n"
                f"{'verified ✔ — every tensor re-read and compared bit-exact' if r.verified else 'not verified'}"
                f"\n\n{notes}\n\nLoad it with:\n{code}"
            )
        body = "\n\n".join(parts)
        self.app.push_screen(MessageDialog("Export finished ✔", plain(body)))  # never markup: code has [brackets]

    # ------------------------------------------------------------------ universal
    def universal_choice(self) -> tuple[Optional[object], str]:
        """The DeepSpeed tag `u` converts -- the selected tag folder, else the one the core picks for
        `ckpt-tui universal` (`latest`, the newest complete checkpoint) -- or None and why not."""
        if self.report is None:
            return None, "still scanning"
        if self.selected is not None and format_of(self.selected).tag:
            return self.selected, ""
        if not self.report.inventory.deepspeed_tags():
            return None, "no DeepSpeed ZeRO checkpoint here"
        from ..core.export.api import resolve
        from ..core.export.write import ExportError

        try:
            node, _ = resolve(self.report, None, verb="converting")
        except ExportError as e:  # a dangling `latest`: the user picks the tag in the tree
            return None, (str(e).splitlines() or [""])[0] + " (select a tag folder)"
        if not format_of(node).tag:  # e.g. a run folder whose newest checkpoint is not DeepSpeed
            tags = self.report.inventory.deepspeed_tags()
            return None, (
                f"the model here is not a DeepSpeed tag: select one "
                f"({', '.join(self.report.inventory.shown(t.path) for t in tags[:2])})"
            )
        return node, ""

    def universal_tag(self) -> Optional[object]:
        return self.universal_choice()[0]

    def open_tag_wizard(self, wizard, run) -> None:
        """Open ``wizard`` (a TagConversionWizard class) on the tag `u` and `m` convert; ``run`` its plan."""
        tag = self.universal_tag()
        if tag is None:
            return
        self.app.push_screen(wizard(self.report, tag.path), _run_plan(run))

    def action_universal(self) -> None:
        from .screens.wizards import UniversalWizard

        self.open_tag_wizard(UniversalWizard, self.run_universal)

    def run_universal(self, plan):
        from ..core.convert.universal import convert_to_universal

        info = JobInfo("universal", "universal", "the converter was stopped and its temp output removed")
        return self.start_job(
            info, lambda on_progress, cancel: convert_to_universal(plan, on_progress=on_progress, cancel=cancel)
        )

    def _done_universal(self, worker, info) -> None:
        r = worker.result
        self.app.push_screen(MessageDialog("Universal checkpoint ready ✔", getattr(r, "instructions", None) or str(r)))
        self.action_rescan()

    # ------------------------------------------------------------------ resume under torch FSDP2
    def action_resume_fsdp2(self) -> None:
        from .screens.wizards import ResumeWizard

        self.open_tag_wizard(ResumeWizard, self.run_resume)  # the same DeepSpeed tag `ckpt-tui convert` would take

    def run_resume(self, plan):
        from ..core.convert.torch_dcp import convert_to_torch_dcp

        info = JobInfo("resume", f"torch DCP {plan.out.name}", "the temp output was removed; the source is untouched")
        return self.start_job(
            info, lambda on_progress, cancel: convert_to_torch_dcp(plan, on_progress=on_progress, cancel=cancel)
        )

    def _done_resume(self, worker, info) -> None:
        from .format import plain

        r = worker.result
        self.app.push_screen(MessageDialog("Ready to resume under torch FSDP2 ✔", plain(r.instructions)))  # literal

    # ------------------------------------------------------------------ stats
    def action_stats(self) -> None:
        comp, _ = self.component_for(self.selected) if self.selected is not None else (None, "")
        if comp is None:
            return
        from ..core.analysis import stats

        trust = self.trust_pickles
        self.start_job(
            JobInfo("stats", f"stats {comp.name}"),
            lambda on_progress, cancel: (
                comp.path,
                stats(comp.abspath, trust_pickles=trust, on_progress=on_progress, cancel=cancel),
            ),
        )

    def _done_stats(self, worker, info) -> None:
        component, result = worker.result
        if component == self._shown_component:
            self.stats = tuple(result)
