"""The hostile pickles of test_hostile_pickles.py opened in the TUI (issue 20, "no canary appears in any command ...
TUI via Pilot and tmux"): a DCP ``.metadata`` whose payload hides after a chunk-record-like string, and torch zips
with two ``data.pkl`` (DeepSpeed's ``mp_rank_00_model_states.pt``, a plain ``pytorch_model.bin``).

The scan shows the finding; every key that hands files to a loader — `s` (stats), `e` with the export wizard's
defaults, and for the DeepSpeed tag `u` (universal) and `m` (convert to torch DCP) — is refused with a message on
screen, never a crash, and the payload never runs (the conftest guard also checks no CANARY and no write outside).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.dialogs import MessageDialog
from ckpt_tui.ui.screens.findings import FindingsScreen
from ckpt_tui.ui.screens.wizards import ExportWizard, PlannedWizard
from tests.functional.ui.test_app import press_and_wait, screen_text, step_ready, wait_for

SIZE = (120, 40)


def cases(request) -> tuple:
    """(the path the app opens, the finding's code, its node's path, a word of its message)."""
    which = request.param
    if which == "dcp-hidden":
        return request.getfixturevalue("dcp_hidden"), "unsafe-pickle", "pytorch_model_fsdp_0", "builtins.open"
    two = request.getfixturevalue("zip_two_pkl")
    if which == "ds-two-data-pkl":
        return two["ds"], "file-corrupt", "global_step2/mp_rank_00_model_states.pt", "data.pkl"
    return two["single"], "file-corrupt", ".", "data.pkl"


@pytest.fixture(params=["dcp-hidden", "ds-two-data-pkl", "single-two-data-pkl"])
def hostile(request):
    return cases(request)


async def scanned(pilot, app, code: str, where: str):
    await wait_for(pilot, lambda: app.report is not None, timeout=120)
    found = [f for f in app.report.findings if f.code == code and f.path == where]
    assert found and found[0].severity == "error", [(f.code, f.path, f.severity) for f in app.report.findings]
    await wait_for(pilot, lambda: app.selected is not None)
    return found[0]


def on_main(app) -> bool:
    return app.screen is app.main


async def refused_in_dialog(pilot, app, title: str, word: str, canary) -> None:
    """A MessageDialog says why (``title`` in its heading, ``word`` in its body); enter closes it, back to the tree."""
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, MessageDialog) and bool(app.screen.query("VerticalScroll Static")),
        timeout=120,
    )
    text = screen_text(app)
    assert title in text and word in text and "Traceback" not in text, text
    assert not canary.exists() and app.crash is None
    await press_and_wait(pilot, "enter", lambda: on_main(app))


async def plan_refused(pilot, app, wiz, steps: int, word: str, canary) -> None:
    """Walk ``wiz`` with its defaults to the plan (``steps`` enters): it cannot be planned and says why, its run
    button disabled and the focus on Back; the run key is refused; esc steps back and closes it."""
    await wait_for(pilot, lambda: step_ready(wiz, 0))
    for step in range(1, steps + 1):
        await press_and_wait(pilot, "enter", lambda: step_ready(wiz, step) or wiz.step == step)
    await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error != "", timeout=120)
    assert wiz.plan is None, "planned a run over a hostile file"
    assert word in wiz.plan_error and "Traceback" not in wiz.plan_error, wiz.plan_error
    text = screen_text(app)
    assert f"{wiz.FAILED}:" in text and word in text
    assert wiz.query_one("#next").disabled and app.focused is wiz.query_one("#back")
    await pilot.press("ctrl+n")  # the run key all the same: the step is refused, nothing starts
    await pilot.press("escape")  # the focus moved nowhere: esc steps back, as from the Back button
    await wait_for(pilot, lambda: wiz.step == steps - 1)
    assert not [info for info in app.main.jobs.values() if info.kind in ("export", "universal", "resume")]
    assert not canary.exists() and app.crash is None
    for step in range(steps - 2, -2, -1):  # back through the steps, then cancel
        await press_and_wait(pilot, "escape", lambda: on_main(app) if step < 0 else wiz.step == step)


async def test_scan_shows_the_finding_and_stats_and_export_are_refused(hostile, canary, tmp_path):
    path, code, where, word = hostile
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await scanned(pilot, app, code, where)
        await press_and_wait(pilot, "f", lambda: isinstance(app.screen, FindingsScreen))  # the panel lists it
        table = app.screen.query_one("DataTable")
        await wait_for(pilot, lambda: table.row_count > 0)
        assert table.get_row_at(0)[2] == code  # most severe first
        await wait_for(pilot, lambda: word in str(app.screen.query_one("#finding-message").render()))
        await press_and_wait(pilot, "escape", lambda: on_main(app))
        await pilot.press("s")
        await refused_in_dialog(pilot, app, "failed", word, canary)
        assert app.main.stats is None or not app.main.stats
        await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
        await plan_refused(pilot, app, app.screen, 4, word, canary)  # source, output, dtype, shards, the plan
    assert app.crash is None and not canary.exists()
    assert not [p for p in tmp_path.rglob("*safetensors*") if p.is_dir()], "an export folder was made"


@pytest.mark.parametrize("key", ["u", "m"])
async def test_deepspeed_conversions_are_refused(zip_two_pkl, canary, tmp_path, key):
    from ckpt_tui.ui.screens.wizards import ResumeWizard, UniversalWizard

    wizard = UniversalWizard if key == "u" else ResumeWizard
    ck = zip_two_pkl["ds"]
    before = sorted(p.name for p in ck.iterdir())
    app = make_app(ck)
    async with app.run_test(size=SIZE) as pilot:
        await scanned(pilot, app, "file-corrupt", "global_step2/mp_rank_00_model_states.pt")
        await press_and_wait(pilot, key, lambda: isinstance(app.screen, PlannedWizard))
        assert isinstance(app.screen, wizard)
        await plan_refused(pilot, app, app.screen, 2, "data.pkl", canary)  # why, output, the plan
    assert app.crash is None and not canary.exists()
    assert sorted(p.name for p in ck.iterdir()) == before  # no universal tag, no temp folder left in the source


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_hidden_dcp_payload_stats_and_export_refused(dcp_hidden, canary):
    """The real app in a real terminal on the DCP folder whose payload hides after a chunk-record-like string:
    the finding is on the pane, `s` and `e` (the wizard's defaults) say why they cannot run, the payload never
    runs and the app quits cleanly."""
    from tests.tmux import Tmux

    with Tmux(f"{sys.executable} -m ckpt_tui {dcp_hidden}", {"TERM": "xterm-256color"}, size=(120, 40)) as t:
        t.wait_for("unsafe-pickle", timeout=120)
        t.keys("f")
        t.wait_for_all("Findings (", "builtins.open")
        t.keys("Escape")
        t.wait_gone("Findings (")
        t.keys("s")
        s = t.wait_for_all("cannot read the weights", "unsafe-pickle", timeout=120)  # the dialog (and the job row)
        assert "Traceback" not in s
        t.keys("Enter")
        t.wait_gone("cannot read the weights")
        t.keys("e")
        t.wait_for("Export to safetensors")
        t.wait_for("Step 1 of 5")
        t.enter_through("Step 2 of 5", "Step 3 of 5", "Step 4 of 5", "Step 5 of 5")
        s = t.wait_for_all("Cannot export", "unsafe-pickle", timeout=120)
        assert "Traceback" not in s and not canary.exists()
        for step in (4, 3, 2, 1):  # esc steps back (the run button is disabled), then cancels
            t.keys("Escape")
            t.wait_for(f"Step {step} of 5")
        t.keys("Escape")
        t.wait_gone("Export to safetensors")
        t.keys("q")
        assert t.exit_code() == 0
    assert not canary.exists()
    assert not (dcp_hidden.parent / f"{dcp_hidden.name}-safetensors").exists()
