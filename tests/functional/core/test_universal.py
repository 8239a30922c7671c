"""DeepSpeed universal conversion on real checkpoints: DeepSpeed's converter in a watched subprocess,
verification against the source's fp32 masters, cancel / kill -9 safety, and a 2 -> 1 rank load."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.convert.universal import (
    UniversalError,
    convert_to_universal,
    universal_plan,
    verify_universal,
)
from ckpt_tui.core.export.sources import to_torch
from ckpt_tui.core.formats.deepspeed.zero import deepspeed_source
from ckpt_tui.core.progress import Cancelled
from tests.util import FileLease

ROOT = Path(__file__).resolve().parents[3]


def tree_sums(root: Path) -> dict:
    out = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            p = Path(dp) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def converter_pids(marker: str) -> list[int]:
    """Live processes whose command line mentions ``marker`` (our temp folder)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(d))
    return pids


def wait_gone(marker: str, timeout: float = 10.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        left = converter_pids(marker)
        if not left:
            return []
        time.sleep(0.1)
    return converter_pids(marker)


# (fixture, sub-path given as SRC, relative tag folder, copy?)  copies get the default output beside the
# tag; the shared cache is converted with --out elsewhere (and must stay byte-identical)
CASES = [
    ("hf-ds-zero1", "checkpoint-2", "checkpoint-2/global_step2", True),
    ("hf-ds-zero2", "checkpoint-2", "checkpoint-2/global_step2", True),
    ("hf-ds-zero3", "checkpoint-2", "checkpoint-2/global_step2", True),
    ("lightning-ds-zero2", "checkpoints/epoch=0-step=2.ckpt", "checkpoints/epoch=0-step=2.ckpt/checkpoint", True),
    ("lightning-ds-zero3", "checkpoints/epoch=0-step=2.ckpt", "checkpoints/epoch=0-step=2.ckpt/checkpoint", True),
    ("ds-zero2-bf16", "", "global_step2", False),
    ("ds-zero3-bf16", "global_step2", "global_step2", False),
    ("ds-zero2-frozen", "", "global_step2", False),
    ("ds-zero3-frozen", "", "global_step2", False),
]


@pytest.mark.parametrize("variant,sub,tag,copy", CASES, ids=[c[0] for c in CASES])
def test_convert_real(real_ckpt, real_ckpt_copy, tmp_path, variant, sub, tag, copy):
    base = real_ckpt_copy(variant) if copy else real_ckpt(variant)
    sums = tree_sums(base)
    tag_dir = base / tag
    out = None if copy else tmp_path / "elsewhere" / "uc"
    if out is not None:
        out.parent.mkdir()
    plan = universal_plan(base / sub if sub else base, out)
    assert plan.tag_dir == tag_dir
    assert plan.out == (tag_dir.parent / f"{tag_dir.name}_universal" if copy else out)
    seen = []
    res = convert_to_universal(plan, on_progress=seen.append)
    assert res.verification.ok, res.verification.problems
    assert (
        seen
        and seen[-1].done == seen[-1].total == plan.expected_files
        or any(p.done == plan.expected_files for p in seen)
    )
    # the source is byte-identical, apart from what we added beside the tag (copies only)
    after = tree_sums(base)
    added = set(after) - set(sums)
    assert {k: after[k] for k in sums} == sums
    if copy:
        rel_out = plan.out.relative_to(base)
        rel_latest = (plan.out.parent / "latest_universal").relative_to(base)
        rel_frozen = plan.frozen_file.relative_to(base)  # written by default where there are frozen params/buffers
        assert all(a.startswith(str(rel_out) + "/") or a in (str(rel_latest), str(rel_frozen)) for a in added), added
    else:
        assert not added
        assert not (tag_dir.parent / "latest_universal").exists()
    assert (plan.out.parent / "latest_universal").read_text() == plan.out.name
    staging = f".{plan.out.name}.universal-*"
    assert not list(plan.out.parent.glob(staging))  # the staging folder removed, the converter's latest with it
    assert not (plan.out / "latest_universal").exists()
    # verification is independent: re-run on the final folder; frozen params per stage
    ver = verify_universal(plan.out, tag_dir)
    assert ver.ok
    if variant.endswith("frozen"):
        if plan.stage == 3:
            assert ver.frozen_absent == ["embed_tokens.weight"]
        else:
            assert ver.frozen_ok == ["embed_tokens.weight"]
        assert "embed_tokens.weight" in plan.frozen and res.frozen_file == plan.frozen_file
        assert res.frozen_file.is_file() and f"load_file({str(res.frozen_file)!r})" in res.instructions
    assert '{"load_universal": true}' in res.instructions
    assert f"engine.load_checkpoint({str(plan.out.parent)!r})" in res.instructions


def test_verify_catches_a_wrong_master(real_ckpt, tmp_path):
    src = real_ckpt("ds-zero2-bf16") / "global_step2"
    plan = universal_plan(src, tmp_path / "uc")
    convert_to_universal(plan)
    fp = tmp_path / "uc" / "zero" / "lm_head.weight" / "fp32.pt"
    d = torch.load(fp, weights_only=True)
    d["param"] = d["param"].clone()
    d["param"].view(-1)[0] += 1e-6
    torch.save(d, fp)
    (tmp_path / "uc" / "zero" / "norm.bias" / "exp_avg_sq.pt").unlink()
    ver = verify_universal(tmp_path / "uc", src)
    assert not ver.ok
    assert any("lm_head.weight" in p and "differs" in p for p in ver.problems)
    assert any("norm.bias" in p and "exp_avg_sq" in p for p in ver.problems)


def test_refusals(real_ckpt, real_ckpt_copy, tmp_path):
    with pytest.raises(UniversalError, match="not a DeepSpeed ZeRO checkpoint"):
        universal_plan(real_ckpt("hf-fsdp1") / "checkpoint-2")
    with pytest.raises(UniversalError, match="already a DeepSpeed universal"):
        universal_plan(real_ckpt("universal"))
    src = real_ckpt("ds-zero2-bf16")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("user data")
    with pytest.raises(UniversalError, match="not empty"):
        universal_plan(src, tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "user data"
    with pytest.raises(UniversalError, match="inside the source"):
        universal_plan(src, src / "global_step2" / "uc")
    # a truncated rank file: the inspector's error finding stops it
    bad = real_ckpt_copy("ds-zero2-bf16")
    f = bad / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(UniversalError, match="errors"):
        universal_plan(bad)
    assert not (bad / "global_step2_universal").exists()
    # a missing rank
    miss = real_ckpt_copy("ds-zero3-bf16")
    (miss / "global_step2" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(UniversalError):
        universal_plan(miss)


class Evil:  # a class outside ckpt-tui's allowlist (stands for code a pickle could run)
    pass


def test_unsafe_pickle_needs_trust(real_ckpt_copy):
    ck = real_ckpt_copy("ds-zero2-bf16")
    ms = ck / "global_step2" / "mp_rank_00_model_states.pt"
    sd = torch.load(ms, weights_only=False)
    sd["evil"] = Evil()
    torch.save(sd, ms)
    with pytest.raises(UniversalError, match="trust-pickles"):
        universal_plan(ck)
    plan = universal_plan(ck, trust_pickles=True)
    assert plan.trust_pickles


def test_target_stage_warning(real_ckpt, tmp_path):
    plan = universal_plan(real_ckpt("ds-zero2-bf16"), tmp_path / "uc", target_stage=3)
    assert any("ZeRO-1/2 <-> ZeRO-3" in w for w in plan.warnings)
    plan = universal_plan(real_ckpt("ds-zero2-bf16"), tmp_path / "uc", target_stage=2)
    assert not any("differs" in w for w in plan.warnings)
    assert "--inject_missing_state" in plan.command(tmp_path / "x")
    plan3 = universal_plan(real_ckpt("ds-zero3-bf16"), tmp_path / "uc")
    assert "--inject_missing_state" not in plan3.command(tmp_path / "x")


def test_cancel_kills_group_and_removes_temp(real_ckpt_copy, tmp_path):
    src = real_ckpt_copy("ds-zero2-bf16")  # a private copy: the lease below blocks every reader
    sums = tree_sums(src)
    plan = universal_plan(src, tmp_path / "uc")
    cancel = threading.Event()
    marker = str(tmp_path / ".uc.universal-")  # its staging folder, beside OUT
    # the converter reads every rank's optimizer states: with the test holding a lease on rank 1's, it
    # certainly waits there, mid-conversion, when it is cancelled
    lease = FileLease(plan.tag_dir / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    seen = {}

    def on_progress(p):
        if not cancel.is_set():
            lease.wait_blocked()
            seen["running"] = converter_pids(marker)
            cancel.set()

    try:
        with pytest.raises(Cancelled):
            convert_to_universal(plan, on_progress=on_progress, cancel=cancel)
        assert seen["running"]  # the watchdog and the converter were running when cancelled
        assert wait_gone(marker, 5) == []
    finally:
        lease.release()
    assert not list(tmp_path.glob(".uc.universal-*"))
    assert not (tmp_path / "uc").exists() and not (tmp_path / "latest_universal").exists()
    assert tree_sums(src) == sums


KILL9 = """
import sys
from pathlib import Path
from ckpt_tui.core.convert.universal import convert_to_universal, universal_plan

plan = universal_plan(sys.argv[1], Path(sys.argv[2]))
print("PLANNED", flush=True)
sys.stdin.readline()  # the test takes its lease now, before the converter exists
convert_to_universal(plan)
print("DONE", flush=True)
"""


def test_kill9_of_ckpt_tui_leaves_no_converter(real_ckpt_copy, tmp_path):
    """ckpt-tui (its conversion, run in a process of its own as the TUI runs it) is killed -9 while
    DeepSpeed's converter works: the watchdog must take down the converter and its pool workers.
    A worker waits on a source file the test holds and the converter waits on its workers, so none
    can finish by itself: if they are gone, they were killed."""
    src = real_ckpt_copy("ds-zero3-bf16")
    out = tmp_path / "uc"
    marker = str(tmp_path / ".uc.universal-")  # its staging folder, beside OUT
    script = tmp_path / "kill9.py"
    script.write_text(KILL9)
    cli = subprocess.Popen(
        [sys.executable, str(script), str(src), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    lease = None
    try:
        assert cli.stdout.readline() == "PLANNED\n", cli.stderr.read()
        lease = FileLease(src / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
        cli.stdin.write("go\n")
        cli.stdin.flush()
        lease.wait_blocked(proc=cli)  # the converter is mid-conversion, waiting on that file
        running = converter_pids(marker)
        assert any(
            "ds_to_universal" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace") for p in running
        ), "the converter is not running"
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        assert wait_gone(marker, 10) == [], "converter/watchdog outlived ckpt-tui"
        lease.release()
        # nothing writes into the abandoned temp folder any more, nothing under the final name
        snap = [sorted(os.walk(tmp_path))]
        time.sleep(1.0)
        assert [sorted(os.walk(tmp_path))] == snap
        assert not out.exists() and not (tmp_path / "latest_universal").exists()
    finally:
        if lease is not None:
            lease.release()
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def test_cli(real_ckpt, tmp_path):
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "universal", *a], capture_output=True, text=True, cwd=ROOT
    )
    r = run(str(tmp_path / "nope"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run(str(real_ckpt("hf-fsdp1") / "checkpoint-2"))
    assert r.returncode == 1 and "not a DeepSpeed ZeRO checkpoint" in r.stderr and "Traceback" not in r.stderr
    r = run(
        str(real_ckpt("ds-zero2-frozen")), "--out", str(tmp_path / "uc"), "--dry-run", "--json", "--target-stage", "3"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["plan"]["frozen"] == ["embed_tokens.weight"]
    assert "ZeRO-1/2 <-> ZeRO-3" in r.stderr and not (tmp_path / "uc").exists()
    r = run(str(real_ckpt("ds-zero2-frozen")), "--out", str(tmp_path / "uc"), "--export-frozen", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)["result"]
    assert doc["verification"]["ok"] and doc["frozen_file"] == str(tmp_path / "frozen_params.safetensors")
    r = run(str(real_ckpt("ds-zero2-frozen")), "--out", str(tmp_path / "uc"))  # again: nothing to do
    assert r.returncode == 0 and "not converted again" in r.stdout, r.stdout + r.stderr
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    r = run(str(real_ckpt("ds-zero2-frozen")), "--out", str(tmp_path / "other"))
    assert r.returncode == 1 and "not empty" in r.stderr


LOAD_SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from ckpt_tui.samples._common import TinyLM, batch, init_dist, lm_loss
from ckpt_tui.samples.ds_engine import ds_config
init_dist(deepspeed=True)
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param
deepspeed.init_distributed(dist_backend="gloo")
ckpt_dir, out_dir, snippet = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]).read_text()
torch.manual_seed(4321)  # not the training seed: a weight that is never restored cannot pass by accident
model = TinyLM()
model.embed_tokens.weight.requires_grad_(False)
cfg = ds_config(2, True)
cfg["checkpoint"] = {"load_universal": True}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                       config=cfg)
load_path, client = engine.load_checkpoint(ckpt_dir)
masters = {n: safe_get_full_fp32_param(p).detach().clone() for n, p in engine.module.named_parameters()
           if p.requires_grad}
frozen_before = engine.module.embed_tokens.weight.detach().clone()
exec(snippet, {"engine": engine})  # the tool's instructions, verbatim
frozen_after = engine.module.embed_tokens.weight.detach().clone()
steps_loaded = engine.global_steps
ids = batch(7, 0)
loss = lm_loss(engine(ids), ids)
engine.backward(loss)
engine.step()
torch.save({"masters": masters, "frozen_before": frozen_before, "frozen_after": frozen_after}, out_dir / "state.pt")
(out_dir / "out.json").write_text(json.dumps({"load_path": load_path, "global_steps": steps_loaded,
    "after_step": engine.global_steps, "world": deepspeed.comm.get_world_size(), "loss": float(loss)}))
"""


def test_load_universal_2_to_1_rank_with_frozen(real_ckpt, tmp_path):
    """ds-zero2-frozen was saved by 2 ranks; load it with 1 rank, following the tool's instructions."""
    from ckpt_tui.core.convert.universal import frozen_load_code

    src = real_ckpt("ds-zero2-frozen")
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    plan = universal_plan(src, ckdir / "global_step2_universal", export_frozen=True)
    res = convert_to_universal(plan)
    assert res.frozen_file == ckdir / "frozen_params.safetensors"
    snippet = frozen_load_code(res.frozen_file, "engine.module")
    assert snippet in "\n".join(ln[4:] for ln in res.instructions.splitlines()) + "\n"
    (tmp_path / "snippet.py").write_text(snippet)
    script = tmp_path / "load.py"
    script.write_text(LOAD_SCRIPT)
    from ckpt_tui.samples import launch_env

    env = launch_env()  # the fixture generators' env: DeepSpeed's CPU comm op is already built in their cache
    r = subprocess.run(
        [sys.executable, str(script), str(ckdir), str(tmp_path), str(tmp_path / "snippet.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["world"] == 1 and out["global_steps"] == 2 and out["after_step"] == 3
    assert out["load_path"] and "global_step2_universal" in out["load_path"]
    st = torch.load(tmp_path / "state.pt", weights_only=True)
    source = {t.name: t for t in deepspeed_source(src / "global_step2").tensors}
    assert set(st["masters"]) == {n for n, t in source.items() if not t.frozen and n != "position_scale"}
    for n, m in st["masters"].items():
        want = to_torch(source[n])
        assert torch.equal(m.view(torch.int32), want.view(torch.int32)), n
    frozen_ckpt = to_torch(source["embed_tokens.weight"])  # bf16, as trained
    assert not torch.equal(st["frozen_before"], frozen_ckpt)  # load_universal did not restore it
    assert torch.equal(st["frozen_after"], frozen_ckpt)  # the exported file did


HF_RESUME = r"""
import json, sys, torch
from ckpt_tui.samples._common import TINY_LLAMA, init_dist
from ckpt_tui.samples.hf_trainer import TokenData, hf_ds_config
init_dist(deepspeed=True)
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
ck = sys.argv[1]
cfg = hf_ds_config(2)
cfg["checkpoint"] = {"load_universal": True}
args = TrainingArguments(output_dir=sys.argv[2], deepspeed=cfg, per_device_train_batch_size=2, max_steps=3,
                         save_strategy="no", logging_steps=1, learning_rate=1e-3, bf16=True, use_cpu=True, report_to=[],
                         seed=99, disable_tqdm=True, dataloader_num_workers=0)
torch.manual_seed(99)
model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA))
tr = Trainer(model=model, args=args, train_dataset=TokenData())
tr.train(resume_from_checkpoint=ck)
print("RESULT " + json.dumps({"global_step": tr.state.global_step, "engine_steps": tr.deepspeed.global_steps}))
"""


def test_hf_trainer_resumes_from_universal_2_to_1(real_ckpt_copy, tmp_path):
    """HF Trainer ZeRO-2 saved by 2 ranks resumes with 1 rank: resume_from_checkpoint=checkpoint-2 with
    load_universal; the default output (checkpoint-2/global_step2_universal + latest_universal) is where the
    Trainer's engine.load_checkpoint(checkpoint-2) looks."""
    from ckpt_tui.samples import launch_env

    ck = real_ckpt_copy("hf-ds-zero2") / "checkpoint-2"
    res = convert_to_universal(universal_plan(ck))
    assert f"resume_from_checkpoint={str(ck)!r}" in res.instructions
    script = tmp_path / "resume.py"
    script.write_text(HF_RESUME)
    r = subprocess.run(
        [sys.executable, str(script), str(ck), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=launch_env(),
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    assert json.loads(line[7:]) == {"global_step": 3, "engine_steps": 3}


def test_frozen_parameters_exported_afterwards_as_the_instructions_say(real_ckpt_copy, tmp_path):
    """Converted with --no-export-frozen, the tag's frozen parameters are not beside it: inspect's
    instructions name the command that writes them, which -- run as printed, from the user's
    folder -- writes only frozen_params.safetensors (the universal folder is not converted again)."""
    import re
    import shlex

    real_ckpt_copy("ds-zero2-frozen")
    sh = lambda cmd: subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    r = sh(
        "ckpt-tui universal ds-zero2-frozen --no-export-frozen".replace(
            "ckpt-tui", shlex.quote(sys.executable) + " -m ckpt_tui"
        )
    )
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "ds-zero2-frozen" / "frozen_params.safetensors").exists()
    uni = tmp_path / "ds-zero2-frozen" / "global_step2_universal"
    before = {p: p.stat().st_mtime_ns for p in uni.rglob("*")}
    r = sh(f"{shlex.quote(sys.executable)} -m ckpt_tui inspect ds-zero2-frozen --json")
    f = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "universal-info-missing"][0]
    assert f["severity"] == "info"
    cmd = re.findall(r"`(ckpt-tui universal [^`]+ --export-frozen)`", f["message"])
    assert cmd == ["ckpt-tui universal ds-zero2-frozen/global_step2 --export-frozen"], f["message"]
    run_it = cmd[0].replace("ckpt-tui", shlex.quote(sys.executable) + " -m ckpt_tui", 1)
    r = sh(run_it + " --dry-run")
    assert r.returncode == 0 and "not converted again" in r.stdout, r.stdout + r.stderr
    r = sh(run_it)
    assert r.returncode == 0, r.stderr
    assert "already a complete universal checkpoint: not converted again" in r.stdout
    frozen = tmp_path / "ds-zero2-frozen" / "frozen_params.safetensors"
    assert frozen.is_file() and {p: p.stat().st_mtime_ns for p in uni.rglob("*")} == before
    from safetensors.torch import load_file

    assert "embed_tokens.weight" in load_file(frozen)
    r = sh(f"{shlex.quote(sys.executable)} -m ckpt_tui inspect ds-zero2-frozen --json")
    f = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "universal-info-missing"][0]
    assert "--export-frozen" not in f["message"] and "ds-zero2-frozen/frozen_params.safetensors" in f["message"]


def test_inspect_after_converting_stays_short_and_its_command_prints_the_steps_again(real_ckpt_copy, tmp_path):
    """Issue 25: once converted, the finding is a few lines naming the command that prints the load steps, not
    the steps themselves; that command, run as printed, writes nothing and prints them (exit 0)."""
    import re
    import shlex

    real_ckpt_copy("ds-zero2-bf16")
    py = shlex.quote(sys.executable) + " -m ckpt_tui"
    sh = lambda cmd: subprocess.run(  # noqa: E731
        cmd, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="80")
    )
    r = sh(f"{py} universal ds-zero2-bf16")
    assert r.returncode == 0, r.stderr
    steps = r.stdout[r.stdout.index("Universal checkpoint:") :]
    r = sh(f"{py} inspect ds-zero2-bf16")
    assert r.returncode == 0 and len(r.stdout.splitlines()) <= 30, r.stdout
    assert "engine.load_checkpoint(" not in r.stdout  # the steps are one command away, not repeated here
    r = sh(f"{py} inspect ds-zero2-bf16 --json")
    (f,) = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "universal-info-missing"]
    assert f["command"] == "ckpt-tui universal ds-zero2-bf16/global_step2"
    assert re.search(r"`ckpt-tui universal ds-zero2-bf16/global_step2` prints the steps", f["message"]), f["message"]
    uni = tmp_path / "ds-zero2-bf16" / "global_step2_universal"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "ds-zero2-bf16").rglob("*")}
    r = sh(f["command"].replace("ckpt-tui", py, 1) + " --dry-run")
    assert r.returncode == 0 and "Nothing to write" in r.stdout, r.stdout + r.stderr
    r = sh(f["command"].replace("ckpt-tui", py, 1))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already a complete universal checkpoint: not converted again" in r.stdout
    assert r.stdout[r.stdout.index("Universal checkpoint:") :] == steps  # the same steps as after converting
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "ds-zero2-bf16").rglob("*")} == before
    assert uni.is_dir()
