"""The main screen's state, check_action and workers, driven with Pilot on copies of real fixtures: the
regressions of issue 12 (errors first, a disabled Export on an invalid plan, dimmed keys while scanning,
stats that fill the table, the help that scrolls, dialogs that fit 24 rows, a cancel from the jobs panel)."""

import shutil

import pytest
from textual.widgets import Button, DataTable
from textual.widgets._footer import FooterKey

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.jobs import outcome
from ckpt_tui.ui.screens.dialogs import ConfirmDialog, HelpScreen, MessageDialog
from ckpt_tui.ui.screens.findings import FindingsScreen
from ckpt_tui.ui.screens.main import MainScreen
from ckpt_tui.ui.screens.wizards import ExportWizard, RepairWizard
from ckpt_tui.ui.widgets.details import Facts, TensorTable
from ckpt_tui.ui.widgets.jobs_panel import JobRow
from tests.functional.ui.test_app import press_and_wait, step_ready, wait_for
from tests.util import FileLease


def text_of(static) -> str:
    """What a Static shows, rich renderables (tables, groups) included, as plain text."""
    import io

    from rich.console import Console

    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(static.content)
    return console.export_text()


@pytest.fixture
def dangling(real_ckpt, tmp_path):
    """ds-zero2-bf16 with `latest` naming a tag that does not exist (an error) and, as saved, no
    universal_checkpoint_info (a warning)."""
    d = tmp_path / "ds"
    shutil.copytree(real_ckpt("ds-zero2-bf16"), d)
    (d / "latest").write_text("global_step999")
    return d


async def test_errors_lead_the_details_pane_the_findings_panel_and_x(dangling):
    app = make_app(dangling)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None and app.selected is not None)
        assert {f.code: f.severity for f in app.report.findings} == {
            "latest-dangling": "error",
            "universal-info-missing": "warning",
        }
        assert app.selected.path == "global_step2"  # the model: its own finding is the warning
        facts = text_of(app.main.query_one(Facts))
        assert facts.index("latest-dangling") < facts.index("universal-info-missing")
        await press_and_wait(pilot, "f", lambda: isinstance(app.screen, FindingsScreen))
        table = app.screen.query_one(DataTable)
        assert [table.get_row_at(i)[2] for i in range(table.row_count)][0] == "latest-dangling"
        await press_and_wait(pilot, "escape", lambda: isinstance(app.screen, MainScreen))
        await press_and_wait(pilot, "x", lambda: isinstance(app.screen, RepairWizard))
        assert app.screen.repair.id == "latest"
        text = " ".join(str(s.render()) for s in app.screen.query("Static"))
        assert text.count(app.screen.repair.title) == 1  # the title once, not twice


async def test_x_plans_its_repair_off_the_ui_thread(dangling, monkeypatch):
    """Planning a repair reads the file it would change (a pickle in a torch zip, on NFS perhaps): x asks the
    core in a worker, and the wizard opens when the plan is there."""
    import threading

    import ckpt_tui.core.repair as repair

    threads = []
    real = repair.repairs_for

    def repairs_for(rep):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(rep)

    monkeypatch.setattr(repair, "repairs_for", repairs_for)
    app = make_app(dangling)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await press_and_wait(pilot, "x", lambda: isinstance(app.screen, RepairWizard))
        assert app.screen.repair.id == "latest"
    assert threads == [False]


async def open_export_wizard(pilot, app) -> ExportWizard:
    """After the scan, `e`: the export wizard at its first step."""
    await wait_for(pilot, lambda: app.report is not None)
    await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
    wiz = app.screen
    await wait_for(pilot, lambda: step_ready(wiz, 0))
    return wiz


async def test_export_is_disabled_when_the_plan_is_invalid(real_ckpt, tmp_path):
    d = tmp_path / "checkpoint-2000"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", d)
    shard = sorted((d / "pytorch_model_fsdp_0").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    app = make_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        for step in (1, 2, 3, 4):
            await press_and_wait(pilot, "enter", lambda: step_ready(wiz, step) or wiz.step == step)
        await wait_for(pilot, lambda: wiz.plan_error != "")
        assert wiz.plan is None
        nxt = wiz.query_one("#next", Button)
        assert nxt.disabled and "Export" in str(nxt.label)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.screen is wiz and not (tmp_path / "checkpoint-2000-safetensors").exists()


async def test_the_free_space_line_counts_what_the_export_writes(real_ckpt, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(real_ckpt("ds-zero2-bf16"), d)
    app = make_app(d)
    async with app.run_test(size=(100, 30)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        await press_and_wait(pilot, "enter", lambda: step_ready(wiz, 1))
        await wait_for(pilot, lambda: "writes about" in str(wiz.query_one("#space").render()))
        need = wiz.output_bytes[wiz.source()]
        tag = app.report.inventory.node(wiz.source().path)
        assert need < tag.size / 2  # the model weights, not the optimizer states beside them


async def test_the_output_folder_is_asked_in_a_worker_and_a_stale_answer_is_dropped(real_ckpt, tmp_path, monkeypatch):
    """The free space and whether the folder is empty are asked off the UI thread (a statvfs or a listing on NFS
    can take seconds), 250 ms after the last keystroke, "checking…" meanwhile; an answer for what was typed
    before arrives late and is dropped (issue 21)."""
    import threading

    from textual.widgets import Input

    from ckpt_tui.ui.screens.wizards import export as export_wizard

    d = tmp_path / "ds"
    shutil.copytree(real_ckpt("ds-zero2-bf16"), d)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    slow = str(tmp_path / "slow")
    gate = threading.Event()
    asked: list[tuple[str, bool]] = []  # (the value, asked on the UI thread)
    real = export_wizard.check_output

    def check(typed, inv):
        asked.append((typed, threading.current_thread() is threading.main_thread()))
        if typed == slow:
            gate.wait(30)  # its answer comes after the next value's
        return real(typed, inv)

    monkeypatch.setattr(export_wizard, "check_output", check)
    app = make_app(d)
    async with app.run_test(size=(100, 30)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        answered: list[str] = []
        checked = wiz._checked

        def seen(c) -> None:
            answered.append(c.typed)
            checked(c)

        wiz._checked = seen
        await press_and_wait(pilot, "enter", lambda: step_ready(wiz, 1))
        space, out = wiz.query_one("#space"), wiz.query_one("#out", Input)
        await wait_for(pilot, lambda: "writes about" in str(space.render()))
        out.value = slow
        await wait_for(pilot, lambda: slow in [v for v, _ in asked])
        assert str(space.render()) == "Checking the output folder…"
        out.value = ""
        await pilot.press(*str(full))  # each keystroke restarts the wait: not one ask per key
        await wait_for(pilot, lambda: wiz.current_check() is not None)
        assert wiz.current_check().refusal == f"{full} exists and is not empty: choose another folder"
        assert str(space.render()).startswith("Free in ") and "writes about" in str(space.render())
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert wiz.step == 1  # refused: the folder is not empty
        gate.set()
        await wait_for(pilot, lambda: slow in answered)
        assert wiz.current_check().typed == str(full)  # the late answer for `slow` was dropped
        out.value = str(tmp_path / "new")
        await pilot.press("enter", "enter")  # typed ahead of the disk's answer: each press counts, in order
        await wait_for(pilot, lambda: step_ready(wiz, 3))
    assert not [v for v, on_ui in asked if on_ui], "the disk was asked on the UI thread"
    assert len({v for v, _ in asked if v not in (slow, str(full))}) < len(str(full)) - 1  # not one per key


async def test_keys_that_need_the_scan_are_dimmed_while_it_runs(real_ckpt, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(real_ckpt("ds-zero2-bf16"), d)
    with FileLease(d / "latest") as lease:  # the scan reads it: it waits there, scanning
        app = make_app(d)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_for(pilot, lease.blocked)
            main = app.main
            assert main.report is None
            for action in ("export", "universal", "fix", "findings", "stats"):
                assert main.check_action(action, ()) is None and main.why_not(action) == "still scanning"

            def dimmed():
                keys = {k.key: k.has_class("-disabled") for k in main.query(FooterKey)}
                return all(keys.get(k) for k in "euxs")

            await wait_for(pilot, dimmed)
            await pilot.press("e")
            await pilot.pause(0.1)
            assert app.screen is main  # nothing opened, nothing printed
            await press_and_wait(pilot, "question_mark", lambda: isinstance(app.screen, HelpScreen))
            keys = [line for s in app.screen.query("Static") for line in text_of(s).splitlines()]
            assert any(line.startswith("e ") and "not now: still scanning" in line for line in keys)
            await press_and_wait(pilot, "escape", lambda: app.screen is main)
            lease.release()
            await wait_for(pilot, lambda: main.report is not None, timeout=60)
            await wait_for(
                pilot, lambda: not any(k.has_class("-disabled") for k in main.query(FooterKey) if k.key in "eufx")
            )
            assert main.check_action("export", ()) is True


async def test_the_help_screen_scrolls_with_j_and_k(real_ckpt):
    app = make_app(real_ckpt("ds-zero2-bf16"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await press_and_wait(pilot, "question_mark", lambda: isinstance(app.screen, HelpScreen))
        body = app.screen.query_one("VerticalScroll")
        await wait_for(pilot, lambda: body.max_scroll_y > 0)
        await press_and_wait(pilot, "j", lambda: body.scroll_y == 1)
        await press_and_wait(pilot, "j", lambda: body.scroll_y == 2)
        await press_and_wait(pilot, "k", lambda: body.scroll_y == 1)


async def test_a_long_message_keeps_its_close_button_on_a_24_row_screen(real_ckpt):
    app = make_app(real_ckpt("ds-zero2-bf16"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        app.push_screen(MessageDialog("Universal checkpoint ready ✔", "\n".join(f"line {i}" for i in range(60))))
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog) and app.screen.query("#close"))
        close = app.screen.query_one("#close")
        await wait_for(pilot, lambda: close.region.height == 3)
        assert close.region.bottom <= 24 and app.screen.region.contains_region(close.region)


async def test_stats_fill_the_columns_and_count_nan(real_ckpt, tmp_path):
    from safetensors.torch import load_file, save_file

    src = real_ckpt("hf-ds-zero2") / "checkpoint-2" / "model.safetensors"
    d = tmp_path / "m"
    d.mkdir()
    tensors = load_file(src)
    names = sorted(tensors)[:3]
    for n in names:
        t = tensors[n].clone().float()
        t.view(-1)[0] = float("nan")
        tensors[n] = t
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    app = make_app(d / "model.safetensors")
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None and app.main.listing[0])
        await press_and_wait(pilot, "s", lambda: app.main.stats, timeout=60)
        table = app.main.query_one(TensorTable).query_one(DataTable)
        labels = lambda: [str(c.label) for c in table.columns.values()]
        await wait_for(pilot, lambda: "min" in labels() and "max" in labels())  # narrow: size/dtype may give way
        first = table.get_row_at(0)
        assert str(first[labels().index("min")]) and str(first[labels().index("max")])  # min and max filled
        line = str(app.main.query_one("#stats-summary").render())
        assert "3 tensors with NaN" in line and app.main.query_one("#stats-summary").has_class("bad")


async def test_cancel_an_export_from_the_jobs_panel_leaves_no_output(real_ckpt, tmp_path):
    d = tmp_path / "checkpoint-2000"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", d)
    (d / "tokenizer.model").write_bytes(b"tokenizer")
    app = make_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        from ckpt_tui.core.export.api import plan_export

        plan, _ = plan_export(d, tmp_path / "out")
        main = app.main
        assert main.check_action("cancel_job", ()) is None  # nothing to cancel yet
        with FileLease(d / "tokenizer.model") as lease:
            worker = main.run_export(plan)
            await wait_for(pilot, lease.blocked, timeout=60)
            row = main.query_one(JobRow)
            assert row.worker is worker and outcome(worker) == "running"
            await wait_for(pilot, lambda: main.check_action("cancel_job", ()) is True)
            await press_and_wait(pilot, "c", lambda: isinstance(app.screen, ConfirmDialog))
            await press_and_wait(pilot, "y", lambda: row.outcome == "cancelling")
        await wait_for(pilot, lambda: row.outcome == "cancelled", timeout=60)
        assert outcome(worker) == "cancelled"
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
        await wait_for(pilot, lambda: main.check_action("cancel_job", ()) is None)


async def test_universal_asks_the_core_which_tag_and_says_why_not(dangling):
    """`u` converts the tag `ckpt-tui universal` would: with `latest` naming no tag folder the core
    refuses to guess, so `u` is dimmed with that reason until a tag folder is selected."""
    app = make_app(dangling)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None and app.selected is not None)
        main = app.main
        from ckpt_tui.ui.widgets.tree import CheckpointTree

        tree = main.query_one(CheckpointTree)
        tree.select_path(".")  # as the user moves the cursor to the top
        await wait_for(pilot, lambda: main.selected is not None and main.selected.path == ".")
        why = main.why_not("universal")
        assert why and "global_step999" in why and "select a tag folder" in why
        assert main.check_action("universal", ()) is None  # dimmed in the footer
        tree.select_path("global_step2")
        await wait_for(pilot, lambda: main.selected.path == "global_step2")
        assert main.why_not("universal") is None and main.universal_tag().path == "global_step2"


async def test_universal_in_a_run_whose_newest_checkpoint_is_not_deepspeed_names_the_tag(real_ckpt, monkeypatch):
    """The demo run: the newest checkpoint is FSDP, so `ckpt-tui universal demo` would refuse it; `u` says
    which tag folder to select instead of claiming there is none."""
    demo = real_ckpt("demo")
    monkeypatch.chdir(demo.parent)
    app = make_app(demo.name)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.report is not None and app.selected is not None)
        why = app.main.why_not("universal")
        assert why and "select one" in why and "deepspeed-zero2/global_step3" in why, why
