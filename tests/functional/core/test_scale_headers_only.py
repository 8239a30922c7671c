"""Headers only, at scale: a 1,024-rank, ~1 TB (sparse) HF Trainer + FSDP checkpoint is inspected
by reading its ``.metadata`` and nothing of the 1,024 shard files; and the CLI starts without
importing torch, deepspeed or textual."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RANKS = 1024


def _synthetic():
    spec = importlib.util.spec_from_file_location("ckpt_tui_bench_synthetic", REPO / "bench" / "synthetic.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scale_ckpt(tmp_path_factory) -> Path:
    # same shape as bench/out/scale (1,024 ranks, ~1 TB declared) but 12 tensors instead of 82
    return _synthetic().make_scale_layout(tmp_path_factory.mktemp("scale"), ranks=RANKS, target_bytes=1 << 40, layers=2)


# Pre-imports every ckpt_tui.core module so that rchar around inspect() counts data, not .pyc files.
_PROBE = r"""
import importlib, json, pkgutil, sys
import ckpt_tui.core
for m in pkgutil.walk_packages(ckpt_tui.core.__path__, "ckpt_tui.core."):
    importlib.import_module(m.name)
from ckpt_tui.core.report import inspect

def rchar():
    with open("/proc/self/io") as f:
        return int(next(l for l in f if l.startswith("rchar:")).split()[1])

before = rchar()
rep = inspect(sys.argv[1])
after = rchar()
inv = rep.inventory
node = inv.node(inv.components["model"])
print(json.dumps({
    "before": before, "after": after,
    "layout": inv.layout, "components": inv.components,
    "world_size": node.facts.get("world_size"),
    "findings": [[f.code, f.severity] for f in rep.findings],
    "torch": "torch" in sys.modules, "deepspeed": "deepspeed" in sys.modules,
}))
"""


def test_layout_is_what_it_claims(scale_ckpt):
    d = scale_ckpt / "pytorch_model_fsdp_0"
    shards = sorted(d.glob("*.distcp"))
    assert len(shards) == RANKS
    declared = sum(p.stat().st_size for p in shards)
    assert 0.9e12 < declared < 1.3e12
    assert json.loads((scale_ckpt / "trainer_state.json").read_text())["global_step"] == 1000


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/<pid>/io (Linux)")
def test_inspect_reads_headers_only(scale_ckpt):
    p = subprocess.run([sys.executable, "-c", _PROBE, str(scale_ckpt)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    meta = (scale_ckpt / "pytorch_model_fsdp_0" / ".metadata").stat().st_size
    n_files = sum(1 for q in scale_ckpt.rglob("*") if q.is_file())
    read = r["after"] - r["before"]
    budget = meta + 64 * 1024 + 1024 * n_files
    assert read <= budget, f"inspect read {read:,} bytes; .metadata is {meta:,}, {n_files} files, budget {budget:,}"
    assert read >= meta  # it did read the metadata (sanity check of the measurement)
    assert r["layout"] == "hf-trainer-fsdp"
    assert r["components"]["model"] == "pytorch_model_fsdp_0"
    assert r["world_size"] == RANKS
    assert [f for f in r["findings"] if f[1] == "error"] == []
    assert not r["torch"] and not r["deepspeed"]


_MODULES = r"""
import json, os, sys
if sys.argv[1] == "import":
    import ckpt_tui.cli
else:
    from ckpt_tui.cli import main
    sys.stdout = open(os.devnull, "w")
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code in (0, None), e.code
os.write(2, ("\n" + json.dumps(sorted(m for m in ("torch", "deepspeed", "textual", "rich") if m in sys.modules))).encode())
"""


@pytest.mark.parametrize(
    "what, banned",
    [
        ("import", {"torch", "deepspeed", "textual", "rich"}),
        ("--help", {"torch", "deepspeed", "textual"}),
    ],
)
def test_cli_startup_is_light(what, banned):
    p = subprocess.run([sys.executable, "-c", _MODULES, what], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-4000:]
    loaded = set(json.loads(p.stderr.strip().splitlines()[-1]))
    assert not (loaded & banned), f"{what}: imported {sorted(loaded & banned)}"


def test_console_script_help_runs():
    exe = Path(sys.executable).parent / "ckpt-tui"
    cmd = [str(exe), "--help"] if exe.exists() else [sys.executable, "-m", "ckpt_tui", "--help"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "inspect" in p.stdout
