"""verl checkpoints (FSDP backend), written by verl's own FSDPCheckpointManager in its cached venv (samples/verl_fsdp.py):
FSDP2 rank files of DTensors, FSDP1 rank files of ShardedTensors. Read without a process group and without
--trust-pickles; recognised, diagnosed, exported (model and optimizer) bit-exact against verl's own model merger
(`python -m verl.model_merger merge --backend fsdp`, bf16) and the full state torch itself gathered (fp32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.formats.torch_save import torchfile
from ckpt_tui.core.formats.unpickle import DTensorRef, ShardedTensorRef, TensorRef
from ckpt_tui.core.report import inspect
from tests.fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ACTOR = "checkpoints/global_step_1/actor"
VARIANTS = ("verl-fsdp2", "verl-fsdp1")


def ckpt_tui(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["ckpt-tui", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def oracle(variant: str, name: str):
    return torch.load(fixture_path(variant) / "oracle" / name, weights_only=True)


# -- the restricted unpickler on the real rank files -------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_rank_files_read_as_inert_shards_without_a_process_group(variant):
    full = oracle(variant, "model_full.pt")
    ref = DTensorRef if variant == "verl-fsdp2" else ShardedTensorRef
    for rank in (0, 1):
        for kind in ("model", "optim", "extra_state"):
            tf = torchfile.read(fixture_path(variant) / ACTOR / f"{kind}_world_size_2_rank_{rank}.pt")
            assert tf.unsafe == set(), (kind, tf.unsafe)  # DTensorSpec, DeviceMesh, Shard, ShardMetadata...: data
        sd = torchfile.read(fixture_path(variant) / ACTOR / f"model_world_size_2_rank_{rank}.pt").obj
        assert list(sd) == list(full)
        for name, v in sd.items():
            assert isinstance(v, ref) and v.shape == tuple(full[name].shape) and v.dtype == "float32"
            if ref is DTensorRef:
                assert v.placements == (("shard", 0),) and v.mesh_shape == (2,) and v.mesh_dim_names == ("fsdp",)
                assert v.coordinate == (rank,) and isinstance(v.local, TensorRef)
                assert v.local.shape[0] == torch.chunk(full[name], 2)[rank].shape[0]
            else:
                assert [s.rank for s in v.shards] == [0, 1]
                (mine,) = v.local_shards
                assert mine.rank == rank and mine.offsets == v.shards[rank].offsets
                assert isinstance(mine.tensor, TensorRef) and mine.tensor.shape == mine.sizes


# -- inspect ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant,head", [("verl-fsdp2", "FSDP2 (DTensor) rank files"), ("verl-fsdp1", "FSDP1 (ShardedTensor) rank files")]
)
def test_inspect_names_the_layout_framework_and_parts(variant, head):
    rep = inspect(fixture_path(variant) / "checkpoints")
    inv = rep.inventory
    assert inv.layout == "run-folder" and inv.checkpoints[0]["path"] == "global_step_1"
    assert f"verl (FSDP), {head}, 2 ranks, step 1" in inv.summary
    rep = inspect(fixture_path(variant) / ACTOR)
    inv = rep.inventory
    assert inv.layout == "verl-fsdp" and inv.framework == "verl (FSDP)"
    assert inv.components == {"model": ".", "optimizer": "."}
    assert inv.summary.startswith(f"verl (FSDP), {head}, 2 ranks: model and optimizer in this folder")
    root = inv.root
    assert root.format == "verl-fsdp" and root.role == "model+optimizer"
    f = root.facts
    assert f["world_size"] == 2 and f["config_world_size"] == 2 and f["ranks_present"] == [0, 1]
    assert f["fsdp_version"] == (2 if variant == "verl-fsdp2" else 1) and f["hf_config"] and f["tokenizer"]
    assert f["param_count"] == sum(t.numel() for t in oracle(variant, "model_full.pt").values())
    roles = {c.name: c.role for c in root.children}
    assert roles["model_world_size_2_rank_1.pt"] == "model-shard"
    assert roles["optim_world_size_2_rank_0.pt"] == "optimizer-shard"
    assert roles["extra_state_world_size_2_rank_0.pt"] == "extra-state"
    assert rep.findings == []  # no unsafe-pickle: nothing needs --trust-pickles


def test_a_missing_rank_file_is_shard_missing_and_blocks_export(real_ckpt_copy, tmp_path):
    copy = real_ckpt_copy("verl-fsdp2")
    (copy / ACTOR / "model_world_size_2_rank_1.pt").unlink()
    rep = inspect(copy / ACTOR)
    (f,) = [f for f in rep.findings if f.code == "shard-missing"]
    assert f.severity == "error" and "model_world_size_2_rank_1.pt" in f.message
    with pytest.raises(ExportError):
        export(copy / ACTOR, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fsdp_config_of_another_world_size_is_a_mismatch(real_ckpt_copy):
    copy = real_ckpt_copy("verl-fsdp1")
    cfg = copy / ACTOR / "fsdp_config.json"
    cfg.write_text(json.dumps(json.loads(cfg.read_text()) | {"world_size": 4}))
    rep = inspect(copy / ACTOR)
    (f,) = [f for f in rep.findings if f.code == "world-size-mismatch"]
    assert f.severity == "error" and "world_size 4" in f.message and "world size 2" in f.message


# -- export: model --------------------------------------------------------------------------------------------------


def test_model_export_matches_verl_model_merger_and_torch(tmp_path):
    """Without --trust-pickles: fp32 equal to the full state torch gathered from the live model; cast to bf16 (what
    verl's merger writes) equal to the merger's model.safetensors; the config and tokenizer come along."""
    src = fixture_path("verl-fsdp2")
    r = ckpt_tui("export", str(src / "checkpoints"), "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = load_file(tmp_path / "out" / "model.safetensors")
    full = oracle("verl-fsdp2", "model_full.pt")
    assert sorted(got) == sorted(full) and all(
        got[k].dtype == torch.float32 and torch.equal(got[k], full[k]) for k in full
    )
    merged = load_file(src / "oracle" / "merged" / "model.safetensors")
    assert sorted(merged) == sorted(got)
    for k, v in merged.items():
        assert v.dtype == torch.bfloat16 and torch.equal(got[k].to(torch.bfloat16), v), k
    r = ckpt_tui("export", str(src / ACTOR), "--out", "bf16", "--dtype", "bf16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got16 = load_file(tmp_path / "bf16" / "model.safetensors")
    assert sorted(got16) == sorted(merged) and all(torch.equal(got16[k], merged[k]) for k in merged)
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path / "out"))


def test_fsdp1_model_export_matches_torch_loading_the_sharded_tensors(tmp_path):
    """FSDP1's ShardedTensors: verl's merger cannot read them (torch refuses outside a process group), the oracle is
    torch loading them inside the 2-rank group that wrote them (samples/verl_fsdp.py)."""
    out = tmp_path / "out"
    export(fixture_path("verl-fsdp1") / ACTOR, out)
    got = load_file(out / "model.safetensors")
    full = oracle("verl-fsdp1", "model_full.pt")
    assert sorted(got) == sorted(full)
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], full[k]) for k in full)


def test_the_printed_load_code_runs_as_printed(tmp_path):
    from tests.snippets import snippet_after

    r = ckpt_tui("export", str(fixture_path("verl-fsdp1") / "checkpoints"), "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    code = snippet_after(r.stdout)
    assert "AutoModelForCausalLM.from_pretrained" in code
    check = code + "\nprint(type(model).__name__, sum(p.numel() for p in model.parameters()))\n"
    p = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert p.returncode == 0, p.stderr
    n = sum(t.numel() for t in oracle("verl-fsdp1", "model_full.pt").values())
    assert p.stdout.strip().splitlines()[-1] == f"LlamaForCausalLM {n}"


# -- export: optimizer ----------------------------------------------------------------------------------------------


def _optim_export(variant: str, tmp_path: Path) -> tuple[dict, dict]:
    r = ckpt_tui("export", str(fixture_path(variant) / ACTOR), "--out", "out", "--component", "optimizer", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["optimizer.safetensors", "optimizer_config.json"]
    return load_file(tmp_path / "out" / "optimizer.safetensors"), json.loads(
        (tmp_path / "out" / "optimizer_config.json").read_text()
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_optimizer_export_matches_torch_full_optimizer_state(variant, tmp_path):
    got, cfg = _optim_export(variant, tmp_path)
    ref = oracle(variant, "optim_full.pt")  # get_optimizer_state_dict(full_state_dict=True): FQN-keyed
    # the oracle is gathered without cpu_offload: with it, FSDP1's gather on CPU aliases exp_avg to exp_avg_sq
    assert not any(torch.equal(s["exp_avg"], s["exp_avg_sq"]) for s in ref["state"].values())
    want = {f"{n}.{k}": s[k] for n, s in ref["state"].items() for k in ("exp_avg", "exp_avg_sq")}
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    (g,) = cfg["param_groups"]
    (rg,) = ref["param_groups"]
    assert g["params"] == rg["params"] and g["lr"] == rg["lr"] and g["weight_decay"] == rg["weight_decay"]
    assert cfg["step"] == 1 and g["step"] == 1 and cfg["source"] == "verl" and cfg["dp_world_size"] == 2
    assert cfg["fsdp"] == ("DTensor" if variant == "verl-fsdp2" else "ShardedTensor")


def test_fsdp1_optimizer_export_matches_the_flat_pieces_assembled_by_torch(tmp_path):
    """FSDP1 (use_orig_params) optimizer files hold each rank's flat 1-D piece of the parameters it owns: torch.cat
    of the pieces in rank order, reshaped to the parameter, is the full state."""
    got, cfg = _optim_export("verl-fsdp1", tmp_path)
    d = fixture_path("verl-fsdp1") / ACTOR
    ranks = [torch.load(d / f"optim_world_size_2_rank_{r}.pt", weights_only=True) for r in (0, 1)]
    full = oracle("verl-fsdp1", "model_full.pt")
    names = list(full)
    assert ranks[0]["param_groups"][0]["params"] == list(range(len(names)))
    want = {}
    for i, n in enumerate(names):
        for k in ("exp_avg", "exp_avg_sq"):
            want[f"{n}.{k}"] = torch.cat([o["state"][i][k] for o in ranks if i in o["state"]]).reshape(full[n].shape)
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    assert cfg["step"] == 1 and cfg["fsdp"] == "ShardedTensor" and cfg["param_groups"][0]["params"] == names


# -- the TUI ------------------------------------------------------------------------------------------------------


async def test_tui_shows_the_verl_layout_and_its_parts():
    from ckpt_tui.ui.app import make_app
    from tests.functional.ui.test_app import wait_for

    app = make_app(fixture_path("verl-fsdp2") / ACTOR)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        summary = str(app.query_one("#summary").render())
        assert "verl (FSDP)" in summary and "FSDP2 (DTensor) rank files" in summary and "2 ranks" in summary
        labels = {str(n.label).split()[0]: str(n.label) for n in app.query_one("#tree").root.children}
        # each rank file says what it holds
        assert labels["model_world_size_2_rank_0.pt"].split()[1] == "model"
        assert labels["optim_world_size_2_rank_1.pt"].split()[1] == "optim"
        assert labels["extra_state_world_size_2_rank_0.pt"].split()[1] == "sched+rng"


def test_one_rank_file_alone_is_refused_not_exported_as_a_shard(tmp_path):
    r = ckpt_tui(
        "export", str(fixture_path("verl-fsdp2") / ACTOR / "model_world_size_2_rank_0.pt"), "--out", "out", cwd=tmp_path
    )
    assert r.returncode != 0 and not (tmp_path / "out").exists()  # a rank's shards are not the model


def test_verify_against_verl_merger_reading_and_fsdp1_says_why_not(tmp_path):
    """`verify` reads FSDP2 rank files as verl's merger does (torch.load + torch.cat of the DTensors' local tensors);
    FSDP1's ShardedTensors have no reference loader outside a process group, and it says so."""
    for variant, ok in (("verl-fsdp2", True), ("verl-fsdp1", False)):
        out = tmp_path / variant
        export(fixture_path(variant) / ACTOR, out)
        r = ckpt_tui("verify", str(out), "--against", str(fixture_path(variant) / ACTOR), cwd=tmp_path)
        if ok:
            assert r.returncode == 0 and "21 tensors compared with verl.model_merger: 0 mismatched" in r.stdout, r
            assert "DeviceMesh" not in r.stderr
        else:
            assert r.returncode == 1 and "torch loads ShardedTensors only inside a process group" in r.stderr, r


def test_rank_files_of_another_world_size_are_a_mismatch_and_block_export(real_ckpt_copy, tmp_path):
    """A stale 1-rank save's model file left beside the 2-rank one (the real file under the name verl gives it)."""
    copy = real_ckpt_copy("verl-fsdp2")
    a = copy / ACTOR
    (a / "model_world_size_1_rank_0.pt").write_bytes((a / "model_world_size_2_rank_0.pt").read_bytes())
    rep = inspect(a)
    (f,) = [f for f in rep.findings if f.code == "world-size-mismatch"]
    assert f.severity == "error" and "world sizes 1, 2" in f.message
    with pytest.raises(ExportError):
        export(a, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", VARIANTS)
def test_optimizer_export_verifies_against_torch_loading_every_rank(variant, tmp_path):
    """`verify` of an optimizer export: torch.load of every rank's optim file (DTensors joined along their Shard dim,
    FSDP1's flat pieces in rank order), named by the export's optimizer_config.json; the wizard offers it."""
    from ckpt_tui.core.export.api import optimizer_exportable

    assert optimizer_exportable(inspect(fixture_path(variant) / "checkpoints")) == "global_step_1/actor"
    _optim_export(variant, tmp_path)
    r = ckpt_tui("verify", "out", "--against", str(fixture_path(variant) / "checkpoints"), cwd=tmp_path)
    assert r.returncode == 0 and "42 tensors compared with torch.load of every rank's optim file" in r.stdout, r
    assert "0 mismatched, 0 missing" in r.stdout and "DeviceMesh" not in r.stderr
