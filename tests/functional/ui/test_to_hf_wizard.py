"""The export wizard offers `--to hf` (issue 27) where inspect found a Llama-family Megatron-Core or torchtitan model:
right after the checkpoint's own entry, "a Hugging Face model (--to hf)"; it asks for the model's config.json only
where the checkpoint records no configuration (checked before the plan); the folder it writes loads (config.json)
and its tensors are the CLI's `export --to hf` output's, bit for bit."""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import load_file
from textual.widgets import Input, OptionList

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.wizards import ExportWizard
from tests.fixtures import fixture_path
from tests.functional.ui.test_app import message_shown, press_and_wait, step_ready, wait_for
from tests.util import ckpt_tui


async def _open(pilot, app) -> ExportWizard:
    await wait_for(pilot, lambda: app.report is not None, timeout=60)
    await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
    wiz = app.screen
    await wait_for(pilot, lambda: step_ready(wiz, 0))
    return wiz


def _pick_hf(wiz: ExportWizard, path: str) -> int:
    labels = [(c.component, c.path) for c in wiz.candidates]
    i = labels.index(("hf", path))
    assert labels[i - 1] == ("model", path), labels  # right after the checkpoint's own entry
    assert "a Hugging Face model (--to hf)" in wiz.candidates[i].label()
    wiz.query_one("#source-list", OptionList).highlighted = i
    return i


async def _walk(pilot, wiz: ExportWizard, out, config: str | None = None) -> None:
    steps = [s for s in wiz.STEPS[1:] if s != "config" or config is not None]
    for name in steps:
        await press_and_wait(pilot, "enter", lambda: wiz.STEPS[wiz.step] == name and step_ready(wiz, wiz.step))
        if name == "config":
            wiz.query_one("#config-path", Input).value = config
        if name == "output":
            wiz.query_one("#out", Input).value = str(out)
    await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error, timeout=60)


def _same_as_cli(out, cli) -> None:
    assert json.loads((out / "config.json").read_text()) == json.loads((cli / "config.json").read_text())
    a, b = load_file(out / "model.safetensors"), load_file(cli / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert "model.embed_tokens.weight" in a and "model.layers.0.self_attn.q_proj.weight" in a


async def test_megatron_to_hf_from_the_wizard(tmp_path, monkeypatch):
    v = tmp_path / "megatron-hf-tp2"
    shutil.copytree(fixture_path("megatron-hf-tp2"), v)
    monkeypatch.chdir(tmp_path)
    app = make_app(v)
    async with app.run_test(size=(120, 32)) as pilot:
        wiz = await _open(pilot, app)
        assert "config" in wiz.STEPS
        i = _pick_hf(wiz, "checkpoints/iter_0000010")
        await _walk(pilot, wiz, tmp_path / "tui-hf")  # the run's args say it all: no config step
        assert wiz.plan is not None, wiz.plan_error
        assert [name for name, _ in wiz.plan.plan.extra_files] == ["config.json"]
        await wait_for(pilot, lambda: wiz.candidates[i] in wiz.output_bytes)
        need = wiz.output_bytes[wiz.candidates[i]]  # the free space the output step showed
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "verified ✔"), timeout=90)
    # what --to hf writes, byte for byte (the plain export's files differ: names, headers, no config.json)
    assert need == sum(p.stat().st_size for p in (tmp_path / "tui-hf").iterdir())
    r = ckpt_tui("export", str(v), "--to", "hf", "--out", str(tmp_path / "cli-hf"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    _same_as_cli(tmp_path / "tui-hf", tmp_path / "cli-hf")


async def test_torchtitan_to_hf_asks_for_the_config_where_the_run_saved_none(tmp_path, monkeypatch):
    v = tmp_path / "torchtitan-hf"
    shutil.copytree(fixture_path("torchtitan-hf"), v)
    # the config the run's job config gives, as an HF config.json; then the job config gone
    r = ckpt_tui("export", str(v / "checkpoint/step-1"), "--to", "hf", "--out", str(tmp_path / "cli-hf"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    given = tmp_path / "given.json"
    given.write_text((tmp_path / "cli-hf" / "config.json").read_text())
    (v / "job_config.json").unlink()
    monkeypatch.chdir(tmp_path)
    app = make_app(v)
    async with app.run_test(size=(120, 32)) as pilot:
        wiz = await _open(pilot, app)
        _pick_hf(wiz, "checkpoint/step-1")
        # the config step refuses what is no config.json before any plan is made
        await press_and_wait(pilot, "enter", lambda: wiz.STEPS[wiz.step] == "config" and step_ready(wiz, wiz.step))
        wiz.query_one("#config-path", Input).value = str(tmp_path / "nothing-here")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert wiz.STEPS[wiz.step] == "config" and wiz.plan is None
        wiz.query_one("#config-path", Input).value = str(given)
        for name in wiz.STEPS[wiz.STEPS.index("output") :]:
            await press_and_wait(pilot, "enter", lambda: wiz.STEPS[wiz.step] == name and step_ready(wiz, wiz.step))
            if name == "output":
                wiz.query_one("#out", Input).value = str(tmp_path / "tui-hf")
        await wait_for(pilot, lambda: wiz.plan is not None or wiz.plan_error, timeout=60)
        assert wiz.plan is not None, wiz.plan_error
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "verified ✔"), timeout=90)
    _same_as_cli(tmp_path / "tui-hf", tmp_path / "cli-hf")
