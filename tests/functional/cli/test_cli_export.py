"""export / verify / diff / stats through the CLI: exit codes, JSON, messages."""

import json
import math
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_export_picks_model_and_prints_summary(real_ckpt, tmp_path):
    r = run("export", real_ckpt("hf-fsdp1") / "checkpoint-2", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert f"the model is `{real_ckpt('hf-fsdp1') / 'checkpoint-2' / 'pytorch_model_fsdp_0'}/`" in r.stderr
    assert "verified ✓" in r.stdout and "from_pretrained" in r.stdout
    assert (tmp_path / "out" / "model.safetensors").is_file()
    r = run("export", real_ckpt("hf-fsdp1") / "checkpoint-2", "--out", tmp_path / "out")
    assert r.returncode == 1 and "not empty" in r.stderr and "Traceback" not in r.stderr


def test_export_json_and_dry_run(real_ckpt, tmp_path):
    r = run(
        "export",
        real_ckpt("ds-zero2-bf16"),
        "--out",
        tmp_path / "o",
        "--dry-run",
        "--json",
        "--max-shard-size",
        "100KB",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["steps"][0]["target"].startswith("model-00001-of-") and not (tmp_path / "o").exists()
    assert any("--dtype bf16 halves the size" in n for n in plan["notes"])
    r = run("export", real_ckpt("ds-zero2-bf16"), "--out", tmp_path / "o", "--json", "--dtype", "bf16")
    res = json.loads(r.stdout)["result"]
    assert r.returncode == 0 and res["verified"] is True and res["files"] == ["model.safetensors"]
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "o" / "model.safetensors").values())


def test_export_bad_usage_and_missing_source(tmp_path):
    r = run("export", tmp_path / "nope", "--out", tmp_path / "o")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = run("export", tmp_path, "--out", tmp_path / "o", "--max-shard-size", "lots")
    assert r.returncode == 2 and "not a size" in r.stderr
    r = run("export", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 1 and "no model weights" in r.stderr


def test_verify_detects_a_flipped_tensor(real_ckpt, tmp_path):
    src = real_ckpt("ds-zero2-tied")
    out = tmp_path / "out"
    assert run("export", src, "--out", out, "--no-verify").returncode == 0
    r = run("verify", out, "--against", src, "--json")
    res = json.loads(r.stdout)["result"]
    assert r.returncode == 0 and res["ok"] and res["compared"] > 0 and res["reference"] == "DeepSpeed zero_to_fp32"
    sd = load_file(out / "model.safetensors")
    sd["norm.weight"][0] += 1
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    r = run("verify", out, "--against", src)
    assert r.returncode == 1 and "mismatch: norm.weight" in r.stdout


def test_verify_prints_no_third_party_progress_bars(real_ckpt, tmp_path):
    """DeepSpeed's zero_to_fp32 (the reference loader) draws tqdm bars on stderr: not in verify's output."""
    for name in ("ds-zero2-tied", "ds-zero3-bf16"):
        src, out = real_ckpt(name), tmp_path / name
        assert run("export", src, "--out", out, "--no-verify").returncode == 0
        r = run("verify", out, "--against", src)
        assert r.returncode == 0, r.stdout + r.stderr
        both = r.stdout + r.stderr
        for bar in ("Loading checkpoint shards", "Gathering sharded weights", "it/s]", "\r"):
            assert bar not in both, both


def test_diff_and_stats(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    w = torch.randn(64, 32)
    torch.save({"w": w, "only_a": torch.ones(2), "s": torch.zeros(3)}, a / "model.pt")
    w2 = w.clone()
    w2[3, 4] += 0.5
    bad = torch.ones(4)
    bad[1] = float("nan")
    bad[2] = float("inf")
    save_file({"w": w2, "only_b": bad, "s": torch.zeros(3, dtype=torch.float16)}, str(b / "model.safetensors"))
    r = run("diff", a, b, "--json")
    res = json.loads(r.stdout)["result"]
    assert r.returncode == 1
    assert res["only_a"] == ["only_a"] and res["only_b"] == ["only_b"]
    assert math.isclose(res["max_abs_diff"]["w"], 0.5, rel_tol=1e-6)
    assert res["changed"][0]["name"] == "s"
    r = run("stats", b, "--json")
    rows = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
    assert r.returncode == 1  # NaN/Inf found
    assert rows["only_b"]["nan"] == 1 and rows["only_b"]["inf"] == 1 and rows["only_b"]["max"] == 1.0
    assert math.isclose(rows["w"]["mean"], float(w2.double().mean()), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(rows["w"]["std"], float(w2.double().std()), rel_tol=1e-9)
    assert run("stats", a).returncode == 0
