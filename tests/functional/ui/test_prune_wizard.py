"""The prune wizard (key `p` on the run view, issue 28) on a copy of a real run (hf-rotation-killed: checkpoint-2
whole, checkpoint-1 left half deleted by a killed rotation): --what checkpoint, keep the newest; the plan names
every path and the total; enter asks once more with the total; yes removes exactly the plan -- the planned paths
gone, every other file byte for byte as it was -- and the run is scanned again. On test_prune.py's run (written just
now, its best named): the flags step's --force (a busy run refused at the plan until ticked) and --no-keep-best,
--what optimizer end to end (marker, inspect's optimizer-pruned), and a running prune cancelled while it is held
after its first removal: it stops there, checkpoint-2 marked half pruned, checkpoint-1 untouched."""

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
        await _until(pilot, lambda: wizard.step == 2, "the flags step")
        await pilot.press("enter")  # no flag: the guards hold
        await _until(pilot, lambda: wizard.plan is not None or wizard.plan_error, "the plan")
        assert wizard.plan is not None, wizard.plan_error
        plan = wizard.plan.plan
        assert not wizard.plan.force
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


# ------------------------------------------------------------------------------------------------- the flags


def _hf_run(tmp_path, best=1):
    """tests/functional/core/test_prune.py's run (hf-killed-save, checkpoint-2 copied as checkpoint-1 and -3, the
    newest's trainer_state.json naming ``best``): its trainer_state.json was just written, so the run is not quiet."""
    from tests.functional.core.test_prune import _hf_run as make

    return make(tmp_path, best)


async def _to_flags(pilot, app, what_down: int):
    """Open the wizard from the run view and walk to its flags step (``what_down``: 0 optimizer, 1 checkpoint)."""
    await _until(pilot, lambda: app.report is not None and app.main.run_view is not None, "the scan")
    await _until(pilot, lambda: app.main.selected is not None and app.main.selected.path == ".", "the run view")
    await pilot.press("p")
    await _until(pilot, lambda: isinstance(app.screen, PruneWizard), "the wizard")
    wizard = app.screen
    await pilot.press(*(["down"] * what_down), "enter")
    await _until(pilot, lambda: wizard.step == 1, "the keep step")
    await pilot.press("enter")
    await _until(pilot, lambda: wizard.step == 2 and app.focused is wizard.query_one("#flag-list"), "the flags step")
    return wizard


async def _planned(pilot, wizard):
    await _until(pilot, lambda: wizard.plan is not None or wizard.plan_error, "the plan")
    return wizard.plan


async def test_the_wizard_prunes_optimizer_state_end_to_end_and_refuses_a_busy_run_unless_forced(tmp_path):
    from ckpt_tui.core.units import naturalsize

    run = _hf_run(tmp_path)
    before = _sums(run)
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:
        wizard = await _to_flags(pilot, app, 0)
        flags = wizard.query_one("#flag-list")  # each flag shown with what it means
        options = [str(flags.get_option_at_index(i).prompt) for i in range(flags.option_count)]
        assert options[0].startswith("--no-keep-best — prune the best checkpoint too")
        assert options[1].startswith("--force — prune even though a file of the run was modified in the last 60 s")
        await pilot.press("enter")  # no --force: trainer_state.json was written just now
        assert await _planned(pilot, wizard) is None
        assert "modified in the last 60 s" in wizard.plan_error and "--force" in wizard.plan_error
        head = str(wizard.query_one("#plan-head").render())
        assert "Nothing can be pruned" in head and "trainer_state.json" in head
        await pilot.press("escape")  # back to the flags: tick --force (space), then on
        await _until(pilot, lambda: wizard.step == 2 and app.focused is flags, "the flags step again")
        await pilot.press("down", "space")
        await _until(pilot, lambda: list(flags.selected) == ["force"], "--force ticked")
        await pilot.press("enter")
        choice = await _planned(pilot, wizard)
        assert choice is not None and choice.force, wizard.plan_error
        plan = choice.plan
        planned = [e.path for c in plan.checkpoints for e in c.entries]
        assert planned == [f"checkpoint-2/{f}" for f in ("optimizer.pt", "rng_state.pth", "scheduler.pt")]
        shown = str(wizard.query_one("#plan-text").render())
        assert all(p in shown for p in planned) and f"3 path(s), {naturalsize(plan.bytes)} in all." in shown
        assert "keep checkpoint-1/: the best checkpoint" in shown and "With --force." in shown
        assert naturalsize(plan.bytes) in str(wizard.query_one("#next").label)
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        assert app.screen.title_text == f"Remove 3 path(s), {naturalsize(plan.bytes)}?"
        await pilot.press("y")
        await _until(pilot, lambda: not (run / "checkpoint-2" / "optimizer.pt").exists(), "the prune")

        def pruned_shown():
            rep = app.report
            return rep is not None and any(f.code == "optimizer-pruned" for f in rep.findings)

        await _until(pilot, pruned_shown, "the rescan")
        (f,) = [f for f in app.report.findings if f.code == "optimizer-pruned"]
        assert f.path == "checkpoint-2" and "model only" in f.message
        complete = {c["path"]: c["complete"] for c in app.report.inventory.checkpoints}
        assert complete["checkpoint-2"] is True  # its weights are whole
    marker = (run / "checkpoint-2" / ".ckpt-tui-prune.json").read_text()
    assert '"state": "pruned"' in marker and '"what": "optimizer"' in marker
    after = _sums(run)
    assert {k: v for k, v in before.items() if k not in planned} == {
        k: v for k, v in after.items() if not k.endswith(".ckpt-tui-prune.json")
    }


async def test_the_wizard_no_keep_best_flag_prunes_the_best_checkpoint_too(tmp_path):
    run = _hf_run(tmp_path)
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:
        wizard = await _to_flags(pilot, app, 0)
        flags = wizard.query_one("#flag-list")
        await pilot.press("space", "down", "space")  # --no-keep-best and --force
        await _until(pilot, lambda: set(flags.selected) == {"no-keep-best", "force"}, "both ticked")
        await pilot.press("enter")
        choice = await _planned(pilot, wizard)
        assert choice is not None, wizard.plan_error
        assert [c.path for c in choice.plan.checkpoints] == ["checkpoint-2", "checkpoint-1"]
        assert "checkpoint-1" not in {p for p, _ in choice.plan.kept}
        assert "With --no-keep-best --force." in str(wizard.query_one("#plan-text").render())
        await pilot.press("escape")  # without it, the best (checkpoint-1) is kept
        await _until(pilot, lambda: wizard.step == 2 and app.focused is flags, "the flags step again")
        await pilot.press("up", "space")
        await _until(pilot, lambda: list(flags.selected) == ["force"], "--no-keep-best unticked")
        await pilot.press("enter")
        choice = await _planned(pilot, wizard)
        assert choice is not None and [c.path for c in choice.plan.checkpoints] == ["checkpoint-2"]
        assert dict(choice.plan.kept)["checkpoint-1"] == "the best checkpoint (trainer_state.json)"


# ------------------------------------------------------------------------------------------------- cancelled


async def test_cancelling_a_running_prune_stops_it_before_its_next_removal(tmp_path, monkeypatch):
    import threading

    from ckpt_tui.core import prune
    from ckpt_tui.ui.jobs import outcome
    from ckpt_tui.ui.widgets.jobs_panel import JobRow

    run = _hf_run(tmp_path)
    before = _sums(run)
    reached, release = threading.Event(), threading.Event()

    def after(ev, path):  # the job holds here, in its worker thread, after its first removal
        if ev == "removed" and not reached.is_set():
            reached.set()
            release.wait(120)

    monkeypatch.setattr(prune, "_after", after)
    app = make_app(run)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            wizard = await _to_flags(pilot, app, 0)
            flags = wizard.query_one("#flag-list")
            await pilot.press("space", "down", "space")  # --no-keep-best: two checkpoints to prune; --force
            await _until(pilot, lambda: set(flags.selected) == {"no-keep-best", "force"}, "both ticked")
            await pilot.press("enter")
            assert await _planned(pilot, wizard) is not None, wizard.plan_error
            await pilot.press("enter")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            await pilot.press("y")
            await _until(pilot, reached.is_set, "the first removal")
            (job,) = [w for w, info in app.main.jobs.items() if info.kind == "prune"]
            assert outcome(job) == "running"
            await pilot.press("c")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the cancel question")
            await pilot.press("y")
            await _until(pilot, job.cancelled_event.is_set, "the cancel")
            assert outcome(job) == "running"  # it stops at its next check, not before
            release.set()
            await _until(pilot, lambda: outcome(job) != "running", "the job's end")
            assert outcome(job) == "cancelled" and isinstance(job.error, prune.PruneCancelled)
            assert job.error.marked == "checkpoint-2" and job.error.result.removed == ["checkpoint-2/optimizer.pt"]
            row = [r for r in app.main.query(JobRow) if r.worker is job][0]
            await _until(pilot, lambda: row.outcome == "cancelled", "the row")

            def interrupted_shown():
                rep = app.report
                return rep is not None and any(f.code == "prune-interrupted" for f in rep.findings)

            await _until(pilot, interrupted_shown, "the rescan")  # the run view shows it half pruned
            assert {c["path"]: c["complete"] for c in app.report.inventory.checkpoints}["checkpoint-2"] is False
    finally:
        release.set()
    after_sums = _sums(run)
    gone = set(before) - set(after_sums)
    assert gone == {"checkpoint-2/optimizer.pt"}  # one removal, then the cancel: nothing of checkpoint-1
    assert all(after_sums[k] == v for k, v in before.items() if k not in gone)
    assert '"state": "pruning"' in (run / "checkpoint-2" / ".ckpt-tui-prune.json").read_text()
    assert not (run / "checkpoint-1" / ".ckpt-tui-prune.json").exists()
