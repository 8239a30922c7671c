"""A LoRA run someone shared, or a careless command on one (issue 23): what its adapter_config.json, its tensors
or the user's --out could do to an inspect, an adapter export or a merge. The real fixture (samples/hf_peft.py)
plus the smallest hand-made change."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.fixtures import fixture_path
from tests.util import ckpt_tui


def _copy(tmp_path: Path, name: str = "peft-llama") -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_path(name), d, symlinks=True)
    return d


def _config(v: Path) -> Path:
    return v / "run" / "checkpoint-2" / "adapter_config.json"


def test_escape_sequences_in_the_recorded_base_never_reach_the_terminal(tmp_path):
    v = _copy(tmp_path)
    doc = json.loads(_config(v).read_text())
    doc["base_model_name_or_path"] = "\x1b]0;pwned\x07\x1b[31mevil[/]"
    _config(v).write_text(json.dumps(doc))
    for args in (("inspect", "checkpoint-2"), ("export", "checkpoint-2", "--merge", "--out", "m")):
        r = ckpt_tui(*args, cwd=v / "run")
        assert "Traceback" not in r.stderr
        assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
        assert "\\x1b" in r.stdout + r.stderr  # shown, as an escape
    assert not (v / "run" / "m").exists()


def test_a_symlinked_adapter_config_is_not_followed_or_copied(tmp_path):
    v = _copy(tmp_path)
    secret = tmp_path / "secret.json"
    shutil.copy(_config(v), secret)
    os.remove(_config(v))
    os.symlink(secret, _config(v))
    r = ckpt_tui("export", "checkpoint-2", "--out", "a", cwd=v / "run")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "symbolic link" in r.stderr, r.stderr
    assert not (v / "run" / "a").exists()


def test_out_inside_the_checkpoint_or_the_base_is_refused_before_anything_is_written(tmp_path):
    v = _copy(tmp_path)
    run = v / "run"
    before = sorted(p.name for p in (run / "checkpoint-2").iterdir())
    for out in ("checkpoint-2/merged", "checkpoint-2", "../base-model", "../base-model/sub"):
        r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", out, cwd=run)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (out, r.stderr)
    for out in ("checkpoint-2/adapter", "checkpoint-2"):
        r = ckpt_tui("export", "checkpoint-2", "--out", out, cwd=run)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (out, r.stderr)
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "checkpoint-2", "--overwrite", cwd=run)
    assert r.returncode != 0
    assert sorted(p.name for p in (run / "checkpoint-2").iterdir()) == before
    assert sorted(p.name for p in (v / "base-model").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]


def test_lora_tensors_that_do_not_pair_are_refused_not_half_exported(tmp_path):
    v = _copy(tmp_path)
    f = v / "run" / "checkpoint-2" / "adapter_model.safetensors"
    sd = load_file(f)
    k = next(k for k in sd if k.endswith("lora_B.weight"))
    sd[k] = sd[k][:, :3].contiguous()  # lora_B of rank 3 beside lora_A of rank 4
    save_file(sd, f, metadata={"format": "pt"})
    for extra in ((), ("--merge",)):
        r = ckpt_tui("export", "checkpoint-2", *extra, "--out", "x", cwd=v / "run")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "do not make one adapter" in r.stderr, r.stderr
        assert not (v / "run" / "x").exists()


def test_a_hub_id_base_is_looked_up_in_the_local_cache_only(tmp_path):
    v = _copy(tmp_path)
    doc = json.loads(_config(v).read_text())
    doc["base_model_name_or_path"] = "some-org/some-model"
    _config(v).write_text(json.dumps(doc))
    hub = tmp_path / "hub"
    repo = hub / "models--some-org--some-model"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "blobs").mkdir()
    for p in (v / "base-model").iterdir():  # as huggingface_hub lays it out: blobs, snapshot links to them
        shutil.copy(p, repo / "blobs" / p.name)
        os.symlink(Path("../../blobs") / p.name, snap / p.name)
    shutil.rmtree(v / "base-model")
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    r = ckpt_tui("inspect", "checkpoint-2", cwd=v / "run", env=env)
    assert "found at" in r.stdout and "snapshots" in r.stdout, r.stdout
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "m", cwd=v / "run", env=env)
    assert r.returncode == 0, r.stderr
