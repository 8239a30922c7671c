"""The export wizard on a LoRA run (issue 23): the tree badges the adapter, the details name its base, and `e`
offers the merged model (asking for the base, checked before the plan) and the adapter as PEFT saves it."""

from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file
from textual.widgets import Input, OptionList

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.format import fact_rows
from ckpt_tui.ui.screens.wizards import ExportWizard
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.fixtures import fixture_path
from tests.functional.ui.test_app import message_shown, press_and_wait, screen_text, step_ready, wait_for
from tests.util import ckpt_tui


async def _walk(pilot, app, pick: int, base: str | None = None):
    await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
    wiz = app.screen
    await wait_for(pilot, lambda: step_ready(wiz, 0))
    wiz.query_one("#source-list", OptionList).highlighted = pick
    steps = [s for s in wiz.STEPS[1:] if s != "base" or wiz.candidates[pick].component == "merged"]
    for name in steps:
        await press_and_wait(pilot, "enter", lambda: wiz.STEPS[wiz.step] == name and step_ready(wiz, wiz.step))
        if name == "base" and base is not None:
            wiz.query_one("#base-path", Input).value = base
    await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error, timeout=60)
    return wiz


async def test_the_tree_badges_the_adapter_and_the_wizard_merges_it(tmp_path, monkeypatch):
    v = tmp_path / "peft-llama"
    shutil.copytree(fixture_path("peft-llama"), v)
    ck = v / "run" / "checkpoint-2"
    monkeypatch.chdir(v / "run")  # where the user stands: the Trainer's output_dir
    app = make_app(ck)
    async with app.run_test(size=(120, 32)) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        tree = app.screen.query_one(CheckpointTree)
        assert "ADAPTER adapter_model.safetensors" in str(tree._by_path["adapter_model.safetensors"].label)
        await wait_for(pilot, lambda: getattr(app.screen.selected, "path", None) == "adapter_model.safetensors")
        rows = dict(fact_rows(app.screen.selected, app.report.inventory.adapter))  # what Facts shows for it
        assert rows["base"] == "base-model (found at ../base-model)", rows
        wiz = await _walk(pilot, app, 0)  # "merged into its base model", the base found where recorded
        assert wiz.plan is not None, wiz.plan_error
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "verified ✔"), timeout=90)
        assert "from_pretrained(" in screen_text(app)
    out = ck.parent / "checkpoint-2-safetensors"
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "cli-merged", cwd=v / "run")
    assert r.returncode == 0, r.stderr
    a, b = load_file(out / "model.safetensors"), load_file(v / "run" / "cli-merged" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


async def test_the_base_step_refuses_a_folder_that_is_no_model(tmp_path):
    v = tmp_path / "peft-llama"
    shutil.copytree(fixture_path("peft-llama"), v)
    app = make_app(v / "run" / "checkpoint-2")
    async with app.run_test(size=(120, 32)) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
        wiz = app.screen
        await wait_for(pilot, lambda: step_ready(wiz, 0))
        await press_and_wait(pilot, "enter", lambda: wiz.STEPS[wiz.step] == "base" and step_ready(wiz, wiz.step))
        wiz.query_one("#base-path", Input).value = str(tmp_path)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert wiz.STEPS[wiz.step] == "base"  # refused before any plan is made
        assert wiz.plan is None
