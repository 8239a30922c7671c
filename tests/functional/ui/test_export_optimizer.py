"""The export wizard offers the optimizer state, or both, where the core says the checkpoint has one it
exports (core.export.api.optimizer_exportable); "both" writes model and optimizer side by side into one
folder, and the done dialog shows the load code of each, which runs as shown."""

import json
import os
import shutil

from textual.widgets import Input, OptionList

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.dialogs import MessageDialog
from tests.functional.ui.test_app import message_shown, press_and_wait, screen_text, step_ready, wait_for
from tests.functional.ui.test_state import open_export_wizard
from tests.snippets import run_load_snippet, run_printed, snippet_after


async def choose(pilot, wiz, component: str, out: str, dtype: str = "keep") -> None:
    """On the first step, highlight the first source of ``component`` (model, optimizer, both), then walk to the
    plan with ``out`` as the output folder and ``dtype`` picked on the dtype step."""
    ol = wiz.query_one("#source-list", OptionList)
    ol.highlighted = [c.component for c in wiz.candidates].index(component)
    await press_and_wait(pilot, "enter", lambda: step_ready(wiz, 1))
    wiz.query_one("#out", Input).value = out
    for step in (2, 3, 4):
        await press_and_wait(pilot, "enter", lambda: step_ready(wiz, step) or wiz.step == step)
        if step == 2:
            wiz.query_one("#dtype-list", OptionList).highlighted = ["keep", "fp32", "bf16", "fp16"].index(dtype)
    await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error != "", timeout=60)
    assert wiz.plan is not None, wiz.plan_error


def app_on_checkpoint_2(real_ckpt, fixture: str, tmp_path, monkeypatch):
    """The app on a copy of ``fixture``'s ``checkpoint-2``, opened from the folder holding it."""
    shutil.copytree(real_ckpt(fixture) / "checkpoint-2", tmp_path / "checkpoint-2")
    monkeypatch.chdir(tmp_path)
    return make_app(tmp_path / "checkpoint-2")


async def test_both_writes_model_and_optimizer_side_by_side(real_ckpt, tmp_path, monkeypatch):
    app = app_on_checkpoint_2(real_ckpt, "hf-fsdp2", tmp_path, monkeypatch)
    async with app.run_test(size=(120, 60)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        shown = [(c.component, c.path) for c in wiz.candidates]
        model = ("model", "pytorch_model_fsdp_0")
        assert shown[0] == model and shown[-2:] == [("optimizer", model[1]), ("both", model[1])]
        assert wiz.source() == wiz.candidates[0]  # the model stays the default
        await choose(pilot, wiz, "both", str(tmp_path / "both"))
        # the free-space line counted both exports, as the core's export_needs does
        from ckpt_tui.core.export.api import export_needs

        node = app.report.inventory.node("pytorch_model_fsdp_0")
        both = wiz.candidates[-1]
        await wait_for(pilot, lambda: isinstance(wiz.output_bytes.get(both), int))
        assert wiz.output_bytes[both] == export_needs(app.report, node) + export_needs(
            app.report, node, component="optimizer"
        )
        text = screen_text(app)
        assert "The model:" in text and "The optimizer state:" in text
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "Load it with:"), timeout=120)
        shown = screen_text(app)
    assert sorted(os.listdir(tmp_path / "both")) == [
        "model.safetensors",
        "optimizer.safetensors",
        "optimizer_config.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    parts = shown.split("Load it with:\n")
    assert len(parts) == 3  # the model's code, then the optimizer's
    optim_code = snippet_after("Load it with:\n" + parts[2])
    run_load_snippet(snippet_after(shown), tmp_path, "hf-fsdp2")
    assert run_printed(optim_code, tmp_path, "{'n': len(sd), 'step': config['step']}") == {"n": 42, "step": 2}


async def test_optimizer_only_and_not_offered_without_one(real_ckpt, real_ckpt_copy, tmp_path):
    app = make_app(real_ckpt_copy("lightning-file-optim"))
    async with app.run_test(size=(120, 40)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        await choose(pilot, wiz, "optimizer", str(tmp_path / "optim"))
        await press_and_wait(pilot, "enter", lambda: (tmp_path / "optim").exists(), timeout=120)
        await wait_for(pilot, lambda: isinstance(app.screen, MessageDialog), timeout=60)
    assert sorted(os.listdir(tmp_path / "optim")) == ["optimizer.safetensors", "optimizer_config.json"]
    app = make_app(real_ckpt("fsdp1-dcp"))  # model weights only: nothing else offered
    async with app.run_test(size=(120, 40)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        assert {c.component for c in wiz.candidates} == {"model"} and wiz.optimizer_at is None


async def test_both_in_bf16_keeps_the_optimizer_state_as_stored(real_ckpt, tmp_path, monkeypatch):
    """bf16 chosen for "both" halves the model; the fp32 masters and Adam moments are written as stored (bf16
    moments would not resume the run), and the dtype step says so before the user picks."""
    import torch
    from safetensors.torch import load_file

    app = app_on_checkpoint_2(real_ckpt, "hf-ds-zero2", tmp_path, monkeypatch)
    async with app.run_test(size=(120, 60)) as pilot:
        wiz = await open_export_wizard(pilot, app)
        await choose(pilot, wiz, "both", str(tmp_path / "both"), dtype="bf16")
        assert "the optimizer state is written as stored" in str(wiz.query_one("#dtype-note").render())
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "Load it with:"), timeout=120)
    model = load_file(tmp_path / "both" / "model.safetensors")
    optim = load_file(tmp_path / "both" / "optimizer.safetensors")
    assert {t.dtype for t in model.values()} == {torch.bfloat16}
    assert {t.dtype for t in optim.values()} == {torch.float32} and any(k.endswith(".master") for k in optim)
    assert json.loads((tmp_path / "both" / "optimizer_config.json").read_text())["dtype"] == "keep"
