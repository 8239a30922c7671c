"""`ckpt-tui convert --to torch-dcp`: a DeepSpeed ZeRO-2/3 run resumed under torch FSDP2 at 1 and 3 ranks
reaches DeepSpeed's own next step (the load code run is exactly the code the CLI printed); the output is
get_state_dict's form, inspected as a combined model+optimizer DCP, written in bounded files; bad input
gets a message and an exit code, never a traceback; cancel leaves nothing."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.convert import torch_dcp
from ckpt_tui.core.convert.torch_dcp import TMP_PREFIX, TorchDcpError, convert_to_torch_dcp, torch_dcp_plan
from ckpt_tui.core.export.sources import to_torch
from ckpt_tui.core.formats.deepspeed.zero import deepspeed_source
from ckpt_tui.core.progress import Cancelled
from tests.util import torchrun

ROOT = Path(__file__).resolve().parents[3]

# the FSDP2 side of the proof: TinyLM under fully_shard, the printed code, one step on this rank's share
RESUME = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from ckpt_tui.samples._common import TinyLM, lm_loss

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(99 + rank)  # any weights: the checkpoint must overwrite every one
model = TinyLM()
mesh = init_device_mesh("cpu", (world,))
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
scope = {"model": model}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), scope)   # the code ckpt-tui printed
optimizer, step = scope["optimizer"], scope["step"]
ref = torch.load(sys.argv[2], weights_only=True)
n = len(ref["batch"]) // world
ids = ref["batch"][rank * n:(rank + 1) * n]
lm_loss(model(ids), ids).backward()
optimizer.step()
full = {k: p.full_tensor().detach().clone() for k, p in model.named_parameters()}
if rank == 0:
    torch.save(full, sys.argv[3])
    print("RESULT " + json.dumps({"step": step, "world": world}), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # past torch's C++ teardown, which can abort a gloo rank at exit (as the fixture generators do)
"""


# frozen and tied runs (bf16, Adam with torch_adam): load under FSDP2 at 2 ranks, write what was loaded
LOAD = r"""
import os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from ckpt_tui.samples._common import TinyLM

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(99)
model = TinyLM(tied=sys.argv[2] == "tied")
if sys.argv[2] == "frozen":
    model.embed_tokens.weight.requires_grad_(False)
mesh = init_device_mesh("cpu", (world,))
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
scope = {"model": model}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), scope)
optimizer = scope["optimizer"]
full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
params = {k: full(p).detach().clone() for k, p in model.named_parameters()}
state = {k: {s: full(v).clone() for s, v in optimizer.state.get(p, {}).items()} for k, p in model.named_parameters()}
if rank == 0:
    torch.save({"params": params, "buffers": dict(model.named_buffers()), "state": state, "step": scope["step"]},
               sys.argv[3])
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # past torch's C++ teardown, which can abort a gloo rank at exit (as the fixture generators do)
"""


def cli(*args, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def printed_code(stdout: str) -> str:
    """The load code as printed: from its first import to the `step = ` line."""
    lines = stdout.splitlines()
    start = lines.index("import torch")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("step = "))
    return "\n".join(lines[start : end + 1]) + "\n"


@pytest.mark.parametrize("fixture", ["ds-resume-zero2", "ds-resume-zero3"])
def test_deepspeed_run_resumes_under_fsdp2_at_1_and_3_ranks(fixture, real_ckpt, tmp_path):
    run = real_ckpt(fixture)
    ck = tmp_path / "checkpoint"  # the user's folder; SRC and --out as they type them, relative
    os.symlink(run / "checkpoint", ck)
    r = cli("convert", "checkpoint", "--to", "torch-dcp", "--out", "resume-fsdp2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    code = printed_code(r.stdout)
    assert "checkpoint_id='resume-fsdp2'" in code
    assert code in (ROOT / "docs" / "convert.md").read_text()  # the convert guide's worked example is this very code
    (tmp_path / "load.py").write_text(code)

    ref = torch.load(run / "reference.pt", weights_only=True)
    masters = {t.name: to_torch(t) for t in deepspeed_source(run / "checkpoint" / "global_step2").tensors}
    # not vacuous: the reference step moves every parameter away from the saved masters by far more than atol
    assert min((ref["params"][k] - masters[k]).abs().max().item() for k in ref["params"]) > 1e-4
    (tmp_path / "resume.py").write_text(RESUME)
    for world in (1, 3):
        (res,) = torchrun(
            tmp_path / "resume.py", "load.py", run / "reference.pt", f"got{world}.pt", nproc=world, cwd=tmp_path
        )
        assert res == {"step": ref["step"] - 1, "world": world}
        got = torch.load(tmp_path / f"got{world}.pt", weights_only=True)
        assert sorted(got) == sorted(ref["params"])
        for k in ref["params"]:
            torch.testing.assert_close(got[k], ref["params"][k], atol=1e-6, rtol=0, msg=f"{k} at world {world}")


@pytest.mark.parametrize("fixture,kind", [("ds-zero3-frozen", "frozen"), ("ds-zero2-tied", "tied")])
def test_frozen_and_tied_bf16_runs_load_under_fsdp2_bit_exact(fixture, kind, real_ckpt, tmp_path):
    """A bf16 run's fp32 masters become the parameters; a frozen parameter has its weight and no state;
    tied weights load once; each exp_avg/exp_avg_sq and step is the source's, bit-exact, after resharding."""
    from ckpt_tui.core.formats.deepspeed.optim import deepspeed_optimizer_source

    tag = real_ckpt(fixture) / "global_step2"
    r = cli("convert", real_ckpt(fixture), "--to", "torch-dcp", "--out", tmp_path / "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fp32 masters are carried" in r.stdout
    (tmp_path / "load.py").write_text(printed_code(r.stdout))
    (tmp_path / "load_fsdp2.py").write_text(LOAD)
    torchrun(tmp_path / "load_fsdp2.py", "load.py", kind, "got.pt", nproc=2, cwd=tmp_path)
    got = torch.load(tmp_path / "got.pt", weights_only=True)
    src = {t.name: to_torch(t) for t in deepspeed_source(tag).tensors}
    opt = {t.name: to_torch(t) for t in deepspeed_optimizer_source(tag)[0].tensors}
    for k, v in got["params"].items():
        assert v.dtype == torch.float32 and torch.equal(v, src[k]), k
        st = got["state"][k]
        if kind == "frozen" and k == "embed_tokens.weight":
            assert st == {}
            continue
        assert torch.equal(st["exp_avg"], opt[f"{k}.exp_avg"]) and torch.equal(st["exp_avg_sq"], opt[f"{k}.exp_avg_sq"])
        assert float(st["step"]) == 2.0
    assert torch.equal(got["buffers"]["position_scale"], src["position_scale"])
    assert ("lm_head.weight" in got["params"]) == (kind != "tied") and got["step"] == 2


def test_output_is_get_state_dicts_form_and_inspects_as_combined_dcp(real_ckpt, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from ckpt_tui.core.report import inspect

    plan = torch_dcp_plan(real_ckpt("ds-resume-zero2") / "checkpoint", tmp_path / "out")
    res = convert_to_torch_dcp(plan)
    md = FileSystemReader(str(res.out)).read_metadata().state_dict_metadata
    names = [t.name for t in plan.model]
    assert {k for k in md if k.startswith("model.")} == {f"model.{n}" for n in names}
    trainable = plan.param_groups[0]["params"]
    assert {k for k in md if k.startswith("optimizer.state.")} == {
        f"optimizer.state.{n}.{s}" for n in trainable for s in ("step", "exp_avg", "exp_avg_sq")
    }
    # torch AdamW's step: a float32 scalar tensor per parameter, the run's step
    st = {"optimizer": {"state": {n: {"step": torch.tensor(0.0)} for n in trainable}}, "step": -1}
    dcp.load(st, checkpoint_id=res.out)
    assert {float(v["step"]) for v in st["optimizer"]["state"].values()} == {2.0} and st["step"] == 2
    assert all(v["step"].dtype == torch.float32 and v["step"].dim() == 0 for v in st["optimizer"]["state"].values())
    note = json.loads((res.out / "conversion.json").read_text())
    assert note["step"] == 2 and note["optimizer"]["class"] == "torch.optim.AdamW" and note["not_carried"]

    rep = inspect(res.out)
    node = rep.inventory.root
    assert (rep.inventory.layout, node.format, node.role) == ("dcp", "dcp", "model+optimizer")
    assert rep.inventory.components == {"model": ".", "optimizer": "."}
    assert rep.findings == []  # nothing to suggest, so no peer command that could fail on it
    r = cli("inspect", "out", cwd=tmp_path)
    assert r.returncode == 0 and "out/  model+optim  dcp" in r.stdout and "(1 rank, " in r.stdout, r.stdout


def test_bounded_files_load_the_same(real_ckpt, tmp_path, monkeypatch):
    """With FILE_BYTES below every file's worth of tensors the writer splits into many .distcp files (the
    memory bound); the result reads back bit-exact (the converter's own dcp.load verification) and loads."""
    monkeypatch.setattr(torch_dcp.run, "FILE_BYTES", 64 << 10)
    plan = torch_dcp_plan(real_ckpt("ds-resume-zero3") / "checkpoint", tmp_path / "out")
    res = convert_to_torch_dcp(plan)
    assert len(list(res.out.glob("*.distcp"))) >= 5
    import torch.distributed.checkpoint as dcp

    t = plan.model[0]
    want = {"model": {t.name: torch.empty(t.shape)}}
    dcp.load(want, checkpoint_id=res.out)
    assert torch.equal(want["model"][t.name], to_torch(t))


def test_hf_trainer_bf16_source_carries_masters_and_rng(real_ckpt, tmp_path):
    plan = torch_dcp_plan(real_ckpt("hf-ds-zero2") / "checkpoint-2", tmp_path / "out")
    assert {f.name for f in plan.carried} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert any("fp32 masters are carried" in x for x in plan.not_carried)
    res = convert_to_torch_dcp(plan)
    assert (res.out / "rng_state_1.pth").read_bytes() == (
        real_ckpt("hf-ds-zero2") / "checkpoint-2" / "rng_state_1.pth"
    ).read_bytes()
    assert "rng_state_0.pth" in res.instructions and "fp32 masters" in res.instructions


def test_lightning_prefix_is_stripped_as_export_does(real_ckpt, tmp_path):
    src = next((real_ckpt("lightning-ds-zero3") / "checkpoints").glob("*.ckpt"))
    plan = torch_dcp_plan(src, tmp_path / "out")
    assert plan.strip_prefix == "model."
    assert "embed_tokens.weight" in {t.name for t in plan.model}
    assert all(n in {t.name for t in plan.model} for g in plan.param_groups for n in g["params"])


def test_cancel_leaves_nothing(real_ckpt, tmp_path):
    plan = torch_dcp_plan(real_ckpt("ds-resume-zero2") / "checkpoint", tmp_path / "out")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        convert_to_torch_dcp(plan, cancel=cancel)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]


def test_cli_bad_input(real_ckpt, tmp_path):
    run = real_ckpt("ds-resume-zero2")
    # not DeepSpeed
    r = cli("convert", real_ckpt("fsdp2-dcp"), "--to", "torch-dcp", "--out", tmp_path / "o1", cwd=tmp_path)
    assert r.returncode == 1 and "is not a DeepSpeed ZeRO checkpoint" in r.stderr, r.stderr
    # no such path
    r = cli("convert", tmp_path / "nothing", "--to", "torch-dcp", "--out", tmp_path / "o1", cwd=tmp_path)
    assert r.returncode == 2 and "no such file" in r.stderr, r.stderr
    # an unknown target, a missing --out
    assert cli("convert", run / "checkpoint", "--to", "megatron", "--out", "x", cwd=tmp_path).returncode == 2
    assert cli("convert", run / "checkpoint", "--to", "torch-dcp", cwd=tmp_path).returncode == 2
    # output not empty; output inside the source
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = cli("convert", run / "checkpoint", "--to", "torch-dcp", "--out", tmp_path / "full", cwd=tmp_path)
    assert r.returncode == 1 and "not empty" in r.stderr, r.stderr
    r = cli("convert", run / "checkpoint", "--to", "torch-dcp", "--out", run / "checkpoint" / "x", cwd=tmp_path)
    assert r.returncode == 1 and "never writes into or removes a source" in r.stderr, r.stderr
    # a rank's optimizer file missing
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(run / "checkpoint", ck)
    os.remove(ck / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    r = cli("convert", ck, "--to", "torch-dcp", "--out", tmp_path / "o2", cwd=tmp_path)
    assert r.returncode == 1 and "rank" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o2").exists()


def test_cli_dry_run_writes_nothing_and_help_teaches(real_ckpt, tmp_path):
    run = real_ckpt("ds-resume-zero3")
    r = cli("convert", run / "checkpoint", "--to", "torch-dcp", "--out", tmp_path / "o", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Convert" in r.stdout and "verify" in r.stdout and not (tmp_path / "o").exists()
    r = cli(
        "convert", run / "checkpoint", "--to", "torch-dcp", "--out", tmp_path / "o", "--dry-run", "--json", cwd=tmp_path
    )
    doc = json.loads(r.stdout)
    assert doc["plan"]["zero_stage"] == 3 and doc["plan"]["optimizer_class"] == "AdamW"
    r = cli(
        "convert",
        run / "checkpoint",
        "--to",
        "torch-dcp",
        "--out",
        tmp_path / "o",
        "--tag",
        "global_step9",
        "--dry-run",
        cwd=tmp_path,
    )
    assert r.returncode == 1 and "global_step9" in r.stderr and "Traceback" not in r.stderr, r.stderr
    h = cli("convert", "--help", cwd=tmp_path)
    assert h.returncode == 0 and "fully_shard" in h.stdout and "--to torch-dcp" in h.stdout


def test_refuses_what_torch_adam_cannot_continue(real_ckpt):
    with pytest.raises(TorchDcpError, match="only Adam/AdamW"):
        torch_dcp.plan._optimizer_class({"type": "Lamb", "params": {}})
    with pytest.raises(TorchDcpError, match="bias_correction"):
        torch_dcp.plan._optimizer_class({"type": "Adam", "params": {"bias_correction": False}})
    assert torch_dcp.plan._optimizer_class({"type": "Adam", "params": {"torch_adam": True}})[0] == "AdamW"
    assert (
        torch_dcp.plan._optimizer_class({"type": "Adam", "params": {"torch_adam": True, "adam_w_mode": False}})[0]
        == "Adam"
    )
