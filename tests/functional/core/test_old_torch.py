"""torch DCP written by older torch (issue 25): FSDP2 (model and optimizer in one save) and FSDP1 (saved as accelerate
saves it) by torch 2.4.1 and 2.7.0 themselves, on 2 gloo ranks, committed with that torch's own dcp_to_torch_save as
oracle under tests/data/old-torch/<version>/ (ckpt_tui/samples/old_torch.py; their venvs are ~5 GB of CUDA wheels
each, more than a cold CI run should fetch for folders of a few kB). Read here by the torch of this venv."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.util import ckpt_tui, load_optimizer_export

DATA = Path(__file__).resolve().parents[2] / "data" / "old-torch"
VERSIONS = sorted(p.name for p in DATA.iterdir() if (p / "oracle").is_dir())
# (variant, what SRC is inside it, its model oracle and the prefix to take off, its optimizer oracle)
CASES = [
    ("fsdp2", "fsdp2", "fsdp2", "fsdp2"),
    ("fsdp1", "fsdp1", "fsdp1-model", "fsdp1-optimizer"),
]


def test_both_versions_are_here():
    assert VERSIONS == ["2.4.1", "2.7.0"]
    for v in VERSIONS:
        assert json.loads((DATA / v / "oracle" / "fsdp2.json").read_text())["torch"].startswith(v)


def _copy(version: str, tmp_path: Path) -> Path:
    d = tmp_path / version
    shutil.copytree(DATA / version, d)
    return d


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant,src,model_oracle,optim_oracle", CASES, ids=[c[0] for c in CASES])
def test_model_and_optimizer_export_are_that_torchs_dcp_to_torch_save(
    tmp_path, version, variant, src, model_oracle, optim_oracle
):
    d = _copy(version, tmp_path)
    doc = json.loads(ckpt_tui("inspect", src, "--json", cwd=d).stdout)
    assert not [f for f in doc["findings"] if f["severity"] != "info"], doc["findings"]
    assert doc["components"].get("model") and doc["components"].get("optimizer"), doc["components"]
    # the model: exactly the oracle's model.* tensors, bit-exact
    r = ckpt_tui("export", src, "--out", "model-out", cwd=d)
    assert r.returncode == 0, r.stderr
    got = load_file(d / "model-out" / "model.safetensors")
    ref = load_file(d / "oracle" / f"{model_oracle}.safetensors")
    want = {k.removeprefix("model."): v for k, v in ref.items() if k.startswith("model.")}
    assert sorted(got) == sorted(want) and all(
        got[k].dtype == v.dtype and torch.equal(got[k], v) for k, v in want.items()
    )
    r = ckpt_tui("verify", "model-out", "--against", src, cwd=d)
    assert r.returncode == 0 and "0 mismatched, 0 missing" in r.stdout, r.stdout + r.stderr
    # the optimizer: every state tensor bit-exact, the hyper-parameters and the step as saved
    r = ckpt_tui("export", src, "--component", "optimizer", "--out", "optim-out", cwd=d)
    assert r.returncode == 0, r.stderr
    sd = load_optimizer_export(d / "optim-out")
    ref = load_file(d / "oracle" / f"{optim_oracle}.safetensors")
    head = "optimizer.state."
    want = {k[len(head) :]: v for k, v in ref.items() if k.startswith(head) and not k.endswith(".step")}
    assert sorted(sd) == sorted(want) and all(torch.equal(sd[k], v) for k, v in want.items())
    cfg = json.loads((d / "optim-out" / "optimizer_config.json").read_text())
    values = json.loads((d / "oracle" / f"{optim_oracle}.json").read_text())["values"]
    assert cfg["step"] == 2 and cfg["param_groups"][0]["lr"] == values["optimizer.param_groups.0.lr"] == 0.01
    assert cfg["param_groups"][0]["params"] == values["optimizer.param_groups.0.params"]
