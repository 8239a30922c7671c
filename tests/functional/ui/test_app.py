"""The TUI driven with Textual's Pilot on real fixture checkpoints."""

import shutil
import time
from pathlib import Path

import pytest
from textual.widgets import Tree

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.format import size
from ckpt_tui.ui.jobs import JobInfo, outcome
from ckpt_tui.ui.screens.dialogs import ConfirmDialog, HelpScreen, MessageDialog
from ckpt_tui.ui.screens.findings import FindingsScreen
from ckpt_tui.ui.screens.wizards import ExportWizard
from ckpt_tui.ui.widgets.details import TensorTable
from ckpt_tui.ui.widgets.jobs_panel import JobRow
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.util import FileLease


async def wait_for(pilot, cond, timeout=30.0):
    """Wait for a state of the app. A key press returns once Textual thinks the app is idle — a
    guess a loaded machine defeats — so what a key does is waited for, never assumed done."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("timed out waiting")
        await pilot.pause(0.05)


async def press_and_wait(pilot, key, cond, timeout=30.0):
    await pilot.press(key)
    await wait_for(pilot, cond, timeout)


def step_ready(wiz, step: int) -> bool:
    """The wizard shows ``step``, its widget has the focus (moved after the step changed) and, if
    that is the Next button, the button takes a press (not in its 0.2 s "-active" effect): only
    then does enter do what the user's would."""
    focused = wiz.app.focused
    pane = wiz.query_one(f"#{wiz.STEPS[step]}")
    if wiz.step != step or focused is None:
        return False
    if focused.id == "next":
        return not focused.has_class("-active")
    return pane in focused.ancestors_with_self


def screen_text(app) -> str:
    return "\n".join(str(s.render()) for s in app.screen.query("Static"))


def message_shown(app, text: str) -> bool:
    """A MessageDialog is up with its body mounted (a step after its title), and ``text`` is on it."""
    screen = app.screen
    if not isinstance(screen, MessageDialog):
        return False
    return bool(screen.query("VerticalScroll Static")) and text in screen_text(app)


async def plan_in_tag_wizard(pilot, app, key: str, wizard, why: str):
    """After the scan, ``key`` opens ``wizard`` (a tag conversion: why, output, confirm); once its
    first step says ``why``, walk to the plan with the default output. The wizard, its plan made."""
    await wait_for(pilot, lambda: app.report is not None)
    await press_and_wait(pilot, key, lambda: isinstance(app.screen, wizard))
    wiz = app.screen
    await wait_for(pilot, lambda: why in screen_text(app))
    await wait_for(pilot, lambda: step_ready(wiz, 0))
    for step in (1, 2):  # why, output
        await press_and_wait(pilot, "enter", lambda: step_ready(wiz, step))
    await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error, timeout=60)
    assert wiz.plan is not None, wiz.plan_error
    return wiz


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
        assert any("pytorch_model_fsdp_0/" in label and "MODEL" in label for label in labels)
        assert any("optimizer_0/" in label and "OPTIM" in label for label in labels)
        await wait_for(pilot, lambda: app.selected.path == "pytorch_model_fsdp_0")
        await wait_for(pilot, lambda: len(app.query_one(TensorTable).rows) == 21)
        # filter as you type
        table = app.query_one(TensorTable)
        box = table.query_one("#tensor-filter")
        await press_and_wait(pilot, "slash", lambda: app.focused is box)  # else "q" would quit
        await pilot.press("q", "_", "p", "r", "o", "j")
        await wait_for(pilot, lambda: box.value == "q_proj")
        await wait_for(pilot, lambda: table.query_one("DataTable").row_count == 2)  # q_proj of layers 0 and 1
        assert table.last_filter_ms < 100


async def test_export_wizard_runs_and_verifies(fsdp_ckpt, tmp_path):
    app = make_app(fsdp_ckpt)
    out = fsdp_ckpt.parent / "checkpoint-2000-safetensors"
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
        wiz = app.screen
        await wait_for(pilot, lambda: step_ready(wiz, 0))
        for step in (1, 2, 3, 4):  # source, output, dtype, shard size
            await press_and_wait(pilot, "enter", lambda: step_ready(wiz, step))
        await wait_for(pilot, lambda: wiz.plan is not None)
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "verified ✔"), timeout=60)
        assert (out / "model.safetensors").is_file()
        job = [w for w, info in app.main.jobs.items() if info.kind == "export"][0]
        row = app.main.query_one(JobRow)
        assert outcome(job) == "done" and row.worker is job and row.progress.done == row.progress.total


async def test_cancel_an_export_midway_leaves_no_output(fsdp_ckpt, tmp_path):
    # the export copies this file after writing every tensor, before verifying and renaming; the
    # test holds a lease on it, so the job certainly waits there, running, while it is cancelled
    (fsdp_ckpt / "tokenizer.model").write_bytes(b"tokenizer")
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        from ckpt_tui.core.export.api import plan_export

        plan, _ = plan_export(fsdp_ckpt, tmp_path / "out")
        assert (fsdp_ckpt / "tokenizer.model", "tokenizer.model") in plan.copies
        with FileLease(fsdp_ckpt / "tokenizer.model") as lease:
            job = app.main.run_export(plan)
            row = app.main.query_one(JobRow)
            await wait_for(pilot, lease.blocked, timeout=60)
            await wait_for(pilot, lambda: row.progress is not None and row.progress.done == row.progress.total)
            assert outcome(job) == "running"  # every tensor written, the copy waits
            assert list(tmp_path.glob(".out.tmp-*")) and not (tmp_path / "out").exists()
            await press_and_wait(pilot, "c", lambda: isinstance(app.screen, ConfirmDialog))
            await press_and_wait(pilot, "y", lambda: job.cancelled_event.is_set())
            assert outcome(job) == "running"  # the worker ends only when the core function has cleaned up
        # released: the job copies the file, reaches its next cancel check and stops
        await wait_for(pilot, lambda: outcome(job) != "running", timeout=60)
        assert outcome(job) == "cancelled"
        await wait_for(pilot, lambda: row.outcome == "cancelled")
        assert not (tmp_path / "out").exists()
        assert not list(tmp_path.glob(".out.*"))


async def test_failure_opens_an_error_dialog(fsdp_ckpt, tmp_path):
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        from ckpt_tui.core.export.api import plan_export

        plan, _ = plan_export(fsdp_ckpt, Path("/proc/ckpt-tui-out"))  # nobody can write there
        job = app.main.run_export(plan)
        await wait_for(pilot, lambda: job.error is not None and message_shown(app, str(job.error)), timeout=30)
        assert outcome(job) == "failed" and str(job.error)
        assert "export ckpt-tui-out failed" in screen_text(app)  # the title names the job
        assert "Traceback" not in screen_text(app)


async def test_a_highlight_arriving_while_the_app_closes_is_ignored(fsdp_ckpt):
    """The scan moves the tree's cursor after a refresh; the Tree.NodeHighlighted that follows can
    be handled after the app removed its screens (a ScreenStackError at exit, on a loaded machine)."""
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        node = app.query_one(CheckpointTree).get_node_at_line(0)
    assert not app.screen_stack
    app.main._highlighted(Tree.NodeHighlighted(node))  # what the message pump calls: nothing, now


async def test_findings_panel_on_second_user_report(real_ckpt):
    app = make_app(real_ckpt("hf-ds-zero2") / "checkpoint-2")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await press_and_wait(pilot, "f", lambda: isinstance(app.screen, FindingsScreen))
        screen = app.screen
        table = screen.query_one("DataTable")
        codes = [table.get_row_at(i)[2] for i in range(table.row_count)]
        assert "universal-info-missing" in codes
        target = codes.index("universal-info-missing")
        for row in range(1, target + 1):
            await press_and_wait(pilot, "j", lambda: table.cursor_row == row)
        await wait_for(pilot, lambda: "universal_checkpoint_info" in str(screen.query_one("#finding-message").render()))
        await wait_for(pilot, lambda: app.focused is table)  # enter selects the row
        await press_and_wait(pilot, "enter", lambda: app.screen is not screen)
        await wait_for(pilot, lambda: app.selected.path == "global_step2")


async def test_help_quit_confirmation_and_palette(fsdp_ckpt):
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await press_and_wait(pilot, "question_mark", lambda: isinstance(app.screen, HelpScreen))
        await press_and_wait(pilot, "escape", lambda: not isinstance(app.screen, HelpScreen))
        # a running job makes quit ask first
        import threading

        release = threading.Event()

        def wait(on_progress, cancel):
            release.wait(30)
            return "", []  # what a stats job returns, of no component shown: its end changes nothing

        app.main.start_job(JobInfo("stats", "fake wait"), wait)
        await press_and_wait(pilot, "q", lambda: isinstance(app.screen, ConfirmDialog))
        await press_and_wait(pilot, "n", lambda: not isinstance(app.screen, ConfirmDialog))
        assert app.is_running and app.return_code is None
        release.set()
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert "Export" in commands and "Findings" in commands


async def pick_from_palette(pilot, app, query: str, help_text: str) -> None:
    """ctrl+p, type ``query``, highlight the entry whose help is ``help_text`` (Textual's own commands share
    some titles with ours: its "Theme" opens a picker) and press enter: the palette closes and runs it."""
    from textual.command import CommandList, CommandPalette

    await press_and_wait(pilot, "ctrl+p", lambda: isinstance(app.screen, CommandPalette))
    palette = app.screen
    await pilot.press(*query)
    commands = palette.query_one(CommandList)

    def entry() -> int | None:
        for i in range(commands.option_count):
            if help_text in str(commands.get_option_at_index(i).prompt):
                return i
        return None

    await wait_for(pilot, lambda: entry() is not None)
    commands.highlighted = entry()
    await press_and_wait(pilot, "enter", lambda: not isinstance(app.screen, CommandPalette))


async def test_the_palette_runs_what_it_shows(fsdp_ckpt):
    """Choosing an entry in ctrl+p runs its action, as its key does: "Findings" (a main-screen action) opens
    the findings, "Theme" (an App action) switches the theme (issue 21: the coroutine was never awaited)."""
    from ckpt_tui.ui.actions import ACTIONS

    help_of = {a.id: a.help for a in ACTIONS}
    app = make_app(fsdp_ckpt)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pick_from_palette(pilot, app, "Findings", help_of["findings"])
        await wait_for(pilot, lambda: isinstance(app.screen, FindingsScreen))
        await press_and_wait(pilot, "escape", lambda: app.screen is app.main)
        before = app.theme
        await pick_from_palette(pilot, app, "Theme", help_of["theme"])
        await wait_for(pilot, lambda: app.theme != before)
        assert {before, app.theme} == {"textual-dark", "textual-light"} and app.screen is app.main
        # what cannot run now says why, in the words the help screen and the footer's dimming come from
        cancel = next(a for a in ACTIONS if a.id == "cancel")
        assert cancel.why_not(app.main) == "no job is running" and app.main.check_action(cancel.action, ()) is None
        await pick_from_palette(pilot, app, "Cancel", cancel.help)
        said = "Cancel: not now — no job is running."
        await wait_for(pilot, lambda: said in [n.message for n in app._notifications])
        assert app.screen is app.main


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
        await plan_in_tag_wizard(pilot, app, "u", UniversalWizard, "universal_checkpoint_info")
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "load_universal"), timeout=240)
        assert "Universal checkpoint ready" in screen_text(app)
        assert (ds_ckpt / "global_step2_universal" / "zero").is_dir()
        assert (ds_ckpt / "latest_universal").read_text().strip() == "global_step2_universal"


async def test_repair_wizard_fixes_in_place_and_rescans(ds_ckpt):
    from ckpt_tui.ui.screens.wizards import RepairWizard

    app = make_app(ds_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        assert "universal-info-missing" in {f.code for f in app.report.findings}
        await press_and_wait(pilot, "x", lambda: isinstance(app.screen, RepairWizard))
        wiz = app.screen
        await wait_for(pilot, lambda: "universal_checkpoint_info" in screen_text(app))
        await wait_for(pilot, lambda: step_ready(wiz, 0))
        await press_and_wait(pilot, "enter", lambda: step_ready(wiz, 1))  # the diff, then confirm
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "Repaired"), timeout=60)
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: app.report is not None and "universal-info-missing" not in {f.code for f in app.report.findings},
            timeout=60,
        )


async def test_the_scan_shows_its_progress_in_the_summary(tmp_path, monkeypatch):
    """While a large DCP .metadata is read, the summary line says how far (the tree alone would sit still)."""
    import threading

    from ckpt_tui.core.formats.dcp import reader as dcpfmt
    from ckpt_tui.core.formats.dcp import stream as dcp_stream
    from tests.functional.core.test_dcp_metadata_reader import write_many_chunks

    folder = tmp_path / "dcp"
    write_many_chunks(folder, ranks=1100)
    monkeypatch.setattr(dcpfmt, "PROGRESS_FROM", 0)
    gate = threading.Event()
    real = dcp_stream.compact

    def paused(data, on_frames=None):  # the first report, then wait until the test has seen it
        if on_frames is not None:
            on_frames(0, len(data))
            gate.wait(60)
        return real(data, on_frames)

    monkeypatch.setattr(dcp_stream, "compact", paused)
    app = make_app(folder)
    async with app.run_test(size=(120, 30)) as pilot:
        summary = app.main.query_one("#summary")
        try:
            await wait_for(pilot, lambda: "reading .metadata" in str(summary.render()))
            assert f"/{size((folder / '.metadata').stat().st_size)}  reading .metadata" in str(summary.render())
            # the walked tree shows while the analysis goes on (EARLY_TREE_AFTER after the walk), without findings
            tree = app.main.query_one(CheckpointTree)
            await wait_for(pilot, lambda: any(".metadata" in str(c.label) for c in tree.root.children))
            assert app.report is None
        finally:
            gate.set()
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        assert "Scanning" not in str(summary.render()) and "ranks: model in this folder" in str(summary.render())
