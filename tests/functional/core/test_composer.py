"""composer's monolithic checkpoint (issue 25): ``ep0-ba2-rank0.pt`` as composer 0.32.1's Trainer writes it on torch
2.7.0 (committed with its oracle under tests/data/composer/: its producer's venv is ~5 GB of CUDA wheels, see
ckpt_tui/samples/composer_run.py). Its pickle names ``datetime.timedelta`` (the timestamp's wall-clock times) and
``torch.torch_version.TorchVersion`` (its metadata): data, read as inert stand-ins. The model is ``state.model``
with the ComposerModel's one attribute (``module.``) stripped; the optimizer ``state.optimizers.AdamW``; never the
RNG state or the Adam moments as weights. Oracle: the live run's model and optimizer, recorded by the generator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.util import ckpt_tui, load_optimizer_export

DATA = Path(__file__).resolve().parents[2] / "data" / "composer"


@pytest.fixture
def run(tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(DATA, d, symlinks=True)
    return d


def _oracle(name: str, strip: str = "module.") -> dict:
    return {k.removeprefix(strip): v for k, v in load_file(DATA / "oracle" / name).items()}


def test_it_is_composer_with_its_model_and_optimizer_and_no_finding(run):
    assert (run / "ckpts" / "latest-rank0.pt").is_symlink()  # as composer leaves it
    doc = json.loads(ckpt_tui("inspect", "ckpts", "--json", cwd=run).stdout)
    assert doc["layout"] == "composer" and doc["findings"] == [], doc["findings"]
    assert doc["components"] == {"model+optimizer": "ep0-ba2-rank0.pt"}
    model = sum(v.numel() for v in load_file(DATA / "oracle" / "model.safetensors").values())
    assert model == 676 and "676 params" in doc["summary"], doc["summary"]  # not the RNG state or the moments


def test_tensors_lists_the_model_as_export_writes_it_and_the_optimizer_apart(run):
    r = ckpt_tui("tensors", "ckpts", "--json", cwd=run)
    listed = {t["name"]: tuple(t["shape"]) for t in json.loads(r.stdout)["tensors"]}
    assert listed == {k: tuple(v.shape) for k, v in _oracle("model.safetensors").items()}
    r = ckpt_tui("tensors", "ckpts", "--component", "optimizer", "--json", cwd=run)
    opt = [t["name"] for t in json.loads(r.stdout)["tensors"]]
    assert opt and all(n.startswith("state.optimizers.AdamW.") for n in opt) and not any("rng" in n for n in opt)


def test_model_export_is_the_live_model_bit_exact_and_verifies(run):
    r = ckpt_tui("export", "ckpts", "--out", "out", cwd=run)
    assert r.returncode == 0, r.stderr
    assert "stripped the ComposerModel attribute prefix `module.`" in r.stdout + r.stderr
    got, want = load_file(run / "out" / "model.safetensors"), _oracle("model.safetensors")
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    r = ckpt_tui("verify", "out", "--against", "ckpts", cwd=run)  # torch.load, given bytes ckpt-tui screened
    assert r.returncode == 0 and "0 mismatched, 0 missing" in r.stdout, r.stdout + r.stderr
    r = ckpt_tui("export", "ckpts", "--out", "kept", "--keep-prefix", cwd=run)
    assert r.returncode == 0 and sorted(load_file(run / "kept" / "model.safetensors")) == sorted(
        load_file(DATA / "oracle" / "model.safetensors")
    )


def test_optimizer_export_is_the_live_optimizer_bit_exact(run):
    r = ckpt_tui("export", "ckpts", "--component", "optimizer", "--out", "opt", cwd=run)
    assert r.returncode == 0, r.stderr
    sd = load_optimizer_export(run / "opt")
    want = _oracle("optimizer.safetensors")
    assert sorted(sd) == sorted(want) and all(torch.equal(sd[k], want[k]) for k in want)
    cfg = json.loads((run / "opt" / "optimizer_config.json").read_text())
    assert cfg["step"] == 2 and cfg["param_groups"][0]["lr"] == 0.01
    assert cfg["param_groups"][0]["params"] == ["1.weight", "1.bias", "3.weight", "3.bias"]


def test_a_composer_shaped_file_naming_code_is_refused_and_nothing_runs(tmp_path):
    """composer's layout opens no door: a file shaped like its checkpoint whose timestamp is a callable that
    would run a command is an unsafe-pickle error, and export refuses it."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    d = tmp_path / "ckpts"
    d.mkdir()
    torch.save(
        {"state": {"model": {"w": torch.ones(2)}, "timestamp": Evil(), "optimizers": {}}, "rng": []},
        d / "ep0-ba2-rank0.pt",
    )
    with zipfile.ZipFile(d / "ep0-ba2-rank0.pt") as zf:  # the callable's global, in the pickle stream
        assert any(b"\ncall\n" in zf.read(n) for n in zf.namelist() if n.endswith("data.pkl"))
    doc = json.loads(ckpt_tui("inspect", "ckpts", "--json", cwd=tmp_path).stdout)
    (f,) = [f for f in doc["findings"] if f["code"] == "unsafe-pickle"]
    assert ".call" in f["message"], f["message"]
    r = ckpt_tui("export", "ckpts", "--out", "out", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and not (tmp_path / "out").exists()
    r = ckpt_tui("verify", str(tmp_path), "--against", "ckpts/ep0-ba2-rank0.pt", cwd=tmp_path)
    assert r.returncode != 0 and not marker.exists() and sys.executable  # nothing ran, anywhere
