"""The keys that start work on the checkpoint -- fix (x), export (e), universal (u), stats (s): each opens
its wizard, runs the core function as a job, and shows the result. Mixed into CkptApp (ui/app.py), which
owns the job plumbing (``_start``, ``on_job_finished`` calling ``_done_<kind>``) and the main screen."""

from __future__ import annotations

from .jobs import Job
from .screens.dialogs import MessageDialog
from .widgets.details import TensorTable


class JobActions:
    def action_fix(self) -> None:
        if self.report is None:
            self.notify("Still scanning…")
            return
        sel = self.selected or self.report.inventory.root
        fixable = [f for f in self.report.findings if f.fix]
        mine = [f for f in fixable if sel.contains(f.path)]
        pick = (mine or fixable)
        if not pick:
            self.notify("Nothing here has a fix.")
            return
        self.start_fix(pick[0])

    def start_fix(self, finding) -> None:
        if finding.fix == "export":
            self.action_export()
            return
        try:
            from ..core.repair import repairs_for
        except ImportError:
            self.push_screen(MessageDialog("Repairs", "Repairs are not available in this build.", error=True))
            return
        reps = [r for r in repairs_for(self.report) if r.id == finding.fix and r.path == finding.path] or \
               [r for r in repairs_for(self.report) if r.id == finding.fix]
        if not reps:
            self.push_screen(MessageDialog("No repair", f"No automatic repair applies to {finding.code} at "
                                           f"{finding.path}.\n\n{finding.message}"))
            return
        from .screens.wizards import RepairWizard

        def go(res) -> None:
            if res:
                self.run_repair(res["repair"])

        self.push_screen(RepairWizard(reps[0]), go)

    def run_repair(self, repair) -> None:
        job = Job(f"repair {repair.id}", "repair")
        job.cleanup_note = "nothing was replaced; the original is untouched"
        self._start(job, lambda on_progress, cancel: repair.apply(on_progress=on_progress, cancel=cancel))

    def _done_repair(self, job: Job) -> None:
        res = job.result
        gone = getattr(res, "finding_gone", None)
        text = getattr(res, "summary", None) or str(res)
        title = "Repaired ✔" + (" — the finding is gone" if gone else "")
        self.push_screen(MessageDialog(title, text))
        self.action_rescan()

    def action_export(self) -> None:
        if self.report is None:
            self.notify("Still scanning…")
            return
        from .screens.wizards import ExportWizard

        def go(res) -> None:
            if res and res.get("plan") is not None:
                self.run_export(res["plan"])

        sel = self.selected.path if self.selected else None
        self.push_screen(ExportWizard(self.report, sel), go)

    def run_export(self, plan) -> None:
        from ..core.export.write import execute

        job = Job(f"export {plan.out.name}", "export")
        job.shown_out = plan.out_given or str(plan.out)  # the output folder as the user typed it
        job.cleanup_note = f"the temp output was removed; {job.shown_out} was not created"
        self._start(job, lambda on_progress, cancel: execute(plan, verify=True, on_progress=on_progress,
                                                             cancel=cancel))

    def _done_export(self, job: Job) -> None:
        from textual.content import Content

        r = job.result
        from .format import size

        notes = "\n".join(f"• {n}" for n in r.notes)
        code = "\n".join(f"  {line}" if line else "" for line in r.load_code.splitlines())
        body = (f"{len(r.files)} file(s), {size(r.bytes)}, {r.tensors} tensors in {job.shown_out or r.out}\n"
                f"{'verified ✔ — every tensor re-read and compared bit-exact' if r.verified else 'not verified'}\n\n"
                f"{notes}\n\nLoad it with:\n{code}")
        self.push_screen(MessageDialog("Export finished ✔", Content(body)))  # literal: code has [brackets]

    def action_universal(self) -> None:
        if self.report is None:
            self.notify("Still scanning…")
            return
        inv = self.report.inventory
        tags = inv.deepspeed_tags()
        if self.selected is not None and self.selected.format == "deepspeed-zero":
            tag = self.selected
        elif tags:
            model = inv.model_node()
            tag = model if model is not None and model.format == "deepspeed-zero" else tags[0]
        else:
            self.notify("Universal conversion needs a DeepSpeed ZeRO checkpoint; none here.", severity="warning")
            return
        from .screens.wizards import UniversalWizard

        def go(res) -> None:
            if res and res.get("plan") is not None:
                self.run_universal(res["plan"])

        self.push_screen(UniversalWizard(self.report, tag.path), go)

    def run_universal(self, plan) -> None:
        from ..core.convert.universal import convert_to_universal

        job = Job("universal", "universal")
        job.cleanup_note = "the converter was stopped and its temp output removed"
        self._start(job, lambda on_progress, cancel: convert_to_universal(plan, on_progress=on_progress,
                                                                          cancel=cancel))

    def _done_universal(self, job: Job) -> None:
        r = job.result
        text = getattr(r, "instructions", None) or str(r)
        self.push_screen(MessageDialog("Universal checkpoint ready ✔", text))
        self.action_rescan()

    def action_stats(self) -> None:
        if self.selected is None:
            return
        comp, _ = self._component_for(self.selected)
        if comp is None:
            self.notify("Select a model component to compute statistics.")
            return
        from ..core.analysis import stats

        job = Job(f"stats {comp.name}", "stats")
        self._start(job, lambda on_progress, cancel: stats(comp.abspath, trust_pickles=self.trust_pickles,
                                                           on_progress=on_progress, cancel=cancel))

    def _done_stats(self, job: Job) -> None:
        self._main(TensorTable).set_stats(job.result)
        bad = [s for s in job.result if s.nan or s.inf]
        self.notify(f"{len(job.result)} tensors: " + (f"{len(bad)} with NaN/Inf ✖" if bad else "no NaN/Inf ✔"),
                    severity="error" if bad else "information")
