"""Is this checkpoint whole, and will it resume (issue 24)? On saves that went wrong the common ways, written by
the real frameworks (samples/hf_broken.py; peft-fsdp1 of samples/hf_peft.py): each finding's advice is run as
printed, and HF's own ``Trainer.train(resume_from_checkpoint=...)`` is the oracle for every resume it advises.
The user stands in the variant folder, as after their run."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures import fixture_path
from tests.util import ckpt_tui


def _copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_path(name), d, symlinks=True)
    return d


def _findings(cwd: Path, path: str, code: str) -> list[dict]:
    doc = json.loads(ckpt_tui("inspect", path, "--json", cwd=cwd).stdout)
    return [f for f in doc["findings"] if f["code"] == code]


def _resume(
    cwd: Path, checkpoint: str, out: str = "resumed", deepspeed: bool = False, ranks: int = 0
) -> tuple[int, str]:
    """HF's own resume_from_checkpoint (samples/hf_broken.py --resume): (exit code, its RESUM* lines). ``ranks``:
    launched by torchrun on that many ranks (the Trainer then runs DDP), else one plain process."""
    from ckpt_tui.samples import launch_env

    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    cmd = (launch if ranks else [sys.executable]) + ["-m", "ckpt_tui.samples.hf_broken", "--resume", checkpoint, out]
    r = subprocess.run(cmd + ["--deepspeed"] * deepspeed, cwd=cwd, env=launch_env(), capture_output=True, text=True)
    lines = "\n".join(ln for ln in r.stdout.splitlines() if ln.startswith("RESUM"))
    assert lines, r.stdout[-3000:] + r.stderr[-3000:]
    return r.returncode, lines


def _advised(message: str) -> str:
    """The path of the printed `trainer.train(resume_from_checkpoint="...")`, read as Python reads the literal."""
    (literal,) = re.findall(r'resume_from_checkpoint=("(?:[^"\\]|\\.)*")', message)
    return ast.literal_eval(literal)


# ---------------------------------------------------------------------------------------------- killed saves


def test_a_save_killed_before_trainer_state_is_incomplete_and_the_advice_resumes(tmp_path):
    v = _copy("hf-killed-save", tmp_path)
    (f,) = _findings(v, "run", "checkpoint-incomplete")
    assert (f["severity"], f["path"]) == ("error", "checkpoint-4")
    # what the finding says of the broken one is what HF does
    rc, out = _resume(v, "run/checkpoint-4")
    assert rc == 1 and "FileNotFoundError" in out and "trainer_state.json" in out, out
    # the checkpoint it names resumes
    assert _advised(f["message"]) == "run/checkpoint-2"
    rc, out = _resume(v, _advised(f["message"]))
    assert rc == 0 and "RESUMING from step 2" in out, out
    # and the mv it prints, run as printed, makes resume_from_checkpoint=True pick that one
    (mv,) = re.findall(r"`(mv [^`]+)`", f["message"])
    subprocess.run(mv, shell=True, cwd=v, check=True)
    shutil.rmtree(v / "resumed")
    rc, out = _resume(v, "True", out="run")
    assert rc == 0 and "RESUMING from step 2" in out, out
    # once moved aside, the run is whole again
    assert _findings(v, "run", "checkpoint-incomplete") == []


def test_the_printed_advice_works_for_a_run_folder_whose_name_needs_quoting(tmp_path):
    v = _copy("hf-killed-save", tmp_path)
    odd = "my 'run\""
    (v / "run").rename(v / odd)
    (f,) = _findings(v, odd, "checkpoint-incomplete")
    assert _advised(f["message"]) == f"{odd}/checkpoint-2"
    (mv,) = re.findall(r"`(mv [^`]+)`", f["message"])
    subprocess.run(mv, shell=True, cwd=v, check=True)
    assert (v / odd / "checkpoint-4.incomplete").is_dir() and not (v / odd / "checkpoint-4").exists()
    rc, out = _resume(v, _advised(f["message"]))
    assert rc == 0 and "RESUMING from step 2" in out, out


def test_run_listing_export_and_summary_skip_the_killed_checkpoint(tmp_path):
    v = _copy("hf-killed-save", tmp_path)
    r = ckpt_tui("inspect", "run", cwd=v)
    assert re.search(r"checkpoint-4\s+step 4\s+hf-trainer\s+✖ incomplete", r.stdout), r.stdout
    assert "newest complete `checkpoint-2/` (newer, incomplete: `checkpoint-4/`)" in " ".join(r.stdout.split())
    r = ckpt_tui("export", "run", "--out", str(tmp_path / "out"), cwd=v)
    assert r.returncode == 0, r.stderr
    assert "the newest complete checkpoint `run/checkpoint-2/` (step 2): skipped newer `run/checkpoint-4/`" in r.stderr
    got = load_file(tmp_path / "out" / "model.safetensors")
    want = load_file(v / "run" / "checkpoint-2" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # named directly, its weights are still exported, as the finding says
    (f,) = _findings(v, "run/checkpoint-4", "checkpoint-incomplete")
    assert "`ckpt-tui export run/checkpoint-4 --out DIR`" in f["message"]


def test_a_run_folders_json_names_each_checkpoints_components_and_the_newest_complete_ones(tmp_path):
    v = _copy("hf-killed-save", tmp_path)
    doc = json.loads(ckpt_tui("inspect", "run", "--json", cwd=v).stdout)
    assert [(c["path"], c["complete"]) for c in doc["checkpoints"]] == [("checkpoint-4", False), ("checkpoint-2", True)]
    assert doc["checkpoints"][0]["components"]["model"] == "checkpoint-4/model.safetensors"
    assert doc["components"] == doc["checkpoints"][1]["components"]
    assert doc["components"] == {"model": "checkpoint-2/model.safetensors", "optimizer": "checkpoint-2/optimizer.pt"}


def test_a_rotation_killed_mid_delete_is_incomplete_and_the_advice_resumes(tmp_path):
    v = _copy("hf-rotation-killed", tmp_path)
    (f,) = _findings(v, "run", "checkpoint-incomplete")
    assert f["path"] == "checkpoint-1" and "lacks the model weights" in f["message"]
    assert "mv " not in f["message"]  # resume_from_checkpoint=True already picks the newer, whole checkpoint-2
    rc, out = _resume(v, _advised(f["message"]))
    assert rc == 0 and "RESUMING from step 2" in out, out


def test_save_only_model_says_what_a_resume_does_and_hf_does_it(tmp_path):
    one = _copy("hf-model-only", tmp_path)
    (f,) = _findings(one, "run/checkpoint-2", "resume-model-only")
    assert f["severity"] == "info" and "fresh optimizer" in f["message"]
    rc, out = _resume(one, "run/checkpoint-2")
    assert rc == 0 and "RESUMING from step 2" in out, out  # silently, as the finding says
    ddp = _copy("full-ddp-model-only", tmp_path)  # 2-rank DDP (samples/hf_peft.py), resumed on 2 ranks
    (f,) = _findings(ddp, "run/checkpoint-2", "resume-model-only")
    assert f["severity"] == "info" and "fresh optimizer" in f["message"]
    rc, out = _resume(ddp, "run/checkpoint-2", ranks=2)
    assert rc == 0 and "RESUMING from step 2" in out, out
    ds = _copy("hf-ds-model-only", tmp_path)
    (f,) = _findings(ds, "run/checkpoint-2", "resume-model-only")
    assert f["severity"] == "warning" and "Can't find a valid checkpoint" in f["message"]
    rc, out = _resume(ds, "run/checkpoint-2", deepspeed=True)
    assert rc == 1 and "Can't find a valid checkpoint" in out, out


def test_the_deepspeed_model_only_advice_loads_the_weights_as_printed(tmp_path, monkeypatch):
    v = _copy("hf-ds-model-only", tmp_path)
    (f,) = _findings(v, "run/checkpoint-2", "resume-model-only")
    (code,) = re.findall(r"instead: `([^`]+)`", f["message"])
    assert 'from_pretrained("run/checkpoint-2")' in code, code
    monkeypatch.chdir(v)  # where the user stood
    scope: dict = {}
    exec(code, scope)  # as printed
    want = load_file(v / "run" / "checkpoint-2" / "model.safetensors")
    got = scope["model"].state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_no_rng_state_is_an_info_and_resumes(tmp_path):
    v = _copy("hf-rotation-killed", tmp_path)
    (v / "run" / "checkpoint-2" / "rng_state.pth").unlink()
    (f,) = _findings(v, "run", "rng-state-missing")
    assert (f["severity"], f["path"]) == ("info", "checkpoint-2")
    assert _findings(v, "run", "checkpoint-incomplete")[0]["path"] == "checkpoint-1"  # only the rotated one
    rc, out = _resume(v, "run/checkpoint-2")
    assert rc == 0 and "RESUMING from step 2" in out, out


def _rotated_optimizer(tmp_path: Path) -> Path:
    """hf-rotation-killed with a newer checkpoint-3 (its checkpoint-2, copied) whose optimizer.pt is gone."""
    v = _copy("hf-rotation-killed", tmp_path)
    shutil.copytree(v / "run" / "checkpoint-2", v / "run" / "checkpoint-3")
    (v / "run" / "checkpoint-3" / "optimizer.pt").unlink()
    return v


def test_a_checkpoint_without_the_optimizer_its_siblings_have_is_incomplete(tmp_path):
    v = _rotated_optimizer(tmp_path)
    got = {f["path"]: f for f in _findings(v, "run", "checkpoint-incomplete")}
    assert sorted(got) == ["checkpoint-1", "checkpoint-3"]
    f = got["checkpoint-3"]
    assert f["severity"] == "error" and "lacks the optimizer state (optimizer.pt)" in f["message"], f["message"]
    assert _advised(f["message"]) == "run/checkpoint-2"  # the newest complete one (resumes: the rotation test)
    (mv,) = re.findall(r"`(mv [^`]+)`", f["message"])  # resume_from_checkpoint=True would pick checkpoint-3
    subprocess.run(mv, shell=True, cwd=v, check=True)
    assert [f["path"] for f in _findings(v, "run", "checkpoint-incomplete")] == ["checkpoint-1"]


def test_a_save_only_model_checkpoint_without_optimizer_is_not_incomplete(tmp_path):
    """The same, its training_args.bin the real one of a save_only_model run: the Trainer writes no optimizer.pt."""
    v = _rotated_optimizer(tmp_path)
    args = fixture_path("hf-model-only") / "run" / "checkpoint-2" / "training_args.bin"
    shutil.copyfile(args, v / "run" / "checkpoint-3" / "training_args.bin")
    assert [f["path"] for f in _findings(v, "run", "checkpoint-incomplete")] == ["checkpoint-1"]
    (f,) = _findings(v, "run", "resume-model-only")
    assert f["path"] == "checkpoint-3"


def test_a_missing_rng_state_of_one_rank_is_an_info(tmp_path):
    """A 2-rank save (HF Trainer + DeepSpeed) without rank 1's rng_state_1.pth: rng_state_0.pth alone still says
    the save had more than one process (one process writes rng_state.pth)."""
    v = _copy("hf-ds-zero2", tmp_path)
    assert _findings(v, "checkpoint-2", "rng-state-missing") == []
    (v / "checkpoint-2" / "rng_state_1.pth").unlink()
    (f,) = _findings(v, "checkpoint-2", "rng-state-missing")
    assert f["severity"] == "info" and "has no rng_state_1.pth" in f["message"], f["message"]
    assert _findings(v, "checkpoint-2", "checkpoint-incomplete") == []


# ---------------------------------------------------------------------------------------------- empty weights


def test_an_ungathered_zero3_save_is_empty_and_the_printed_export_recovers_it_bit_exact(tmp_path):
    v = _copy("zero3-ungathered", tmp_path)
    (f,) = [f for f in _findings(v, "checkpoint-2", "weights-empty")]
    assert f["path"] == "model.safetensors" and f["command"] == "ckpt-tui export checkpoint-2 --out DIR"
    out = tmp_path / "out"
    r = ckpt_tui(*f["command"].replace("DIR", str(out)).split()[1:], cwd=v)
    assert r.returncode == 0, r.stderr
    got, want = load_file(out / "model.safetensors"), load_file(v / "oracle" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)  # loads as the model it was


@pytest.mark.parametrize("path", ["checkpoint-2/model.safetensors", "state_dict.pt"])
def test_export_refuses_an_empty_file_with_the_reason(tmp_path, path):
    v = _copy("zero3-ungathered", tmp_path)
    r = ckpt_tui("export", path, "--out", str(tmp_path / "out"), cwd=v)
    assert r.returncode == 1 and "weights-empty" in r.stderr and "every one empty" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_the_file_inspected_alone_points_at_the_tag_beside_it_and_that_command_works(tmp_path):
    v = _copy("zero3-ungathered", tmp_path)
    (f,) = _findings(v, "checkpoint-2/model.safetensors", "weights-empty")
    assert f["command"] == "ckpt-tui export checkpoint-2 --out DIR"
    assert "`ckpt-tui inspect checkpoint-2` says whether they are whole there" in f["message"]
    r = ckpt_tui("inspect", "checkpoint-2", "--json", cwd=v)
    assert json.loads(r.stdout)["components"]["model"] == "global_step2"
    r = ckpt_tui(*f["command"].replace("DIR", str(tmp_path / "out")).split()[1:], cwd=v)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("sub", ["ungathered", "no-tensors"])
def test_an_empty_adapter_is_refused_and_the_printed_export_gives_what_peft_loads(tmp_path, sub):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    v = _copy("zero3-peft-ungathered", tmp_path)
    ck = f"{sub}/checkpoint-2"
    (f,) = _findings(v, ck, "weights-empty")
    assert f["path"] == "adapter_model.safetensors" and f["command"] == f"ckpt-tui export {ck} --out DIR"
    r = ckpt_tui("export", f"{ck}/adapter_model.safetensors", "--out", str(tmp_path / "bad"), cwd=v)
    assert r.returncode == 1 and "weights-empty" in r.stderr, r.stderr
    out = tmp_path / "out"
    r = ckpt_tui(*f["command"].replace("DIR", str(out)).split()[1:], cwd=v)
    assert r.returncode == 0, r.stderr
    got, want = load_file(out / "adapter_model.safetensors"), load_file(v / "oracle" / "adapter_state.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(v / "base-model"), out)
    loaded = {k: p for k, p in model.named_parameters() if "lora_" in k}
    assert len(loaded) == len(want) and all(p.numel() for p in loaded.values())


def test_hf_fsdp1_peft_says_nothing_can_recover_it_and_what_survives(tmp_path):
    v = _copy("peft-fsdp1", tmp_path)
    (f,) = _findings(v, "run", "weights-empty")
    assert f["path"] == "checkpoint-2/pytorch_model_fsdp_0" and f["command"] is None
    assert "no tool can recover them" in f["message"] and "checkpoint-2/optimizer_0/`" in f["message"]
    r = ckpt_tui("export", "run", "--out", str(tmp_path / "out"), cwd=v)
    assert r.returncode != 0 and "no complete checkpoint" in r.stderr and "weights-empty" in r.stderr, r.stderr


def test_rank0s_slice_beside_the_whole_dcp_is_refused_and_export_reads_the_dcp_bit_exact(tmp_path):
    import torch.distributed.checkpoint as dcp

    from ckpt_tui.samples._common import TinyLM

    v = _copy("fsdp2-rank0-slice", tmp_path)
    (f,) = _findings(v, "checkpoint-2", "weights-empty")
    assert f["path"] == "model.safetensors" and "one rank's slice" in f["message"], f["message"]
    r = ckpt_tui("export", "checkpoint-2/model.safetensors", "--out", str(tmp_path / "bad"), cwd=v)
    assert r.returncode == 1 and "weights-empty" in r.stderr, r.stderr  # the file inspected alone: refused
    for cmd in (f["command"], "ckpt-tui export checkpoint-2 --out DIR"):  # the folder: its DCP, not the slice
        out = tmp_path / f"out{len(cmd)}"
        r = ckpt_tui(*cmd.replace("DIR", str(out)).split()[1:], cwd=v)
        assert r.returncode == 0, r.stderr
        want = {"model": TinyLM().state_dict()}
        dcp.load(want, checkpoint_id=str(v / "checkpoint-2" / "pytorch_model_fsdp_0"))  # torch's own loader
        got = load_file(out / "model.safetensors")
        assert got.keys() == want["model"].keys()
        assert all(torch.equal(got[k], want["model"][k]) for k in got)


def test_rank0s_slice_beside_a_deepspeed_tag_is_refused_and_the_printed_export_reads_the_tag(tmp_path):
    """A real HF Trainer + ZeRO-2 checkpoint whose model.safetensors is rewritten as rank 0 of 2 saving its FSDP2
    shards: smaller than the shapes the tag beside it records. The printed export reads the tag: the run's weights."""
    from safetensors.torch import save_file

    v = _copy("hf-ds-zero2", tmp_path)
    model = v / "checkpoint-2" / "model.safetensors"
    want = load_file(model)  # the gathered save HF wrote
    save_file({k: t[: t.shape[0] // 2].clone() for k, t in want.items()}, model, metadata={"format": "pt"})
    (f,) = _findings(v, "checkpoint-2", "weights-empty")
    assert f["path"] == "model.safetensors" and f["command"] == "ckpt-tui export checkpoint-2 --out DIR"
    assert "one rank's slice" in f["message"] and "`checkpoint-2/global_step2/` beside it" in f["message"]
    r = ckpt_tui("export", "checkpoint-2/model.safetensors", "--out", str(tmp_path / "bad"), cwd=v)
    assert r.returncode == 1 and "weights-empty" in r.stderr, r.stderr  # the file inspected alone: refused
    assert not (tmp_path / "bad").exists()
    out = tmp_path / "out"
    r = ckpt_tui(*f["command"].replace("DIR", str(out)).split()[1:], cwd=v)
    assert r.returncode == 0, r.stderr
    got = load_file(out / "model.safetensors")  # the tag's fp32 masters; HF saved them cast to bf16
    assert got.keys() == want.keys() and all(torch.equal(got[k].to(want[k].dtype), want[k]) for k in want)


def test_an_adapter_whose_lora_tensors_are_no_matrices_is_empty_and_the_printed_export_recovers_it(tmp_path):
    """PEFT's own check: every lora_A / lora_B with fewer than 2 dimensions or a 0 in its shape, though the file's
    tensors are not empty (the run's adapter rewritten: lora_A flattened, lora_B with a 0 dimension)."""
    from peft import PeftModel
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    v = _copy("zero3-peft-ungathered", tmp_path)
    want = load_file(v / "oracle" / "adapter_state.safetensors")
    bad = {k: (t.flatten() if ".lora_A." in k else t[:, :0]).contiguous() for k, t in want.items()}
    ck = v / "ungathered" / "checkpoint-2"
    save_file(bad, ck / "adapter_model.safetensors", metadata={"format": "pt"})
    (f,) = _findings(v, "ungathered/checkpoint-2", "weights-empty")
    assert f["path"] == "adapter_model.safetensors" and "8 LoRA tensors, none of them a matrix" in f["message"]
    with pytest.raises(RuntimeError, match="size mismatch"):  # "loading it fails", as the message says
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(v / "base-model"), ck)
    out = tmp_path / "out"
    r = ckpt_tui(*f["command"].replace("DIR", str(out)).split()[1:], cwd=v)
    assert r.returncode == 0, r.stderr
    got = load_file(out / "adapter_model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_tensors_marks_empty_weights(tmp_path):
    v = _copy("zero3-ungathered", tmp_path)
    r = ckpt_tui("tensors", "checkpoint-2/model.safetensors", cwd=v)
    assert r.returncode == 0 and r.stdout.count("✖ 0") == 21, r.stdout
    assert "✖ weights-empty:" in r.stdout
    r = ckpt_tui("tensors", "checkpoint-2", cwd=v)  # the tag: whole, nothing marked
    assert "✖" not in r.stdout, r.stdout


# ---------------------------------------------------------------------------------------------- optimizer gaps


def test_a_dcp_optimizer_without_state_for_a_never_grad_parameter(tmp_path):
    """The finding's two claims on the real save: torch's standard resume fails; partial load resumes the rest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ckpt_tui.samples.hf_broken import nograd_model

    v = _copy("dcp-optim-nograd", tmp_path)
    (f,) = _findings(v, "checkpoint-2", "optimizer-state-missing")
    assert "`unused.weight`" in f["message"]
    model = nograd_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    msd, osd = get_state_dict(model, opt)  # initialises every parameter's state, as accelerate's resume does
    state = {"model": msd, "optimizer": osd}
    # torch raises CheckpointException, a BaseException
    with pytest.raises(BaseException, match="Missing key in checkpoint state_dict: optimizer.state.unused.weight"):
        dcp.load(state, checkpoint_id=str(v / "checkpoint-2"))
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optimizer": osd}
    dcp.load(state, checkpoint_id=str(v / "checkpoint-2"), planner=DefaultLoadPlanner(allow_partial_load=True))
    assert state["optimizer"]["state"]["lm_head.weight"]["exp_avg"].count_nonzero()  # the saved moments


# ---------------------------------------------------------------------------------------------- world size

DS_LOAD = r"""
import json, os, sys
from ckpt_tui.samples._common import TinyLM, finish, init_deepspeed, seed_all
from ckpt_tui.samples.ds_resume import ds_config
init_deepspeed()
import deepspeed
seed_all()
model = TinyLM()
cfg = ds_config(3, 1)
if sys.argv[2] == "universal":
    cfg["checkpoint"] = {"load_universal": True}   # what `ckpt-tui universal` prints
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
try:
    engine.load_checkpoint(sys.argv[1])
    out = {"global_steps": engine.global_steps}
except Exception as e:  # what DeepSpeed says, for the test to read
    out = {"error": f"{type(e).__name__}: {e}"}
sys.stdout.flush()
os.write(1, ("RESULT " + json.dumps(out) + "\n").encode())
finish()
"""


def test_a_zero3_tag_resumes_only_at_its_world_size_and_the_printed_conversion_resumes_elsewhere(tmp_path):
    from tests.util import torchrun

    v = _copy("ds-resume-zero3", tmp_path)
    (f,) = _findings(v, "checkpoint", "resume-world-size")
    assert (
        "exactly 2 data-parallel rank(s)" in f["message"]
        and f["command"] == "ckpt-tui universal checkpoint/global_step2"
    )
    script = tmp_path / "load.py"
    script.write_text(DS_LOAD)
    (got,) = torchrun(script, v / "checkpoint", "as-saved", nproc=1, cwd=v)
    assert "world size" in got.get("error", ""), got  # DeepSpeed refuses 1 rank, as the finding says
    r = ckpt_tui(*f["command"].split()[1:], cwd=v)
    assert r.returncode == 0, r.stderr
    (got,) = torchrun(script, v / "checkpoint", "universal", nproc=1, cwd=v)
    assert got == {"global_steps": 2}, got
    assert _findings(v, "checkpoint", "resume-world-size") == []  # converted: loadable at any world size
