"""The prune wizard (key `p` on the run view, issue 28) on a copy of a real run (hf-rotation-killed: checkpoint-2
whole, checkpoint-1 left half deleted by a killed rotation): --what checkpoint, keep the newest; the plan names
every path and the total; enter asks once more with the total; yes removes exactly the plan -- the planned paths
gone, every other file byte for byte as it was -- and the run is scanned again."""

from __future__ import annotations

import hashlib
import os
import shutil
import time

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.dialogs import ConfirmDialog
from ckpt_tui.ui.screens.wizards.prune import PruneWizard
from tests.fixtures import fixture_path


def _sums(top):
    out = {}
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, top)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


async def _until(pilot, cond, what, timeout=60.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def test_the_prune_wizard_removes_exactly_its_plan(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fixture_path("hf-rotation-killed") / "run", run)  # copy2: the files' mtimes are kept (quiet)
    before = _sums(run)
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.report is not None and app.main.run_view is not None, "the scan")
        await _until(pilot, lambda: app.main.selected is not None and app.main.selected.path == ".", "the run view")
        assert app.main.why_not("prune") is None
        await pilot.press("p")
        await _until(pilot, lambda: isinstance(app.screen, PruneWizard), "the wizard")
        wizard = app.screen
        await pilot.press("down", "enter")  # --what checkpoint
        await _until(pilot, lambda: wizard.step == 1, "the keep step")
        await pilot.press("enter")  # keep the newest 1
        await _until(pilot, lambda: wizard.plan is not None or wizard.plan_error, "the plan")
        plan = wizard.plan
        assert plan is not None, wizard.plan_error
        assert plan.what == "checkpoint" and [c.path for c in plan.checkpoints] == ["checkpoint-1"]
        text = str(wizard.query_one("#plan-text").render())
        planned = [e.path for c in plan.checkpoints for e in c.entries]
        assert all(p in text for p in planned) and "in all" in text
        from ckpt_tui.core.units import naturalsize

        assert naturalsize(plan.bytes) in str(wizard.query_one("#next").label)
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        assert naturalsize(plan.bytes) in app.screen.title_text
        await pilot.press("y")
        await _until(pilot, lambda: not (run / "checkpoint-1").exists(), "the prune")
        await _until(pilot, lambda: app.report is not None and len(app.report.inventory.checkpoints) == 1, "the rescan")
    after = _sums(run)
    kept = {k: v for k, v in before.items() if not any(k == p or k.startswith(p + "/") for p in planned)}
    assert after == kept  # every other file untouched, and nothing else removed
    assert kept  # checkpoint-2 is still there
