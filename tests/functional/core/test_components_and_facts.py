"""Which DCP is the model where a folder holds several, the commands the dcp-components finding
suggests (run for real, as printed), `export --component`, and facts taken from the files: optimizer
DCP totals, framework names from evidence, per-tensor dtypes as export writes them (a frozen bf16
parameter of a DeepSpeed run is upcast, and says so). All on real framework output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export, plan_export
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.formats.dcp.format import merges_with_accelerate
from ckpt_tui.core.report import inspect

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def shell(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a command line exactly as a user pastes it, from ``cwd``, with this checkout's ckpt-tui."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def ckpt_tui(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return shell(" ".join(["ckpt-tui", *args]), cwd)


def finding(cwd: Path, given: str, code: str) -> dict:
    r = ckpt_tui("inspect", "--json", given, cwd=cwd)
    assert r.returncode == 0, r.stderr
    hits = [f for f in json.loads(r.stdout)["findings"] if f["code"] == code]
    assert len(hits) == 1, hits
    return hits[0]


def same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


# ------------------------------------------------------------------ the model component


def test_model_only_dcp_is_the_model_not_the_combined_one(real_ckpt):
    """`combined/` (model and optimizer in one dcp.save) sorts first; the model-only `model/` must win."""
    inv = inspect(real_ckpt("dcp-mixed")).inventory
    roles = {p: inv.node(p).role for p in ("model", "optimizer", "combined")}
    assert roles == {"model": "model", "optimizer": "optimizer", "combined": "model+optimizer"}
    assert inv.components == {"model": "model", "optimizer": "optimizer"}
    assert "model in `model/`" in inv.summary and "optimizer in `optimizer/`" in inv.summary


def test_accelerate_merge_weights_works_only_where_suggested(real_ckpt, tmp_path):
    """The peer tool, run for real on each layout: it merges the model-only DCP and dies on the others,
    which is exactly where merges_with_accelerate says it may be suggested."""
    src = real_ckpt("dcp-mixed")
    inv = inspect(src).inventory
    for sub in ("model", "optimizer", "combined"):
        r = shell(f"accelerate merge-weights {src / sub} {tmp_path / sub}", tmp_path)
        ok = merges_with_accelerate(inv.node(sub))
        assert (r.returncode == 0) == ok, (sub, r.stderr[-2000:])
        if not ok:
            assert "is invalid, expected torch.Tensor" in r.stderr
    assert (
        "Key `model` is invalid"
        in shell(f"accelerate merge-weights {src / 'combined'} {tmp_path / 'x'}", tmp_path).stderr
    )


def test_suggested_commands_run_from_the_users_folder(real_ckpt_copy, tmp_path):
    """inspect a relative path; paste the accelerate command and the ckpt-tui command it prints (DIR
    replaced), from that same folder: both exit 0 and write the same weights."""
    real_ckpt_copy("dcp-mixed")
    f = finding(tmp_path, "dcp-mixed", "dcp-components")
    msg = f["message"]
    assert "`dcp-mixed/model/`" in msg and "`dcp-mixed/optimizer/`" in msg and "`dcp-mixed/combined/`" in msg
    peer = re.findall(r"`(accelerate merge-weights [^`]+)`", msg)
    assert peer == ["accelerate merge-weights dcp-mixed/model dcp-mixed/model_merged"]
    assert "combined" not in peer[0]
    assert f["command"] == "ckpt-tui export dcp-mixed --out DIR" and f"`{f['command']}`" in msg
    r = shell(peer[0], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = shell(f["command"].replace("DIR", "exported"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert "the model is `dcp-mixed/model/`" in r.stderr
    same(
        load_file(tmp_path / "exported" / "model.safetensors"),
        load_file(tmp_path / "dcp-mixed" / "model_merged" / "model.safetensors"),
    )


def test_only_a_combined_dcp_no_peer_command_and_the_export_runs(real_ckpt, tmp_path):
    """A folder whose only model-holding DCP also holds the optimizer: no accelerate command (it would die);
    the suggested ckpt-tui command exports its model part."""
    run = tmp_path / "run folder"  # a space: the printed paths must be quoted to paste
    run.mkdir()
    shutil.copytree(real_ckpt("dcp-mixed") / "combined", run / "combined")
    shutil.copytree(real_ckpt("dcp-mixed") / "optimizer", run / "optimizer")
    f = finding(tmp_path, "'run folder'", "dcp-components")
    assert "accelerate merge-weights '" not in f["message"]
    assert "cannot merge `'run folder/combined'/`" in f["message"]  # quoted to paste, then the folder's slash
    assert f["command"] == "ckpt-tui export 'run folder' --out DIR"
    r = shell(f["command"].replace("DIR", "out"), tmp_path)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    export(real_ckpt("dcp-mixed") / "model", ref)
    same(load_file(tmp_path / "out" / "model.safetensors"), load_file(ref / "model.safetensors"))


def test_combined_dcp_named_as_src_exports_its_model_part(real_ckpt, tmp_path):
    src = real_ckpt("dcp-mixed")
    export(src / "combined", tmp_path / "combined", component="model")
    export(src / "model", tmp_path / "model")
    same(load_file(tmp_path / "combined" / "model.safetensors"), load_file(tmp_path / "model" / "model.safetensors"))
    assert not any(
        "optim" in k or k.startswith("state.") for k in load_file(tmp_path / "combined" / "model.safetensors")
    )


@pytest.mark.parametrize(
    "given,said", [("dcp-mixed", "the optimizer state is `dcp-mixed/optimizer/`"), ("dcp-mixed/combined", None)]
)
def test_component_optimizer_exports_the_optimizer_component(real_ckpt_copy, tmp_path, given, said):
    """A run folder holding a model and an optimizer DCP: `--component optimizer` says which it took; a
    combined model+optimizer DCP exports its optimizer half. (Refusals of optimizers not exportable yet:
    test_optimizer_export.py.)"""
    real_ckpt_copy("dcp-mixed")
    r = ckpt_tui("export", given, "--out", "out", "--component", "optimizer", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    if said:
        assert said in r.stderr
    assert (tmp_path / "out" / "optimizer.safetensors").is_file() and (
        tmp_path / "out" / "optimizer_config.json"
    ).is_file()
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_component_optimizer_without_one(real_ckpt, tmp_path):
    with pytest.raises(ExportError, match="no optimizer component"):
        plan_export(real_ckpt("dcp-mixed") / "model", tmp_path / "out", component="optimizer")


# ------------------------------------------------------------------ facts from the files


@pytest.mark.parametrize(
    "variant,sub",
    [("dcp-mixed", "optimizer"), ("hf-fsdp1", "checkpoint-2/optimizer_0"), ("hf-fsdp2", "checkpoint-2/optimizer_0")],
)
def test_optimizer_dcp_reports_its_dtypes_bytes_and_count(real_ckpt, variant, sub):
    path = real_ckpt(variant) / sub
    r = ckpt_tui("inspect", "--json", str(path), cwd=path.parent)
    node = json.loads(r.stdout)["nodes"][0]
    assert node["role"] == "optimizer"
    facts = node["facts"]
    assert {"param_count", "tensor_bytes", "dtypes", "tensor_count", "containers"} <= set(facts)  # keys kept
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    tensors = {k: m for k, m in meta.items() if hasattr(m, "chunks")}
    assert facts["tensor_count"] == len(tensors) > 0
    assert (
        facts["dtypes"]
        == ["float32"]
        == sorted({str(m.properties.dtype).removeprefix("torch.") for m in tensors.values()})
    )
    assert facts["tensor_bytes"] == sum(m.size.numel() * 4 for m in tensors.values()) > 0
    assert facts["param_count"] == 0  # optimizer state, not model parameters


def test_framework_named_from_evidence_only(real_ckpt, tmp_path):
    for v in ("fsdp1-dcp", "fsdp2-dcp", "dcp-mixed"):
        fw = inspect(real_ckpt(v)).inventory.framework
        assert fw == "torch.distributed.checkpoint"  # nothing in these files says FSDP1, FSDP2 or Accelerate
    for v in ("hf-fsdp1", "hf-fsdp2"):
        assert inspect(real_ckpt(v) / "checkpoint-2").inventory.framework == "HF Trainer + FSDP (sharded)"
    # the Trainer's DCP folders without any Trainer or Accelerate file: their names are no evidence
    ck = shutil.copytree(real_ckpt("hf-fsdp2") / "checkpoint-2", tmp_path / "ck")
    for name in ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt"):
        (ck / name).unlink()
    assert inspect(ck).inventory.framework == "torch.distributed.checkpoint"
    assert inspect(ck / "pytorch_model_fsdp_0").inventory.framework == "torch.distributed.checkpoint"
    # a file only Accelerate's save_state writes is
    shutil.copy(real_ckpt("accelerate-save-state") / "random_states_0.pkl", ck / "random_states_0.pkl")
    assert inspect(ck).inventory.framework == "Accelerate + FSDP (sharded)"


FROZEN = [
    ("ds-zero1-frozen", ""),
    ("ds-zero2-frozen", ""),
    ("ds-zero3-frozen", ""),
    ("hf-ds-zero2-tied-frozen", "checkpoint-2"),
]


@pytest.mark.parametrize("variant,sub", FROZEN)
def test_tensor_dtypes_are_what_export_writes_and_upcasts_are_marked(real_ckpt, tmp_path, variant, sub):
    src = real_ckpt(variant) / sub
    r = ckpt_tui("tensors", "--json", str(src), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
    res = export(src, tmp_path / "out", dtype="keep")
    written = load_file(tmp_path / "out" / "model.safetensors")
    dropped_tied = set(listed) - set(written)
    assert set(written) <= set(listed)
    assert all(res.notes) and (not dropped_tied or variant.endswith("tied-frozen"))
    for name, t in written.items():
        assert listed[name]["dtype"] == str(t.dtype).removeprefix("torch."), name
        assert listed[name]["bytes"] == t.numel() * t.element_size()
    upcast = {n for n, t in listed.items() if t["upcast_from"]}
    frozen = {n for n in listed if n.endswith("embed_tokens.weight")}  # the one frozen parameter of these runs
    assert upcast == frozen and all(listed[n]["upcast_from"] == "bfloat16" for n in upcast)
    for n in upcast:  # bf16 values widened: the round trip through bf16 is lossless
        assert written[n].dtype == torch.float32 and torch.equal(written[n].to(torch.bfloat16).float(), written[n])
    trainable = next(n for n in written if n not in frozen and written[n].ndim == 2)  # fp32 masters: not bf16-exact
    assert not torch.equal(written[trainable].to(torch.bfloat16).float(), written[trainable])

    table = ckpt_tui("tensors", str(src), cwd=tmp_path).stdout
    line = next(ln for ln in table.splitlines() if ln.split() and ln.split()[0] in frozen)
    assert "float32 (upcast from bf16)" in line
    assert "1 frozen tensor(s) have no fp32 master" in table
    plan = ckpt_tui("export", str(src), "--out", "x", "--dry-run", cwd=tmp_path).stdout
    assert (
        f"fp32 master weights, except 1 frozen parameter(s) that have none ({next(iter(frozen))}): stored in "
        "bf16, written upcast to fp32"
    ) in " ".join(plan.split())


def test_no_upcast_mark_without_frozen_parameters(real_ckpt, tmp_path):
    r = ckpt_tui("tensors", "--json", str(real_ckpt("ds-zero2-bf16")), cwd=tmp_path)
    assert all(t["upcast_from"] is None for t in json.loads(r.stdout)["tensors"])
    plan = ckpt_tui("export", str(real_ckpt("ds-zero2-bf16")), "--out", "x", "--dry-run", cwd=tmp_path).stdout
    assert "these are its fp32 master weights — --dtype bf16 halves the size" in " ".join(plan.split())
