"""Pickles in a checkpoint that would create a canary file if unpickled: no command of ckpt-tui
runs them — inspect, the TUI's scan, export, verify, universal, fix — and each reports
`unsafe-pickle` naming the offending globals. Only --trust-pickles hands them to the loaders."""

import json
import pickle
import shutil
import subprocess
import sys

import pytest
import torch


class Payload:
    def __init__(self, canary):
        self.canary = str(canary)

    def __reduce__(self):
        return (open, (self.canary, "w"))


@pytest.fixture
def hostile(real_ckpt, tmp_path):
    canary = tmp_path / "CANARY"
    run = tmp_path / "run"
    run.mkdir()
    ds = run / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ds)
    # a DeepSpeed model-states file, a training_args.bin and a plain .pt, really re-saved with torch
    ms = ds / "global_step2" / "mp_rank_00_model_states.pt"
    sd = torch.load(ms, weights_only=False)
    sd["client_state_extra"] = Payload(canary)
    torch.save(sd, ms)
    torch.save(Payload(canary), ds / "training_args.bin")
    torch.save({"w": torch.ones(2), "hook": Payload(canary)}, ds / "extra.pt")
    # a DCP .metadata (DCP's own reader would plain-pickle.load it)
    fsdp = tmp_path / "fsdp"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", fsdp)
    meta_path = fsdp / "pytorch_model_fsdp_0" / ".metadata"
    meta = pickle.loads(meta_path.read_bytes())  # our own trusted fixture, before the payload
    meta.storage_meta = Payload(canary)
    meta_path.write_bytes(pickle.dumps(meta))
    assert not canary.exists()
    return {"canary": canary, "ds": ds, "fsdp": fsdp, "tmp": tmp_path}


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_no_command_runs_the_payload(hostile):
    canary, ds, fsdp, tmp = hostile["canary"], hostile["ds"], hostile["fsdp"], hostile["tmp"]
    r = cli("inspect", ds, "--json")
    doc = json.loads(r.stdout)
    unsafe = {f["path"]: f["message"] for f in doc["findings"] if f["code"] == "unsafe-pickle"}
    assert r.returncode == 1
    assert set(unsafe) >= {"global_step2/mp_rank_00_model_states.pt", "training_args.bin", "extra.pt"}
    assert all("open" in m for m in unsafe.values())
    r = cli("inspect", fsdp, "--json")
    unsafe = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "unsafe-pickle"]
    assert unsafe and unsafe[0]["path"] == "pytorch_model_fsdp_0"
    assert not canary.exists()

    r = cli("export", fsdp, "--out", tmp / "o1")
    assert r.returncode == 1 and "unsafe-pickle" in r.stderr and not (tmp / "o1").exists()
    r = cli("export", ds, "--out", tmp / "o2")
    assert r.returncode == 1 and "unsafe-pickle" in r.stderr
    r = cli("verify", tmp, "--against", ds)
    assert r.returncode in (1, 2)
    r = cli("universal", ds, "--out", tmp / "u")
    assert r.returncode == 1 and "pickle" in r.stderr and not (tmp / "u").exists()
    r = cli("fix", ds, "--yes")
    assert "Traceback" not in r.stderr
    r = cli("stats", fsdp)
    assert r.returncode == 1
    r = cli("diff", fsdp, ds)
    assert r.returncode == 1
    assert not canary.exists()


async def test_the_tui_scan_does_not_run_it(hostile):
    from ckpt_tui.ui.app import make_app

    app = make_app(hostile["ds"])
    async with app.run_test(size=(80, 24)) as pilot:
        while app.report is None:
            await pilot.pause(0.05)
        assert "unsafe-pickle" in {f.code for f in app.report.findings}
        await pilot.press("f")  # the findings panel lists them
        await pilot.pause(0.1)
    assert not hostile["canary"].exists()


def test_trust_pickles_is_the_only_way_in(hostile):
    """With --trust-pickles the reference loaders may run it: that is what the flag means."""
    r = cli("inspect", hostile["ds"], "--json", "--trust-pickles")
    sev = {f["severity"] for f in json.loads(r.stdout)["findings"] if f["code"] == "unsafe-pickle"}
    assert sev == {"info"}
    assert not hostile["canary"].exists()  # inspecting never runs it, trusted or not
