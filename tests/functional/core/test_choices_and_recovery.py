"""No silent choices, and recover what is recoverable, on real HF Trainer + DeepSpeed checkpoints.

- export and universal say which checkpoint and tag they read and why; a `latest` that names no
  tag folder is refused (the candidates named) unless --tag names one.
- a ZeRO-1/2 tag whose optimizer states are broken (a rank's file missing or truncated) cannot give
  the fp32 masters, but its module weights are intact: the refusal and the shard-missing finding
  name `--from-module-states`, and the command they print, run as printed, exports weights equal
  to the run's own model.safetensors tensor by tensor.

Everything runs `python -m ckpt_tui` in a subprocess from the folder a user would be in.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = "hf-ds-zero2"
TAG = "global_step2"
OPTIM1 = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
RECOVER = f"ckpt-tui export checkpoint-2/{TAG} --from-module-states --out DIR"


def ckpt_tui(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def run_printed(line: str, cwd: Path, out: Path) -> subprocess.CompletedProcess:
    """A `ckpt-tui ...` line exactly as the tool printed it, DIR replaced by ``out``."""
    argv = shlex.split(line)
    assert argv[0] == "ckpt-tui" and argv.count("DIR") == 1, line
    return ckpt_tui(*[str(out) if a == "DIR" else a for a in argv[1:]], cwd=cwd)


def printed_commands(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ckpt-tui export")]


def assert_equals_run_weights(out: Path, real_ckpt) -> None:
    got = load_file(out / "model.safetensors")
    want = load_file(real_ckpt(FIXTURE) / "checkpoint-2" / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype == torch.bfloat16, name
        assert torch.equal(got[name], t), name


def one_message(r: subprocess.CompletedProcess) -> str:
    """A refusal: exit 1, no traceback, one `ckpt-tui:` message; returns it."""
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("ckpt-tui: ")]
    assert len(said) == 1, r.stderr
    return r.stderr


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_broken_optimizer_states_refusal_names_module_states_and_its_command_recovers(
    damage, real_ckpt_copy, real_ckpt, tmp_path
):
    run = real_ckpt_copy(FIXTURE)
    optim = run / "checkpoint-2" / TAG / OPTIM1
    if damage == "missing":
        optim.unlink()
    else:
        with open(optim, "r+b") as f:
            f.truncate(optim.stat().st_size // 2)

    r = ckpt_tui("export", "checkpoint-2", "--out", tmp_path / "refused", cwd=run)
    err = one_message(r)
    assert ("shard-missing" if damage == "missing" else "file-truncated") in err
    assert "NOT the fp32 masters" in err and not (tmp_path / "refused").exists()
    assert printed_commands(err)[-1] == RECOVER  # the refusal's last line: the command to run

    r = run_printed(printed_commands(err)[-1], run, tmp_path / "from-refusal")
    assert r.returncode == 0, r.stderr
    assert "verified ✓" in r.stdout and "HALF PRECISION (bf16)" in r.stdout and "NOT the fp32 master" in r.stdout
    assert_equals_run_weights(tmp_path / "from-refusal", real_ckpt)

    # the plan says it loudly too, before anything is written
    r = ckpt_tui(
        "export", f"checkpoint-2/{TAG}", "--from-module-states", "--out", tmp_path / "p", "--dry-run", "--json", cwd=run
    )
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["plan"]["notes"]
    assert any(n.startswith("HALF PRECISION (bf16)") and "NOT the fp32 master weights" in n for n in notes), notes
    assert not any("fp32 master weights —" in n for n in notes), notes  # no "--dtype bf16 halves the size" advice

    if damage == "missing":  # the finding names it and carries the command (from the checkpoint's parent)
        doc = json.loads(ckpt_tui("inspect", "checkpoint-2", "--json", cwd=run).stdout)
        (f,) = [f for f in doc["findings"] if f["code"] == "shard-missing"]
        assert f["command"] == RECOVER and f"`{RECOVER}`" in f["message"]
        r = run_printed(f["command"], run, tmp_path / "from-finding")
        assert r.returncode == 0, r.stderr
        assert_equals_run_weights(tmp_path / "from-finding", real_ckpt)


def test_module_states_unusable_too_or_zero3_no_offer_and_a_reasoned_refusal(real_ckpt_copy, tmp_path):
    run = real_ckpt_copy(FIXTURE)
    tag = run / "checkpoint-2" / TAG
    (tag / OPTIM1).unlink()
    ms = tag / "mp_rank_00_model_states.pt"
    with open(ms, "r+b") as f:
        f.truncate(ms.stat().st_size // 2)
    err = one_message(ckpt_tui("export", "checkpoint-2", "--out", tmp_path / "o", cwd=run))
    assert "--from-module-states" not in err
    doc = json.loads(ckpt_tui("inspect", "checkpoint-2", "--json", cwd=run).stdout)
    assert doc["findings"] and not any("--from-module-states" in json.dumps(f) for f in doc["findings"])
    err = one_message(ckpt_tui("export", "checkpoint-2", "--from-module-states", "--out", tmp_path / "o", cwd=run))
    assert f"checkpoint-2/{TAG}/mp_rank_00_model_states.pt cannot be read either" in err

    z3 = real_ckpt_copy("hf-ds-zero3")
    (z3 / "checkpoint-2" / TAG / OPTIM1).unlink()
    err = one_message(ckpt_tui("export", "checkpoint-2", "--out", tmp_path / "o", cwd=z3))
    assert "shard-missing" in err and "--from-module-states" not in err
    err = one_message(ckpt_tui("export", "checkpoint-2", "--from-module-states", "--out", tmp_path / "o", cwd=z3))
    assert f"checkpoint-2/{TAG}/ is ZeRO-3" in err and "not whole module weights" in err
    assert not (tmp_path / "o").exists()


def test_dangling_latest_refused_with_candidates_and_accepted_with_tag(real_ckpt_copy, tmp_path):
    run = real_ckpt_copy(FIXTURE)
    (run / "checkpoint-2" / "latest").write_text("global_step9")
    for cmd in (["export", "checkpoint-2", "--out", tmp_path / "o"], ["universal", "checkpoint-2", "--dry-run"]):
        err = one_message(ckpt_tui(*cmd, cwd=run))
        assert (
            "checkpoint-2/latest names `global_step9`, which is not a folder beside it, so ckpt-tui will not "
            f"guess which tag you mean. Tags in checkpoint-2/: {TAG}. Name one with --tag (e.g. --tag {TAG}), "
            f"or give the tag folder itself (checkpoint-2/{TAG})."
        ) in err, err
    assert not (tmp_path / "o").exists() and not (run / "checkpoint-2" / f"{TAG}_universal").exists()
    err = one_message(ckpt_tui("export", "checkpoint-2", "--tag", "global_step7", "--out", tmp_path / "o", cwd=run))
    assert f"--tag global_step7: no DeepSpeed tag folder `global_step7` in checkpoint-2/; its tags: {TAG}" in err

    r = ckpt_tui("export", "checkpoint-2", "--tag", TAG, "--out", tmp_path / "o", cwd=run)
    assert r.returncode == 0 and "verified ✓" in r.stdout, r.stderr
    assert f"ckpt-tui: the model is `checkpoint-2/{TAG}/` (--tag {TAG})" in r.stderr.splitlines()
    r = ckpt_tui("export", f"checkpoint-2/{TAG}", "--out", tmp_path / "o2", cwd=run)  # the tag folder itself
    assert r.returncode == 0 and "verified ✓" in r.stdout, r.stderr
    a, b = load_file(tmp_path / "o" / "model.safetensors"), load_file(tmp_path / "o2" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == torch.float32 for k in a)

    r = ckpt_tui("universal", "checkpoint-2", "--tag", TAG, "--dry-run", "--json", cwd=run)
    assert r.returncode == 0, r.stderr
    assert f"ckpt-tui: converting `checkpoint-2/{TAG}/` (--tag {TAG})" in r.stderr.splitlines()
    assert json.loads(r.stdout)["plan"]["tag_dir"] == str(run / "checkpoint-2" / TAG)


def test_export_and_universal_say_what_they_chose_and_why(real_ckpt_copy, tmp_path):
    run = real_ckpt_copy(FIXTURE)
    lines = lambda r: [ln for ln in r.stderr.splitlines() if ln.startswith("ckpt-tui: ")]

    r = ckpt_tui("export", "checkpoint-2", "--out", tmp_path / "o", "--dry-run", cwd=run)
    assert r.returncode == 0 and lines(r) == [f"ckpt-tui: the model is `checkpoint-2/{TAG}/` (`latest` names {TAG})"]
    r = ckpt_tui("universal", "checkpoint-2", "--dry-run", cwd=run)
    assert r.returncode == 0 and lines(r)[0] == f"ckpt-tui: converting `checkpoint-2/{TAG}/` (`latest` names {TAG})"

    # a run folder: the newest complete checkpoint, and the newer broken one it skipped
    shutil.copytree(run / "checkpoint-2", run / "checkpoint-4")
    (run / "checkpoint-4" / TAG / OPTIM1).unlink()
    here = run.parent
    r = ckpt_tui("export", run.name, "--out", tmp_path / "o", "--dry-run", cwd=here)
    assert r.returncode == 0, r.stderr
    assert lines(r) == [
        f"ckpt-tui: exporting the newest complete checkpoint `{run.name}/checkpoint-2/` (step 2): "
        f"skipped newer `{run.name}/checkpoint-4/` (shard-missing)",
        f"ckpt-tui: the model is `{run.name}/checkpoint-2/{TAG}/` (`latest` names {TAG})",
    ]
    r = ckpt_tui("universal", run.name, "--dry-run", cwd=here)
    assert r.returncode == 0, r.stderr
    assert lines(r)[:2] == [
        f"ckpt-tui: converting the newest complete checkpoint `{run.name}/checkpoint-2/` (step 2): "
        f"skipped newer `{run.name}/checkpoint-4/` (shard-missing)",
        f"ckpt-tui: converting `{run.name}/checkpoint-2/{TAG}/` (`latest` names {TAG})",
    ]

    # no `latest` at all: the newest tag, said
    (run / "checkpoint-2" / "latest").unlink()
    r = ckpt_tui("export", "checkpoint-2", "--out", tmp_path / "o", "--dry-run", cwd=run)
    assert r.returncode == 0 and lines(r) == [
        f"ckpt-tui: the model is `checkpoint-2/{TAG}/` (no `latest` file in checkpoint-2/: the newest tag, step 2)"
    ]
