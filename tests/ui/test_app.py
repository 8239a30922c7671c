"""The TUI driven with Textual's Pilot on real fixture checkpoints."""

import shutil
import time
from pathlib import Path

import pytest

from ckpt_tui.ui.app import make_app
from tests.util import sparse_safetensors
from ckpt_tui.ui.jobs import Job
from ckpt_tui.ui.screens.dialogs import ConfirmDialog, HelpScreen, MessageDialog
from ckpt_tui.ui.screens.findings import FindingsScreen
from ckpt_tui.ui.screens.wizards import ExportWizard
from ckpt_tui.ui.widgets.details import TensorTable


async def wait_for(pilot, cond, timeout=30.0):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("timed out waiting")
        await pilot.pause(0.05)


def screen_text(app) -> str:
    return "\n".join(str(s.render()) for s in app.screen.query("Static"))


@pytest.fixture
def fsdp_ckpt(real_ckpt, tmp_path):
    d = tmp_path / "checkpoint-2000"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", d)
    return d


async def test_open_first_user_report_shows_model_and_optimizer(fsdp_ckpt):
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        summary = str(app.query_one("#summary").render())
        assert "model in `pytorch_model_fsdp_0/`" in summary and "optimizer in `optimizer_0/`" in summary
        tree = app.query_one("#tree")
        labels = {str(n.label) for n in tree.root.children}
        assert any("pytorch_model_fsdp_0/" in l and "MODEL" in l for l in labels)
        assert any("optimizer_0/" in l and "OPTIM" in l for l in labels)
        assert app.selected.path == "pytorch_model_fsdp_0"
        await wait_for(pilot, lambda: len(app.query_one(TensorTable).rows) == 21)
        # filter as you type
        await pilot.press("slash", "q", "_", "p", "r", "o", "j")
        table = app.query_one(TensorTable)
        assert table.query_one("DataTable").row_count == 2  # q_proj of layers 0 and 1
        assert table.last_filter_ms < 100


async def test_export_wizard_runs_and_verifies(fsdp_ckpt, tmp_path):
    app = make_app(fsdp_ckpt)
    out = fsdp_ckpt.parent / "checkpoint-2000-safetensors"
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("e")
        assert isinstance(app.screen, ExportWizard)
        await pilot.press("enter", "enter", "enter", "enter")  # source, output, dtype, shard size
        wiz = app.screen
        await wait_for(pilot, lambda: wiz.plan is not None)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog) and "verified ✔" in screen_text(app),
                       timeout=60)
        assert (out / "model.safetensors").is_file()
        job = [j for j in app.jobs if j.kind == "export"][0]
        assert job.state == "done" and job.progress.done == job.progress.total


async def test_cancel_an_export_midway_leaves_no_output(tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    sparse_safetensors(src / "model.safetensors", 3)
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        from ckpt_tui.core.export.api import plan_export

        plan, _ = plan_export(src, tmp_path / "out", dtype="bf16")  # a cast: several seconds of work
        app.run_export(plan)
        job = app.jobs[-1]
        await wait_for(pilot, lambda: job.progress is not None and job.progress.done > 0, timeout=60)
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await wait_for(pilot, lambda: job.state != "running", timeout=60)
        assert job.state == "cancelled"
        assert not (tmp_path / "out").exists()
        assert not list(tmp_path.glob(".out.*"))


async def test_failure_opens_an_error_dialog(fsdp_ckpt, tmp_path):
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        from ckpt_tui.core.export.api import plan_export

        plan, _ = plan_export(fsdp_ckpt, Path("/proc/ckpt-tui-out"))  # nobody can write there
        app.run_export(plan)
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog) and "failed" in screen_text(app),
                       timeout=30)
        assert "Traceback" not in screen_text(app)


async def test_findings_panel_on_second_user_report(real_ckpt):
    app = make_app(real_ckpt("hf-ds-zero2") / "checkpoint-2")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("f")
        assert isinstance(app.screen, FindingsScreen)
        table = app.screen.query_one("DataTable")
        codes = [table.get_row_at(i)[2] for i in range(table.row_count)]
        assert "universal-info-missing" in codes
        while table.get_row_at(table.cursor_row)[2] != "universal-info-missing":
            await pilot.press("j")
        assert "universal_checkpoint_info" in str(app.screen.query_one("#finding-message").render())
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.selected.path == "global_step2"


async def test_help_quit_confirmation_and_palette(fsdp_ckpt):
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        # a running job makes quit ask first
        job = Job("fake wait", "stats")
        app.jobs.append(job)
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("n")
        assert app.is_running
        job.state = "done"
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert "Export" in commands and "Findings" in commands


@pytest.fixture
def ds_ckpt(real_ckpt, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", run / "checkpoint-3")
    return run / "checkpoint-3"


async def test_universal_wizard_converts_and_shows_how_to_load(ds_ckpt):
    from ckpt_tui.ui.screens.wizards import UniversalWizard

    app = make_app(ds_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("u")
        assert isinstance(app.screen, UniversalWizard)
        assert "universal_checkpoint_info" in screen_text(app)
        await pilot.press("enter", "enter")
        wiz = app.screen
        await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error, timeout=60)
        assert wiz.plan is not None, wiz.plan_error
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog)
                       and "Universal checkpoint ready" in screen_text(app), timeout=240)
        assert "load_universal" in screen_text(app)
        assert (ds_ckpt / "global_step2_universal" / "zero").is_dir()
        assert (ds_ckpt / "latest_universal").read_text().strip() == "global_step2_universal"


async def test_repair_wizard_fixes_in_place_and_rescans(ds_ckpt):
    from ckpt_tui.ui.screens.wizards import RepairWizard

    app = make_app(ds_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        assert "universal-info-missing" in {f.code for f in app.report.findings}
        await pilot.press("x")
        assert isinstance(app.screen, RepairWizard)
        assert "universal_checkpoint_info" in screen_text(app)
        await pilot.press("enter")
        await pilot.pause(0.2)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog) and "Repaired" in screen_text(app),
                       timeout=60)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.report is not None and "universal-info-missing" not in
                       {f.code for f in app.report.findings}, timeout=60)
