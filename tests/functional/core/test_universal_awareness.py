"""inspect after `ckpt-tui universal`: on real checkpoints converted by DeepSpeed's own converter, the
universal-info-missing finding turns into an info that says where the universal checkpoint is and how
to load it (and the load works, from the user's folder, as printed); a universal folder is one line with
its summary unless --all; its files' roles are right in the JSON."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.types import shell_path

ROOT = Path(__file__).resolve().parents[3]
TAG = "checkpoint-2/global_step2"
UNI = "checkpoint-2/global_step2_universal"


def ckpt_tui(*args, cwd):
    """The console script as a user runs it, from ``cwd`` (paths relative to it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def run_printed(command: str, cwd):
    """A `ckpt-tui ...` line a finding printed, run as the user would paste it."""
    argv = shlex.split(command)
    assert argv[0] == "ckpt-tui", command
    return ckpt_tui(*argv[1:], cwd=cwd)


def finding(doc: dict, code: str, path: str) -> dict:
    hits = [f for f in doc["findings"] if f["code"] == code and f["path"] == path]
    assert len(hits) == 1, doc["findings"]
    return hits[0]


def inspect_json(path: str, cwd) -> dict:
    r = ckpt_tui("inspect", "--json", path, cwd=cwd)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """hf-ds-zero2 (HF Trainer, ZeRO-2, no universal_checkpoint_info) converted by running the command the
    warning prints, from the run folder (relative paths): once per session, ~5 s."""
    from tests.fixtures import fixture_path

    run = tmp_path_factory.mktemp("aware") / "run"
    shutil.copytree(fixture_path("hf-ds-zero2"), run, symlinks=True)
    f = finding(inspect_json("checkpoint-2", run), "universal-info-missing", "global_step2")
    assert f["severity"] == "warning" and f["command"] == "ckpt-tui universal checkpoint-2/global_step2"
    assert f"`{f['command']}`" in f["message"]
    r = run_printed(f["command"], run)
    assert r.returncode == 0, r.stderr
    assert (run / "checkpoint-2" / "latest_universal").read_text() == "global_step2_universal"
    return run


def test_after_conversion_inspect_says_how_to_load_not_convert(converted):
    """The finding is a few lines that name the command printing the load steps (it used to repeat them, 42-67
    lines at 80 columns); that command, run as printed, converts nothing and prints the very steps."""
    from ckpt_tui.core.convert.universal.instructions import UniversalLoad, load_instructions

    before = sorted(str(p.relative_to(converted)) for p in converted.rglob("*"))
    r = ckpt_tui("inspect", "checkpoint-2", cwd=converted)
    assert r.returncode == 0, r.stderr
    assert "● info    universal-info-missing checkpoint-2/global_step2" in r.stdout
    assert "convert it" not in r.stdout and "engine.load_checkpoint" not in r.stdout
    f = finding(inspect_json("checkpoint-2", converted), "universal-info-missing", "global_step2")
    assert f["severity"] == "info" and f["fix"] is None
    assert f["command"] == f"ckpt-tui universal {TAG}" and f"`{f['command']}` prints the steps" in f["message"]
    assert "`checkpoint-2/global_step2_universal/` is its universal checkpoint (21 parameters" in f["message"]
    assert len(f["message"]) < 500 and "\n" not in f["message"]
    out = run_printed(f["command"], converted)
    assert out.returncode == 0, out.stderr
    assert "already a complete universal checkpoint: not converted again" in out.stdout
    assert sorted(str(p.relative_to(converted)) for p in converted.rglob("*")) == before  # nothing written
    # the very text the conversion printed, with the paths as the user gave them
    want = load_instructions(
        UniversalLoad(
            out_shown=UNI,
            out_name="global_step2_universal",
            ckdir_shown="checkpoint-2",
            ckdir_code="checkpoint-2",
            ckdir_name="checkpoint-2",
            stage=2,
            global_step=2,
            frozen=[],
            buffers=[],
            framework="HF Trainer + DeepSpeed",
            frozen_code="checkpoint-2/frozen_params.safetensors",
            frozen_exported=False,
        )
    )
    assert want in out.stdout
    # an absolute path given: absolute paths in the command, and in the steps it prints
    f = finding(inspect_json(str(converted / "checkpoint-2"), ROOT), "universal-info-missing", "global_step2")
    out = run_printed(f["command"], ROOT)
    assert out.returncode == 0, out.stderr
    assert f"engine.load_checkpoint({str(converted / 'checkpoint-2')!r})" in out.stdout


def test_the_printed_resume_line_resumes_from_the_users_folder(converted, tmp_path):
    """HF Trainer, 2 ranks -> 1: trainer.train(resume_from_checkpoint=...) exactly as the command the finding
    names prints it, run from the folder inspect was run in."""
    from ckpt_tui.samples import launch_env
    from tests.functional.core.test_universal import HF_RESUME

    f = finding(inspect_json("checkpoint-2", converted), "universal-info-missing", "global_step2")
    steps = run_printed(f["command"], converted)
    assert steps.returncode == 0, steps.stderr
    line = next(ln.strip() for ln in steps.stdout.splitlines() if "trainer.train(resume_from_checkpoint=" in ln)
    ck = re.fullmatch(r"2\. trainer\.train\(resume_from_checkpoint=(.+)\)", line).group(1)
    ck = eval(ck)  # a Python string literal, as printed  # noqa: S307
    assert ck == "checkpoint-2"
    script = tmp_path / "resume.py"
    script.write_text(HF_RESUME)
    r = subprocess.run(
        [sys.executable, str(script), ck, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=launch_env(),
        timeout=600,
        cwd=converted,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    assert json.loads(res[7:]) == {"global_step": 3, "engine_steps": 3}


def test_universal_folder_is_one_line_unless_all(converted):
    r = ckpt_tui("inspect", "checkpoint-2", cwd=converted)
    tree = r.stdout[: r.stdout.index("\nFindings")]
    uni = [ln for ln in tree.splitlines() if "global_step2_universal/" in ln]
    assert len(uni) == 1 and "(21 parameters with fp32, exp_avg, exp_avg_sq, step; 115K params" in uni[0]
    assert "21 parameter folders in zero/; --all lists them" in tree
    assert "exp_avg.pt" not in r.stdout and "fp32.pt" not in r.stdout
    assert len(tree.splitlines()) <= 20, tree  # 84 per-parameter files are not listed
    r = ckpt_tui("inspect", "--all", "checkpoint-2", cwd=converted)
    assert r.returncode == 0, r.stderr
    on_disk = sorted(p.name for p in (converted / UNI / "zero").glob("*/*.pt"))
    assert len(on_disk) == 4 * 21
    assert sorted(re.findall(r"(fp32\.pt|exp_avg\.pt|exp_avg_sq\.pt|step\.pt)  ", r.stdout)) == on_disk
    assert "--all lists them" not in r.stdout


def test_universal_fixture_is_short_and_all_lists_every_file(real_ckpt):
    """DeepSpeed's ds_to_universal output for a 16-parameter ZeRO-3 model: 60 files, a handful of lines."""
    path = str(real_ckpt("universal"))
    r = ckpt_tui("inspect", path, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) <= 12, r.stdout
    assert "16 parameter folders in zero/; --all lists them" in r.stdout and "fp32.pt" not in r.stdout
    assert "(16 parameters with fp32, exp_avg, exp_avg_sq; 66K params, 265.2 kB fp32)" in r.stdout
    r = ckpt_tui("inspect", "--all", path, cwd=ROOT)
    files = [p for p in Path(path).rglob("*") if p.is_file()]
    for p in files:
        assert f"{p.name}  " in r.stdout, p
    assert len(r.stdout.splitlines()) > len(files)


def test_roles_and_summary_facts_in_json(real_ckpt):
    root = real_ckpt("universal-zero2")
    doc = inspect_json(str(root), ROOT)
    nodes = {n["path"]: n for n in doc["nodes"]}
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*")}
    assert set(nodes) - {"."} == on_disk  # every file and folder still listed
    roles = {"fp32.pt": "model", "exp_avg.pt": "optimizer", "exp_avg_sq.pt": "optimizer", "step.pt": "optimizer"}
    seen = set()
    for path, n in nodes.items():
        name = path.rsplit("/", 1)[-1]
        if "/zero/" in path and name in roles:
            assert n["role"] == roles[name], path
            seen.add(name)
    assert seen == set(roles)
    uf = nodes["global_step2_universal"]["facts"]
    fp32 = [
        torch.load(p, weights_only=False)["param"] for p in sorted(root.glob("global_step2_universal/zero/*/fp32.pt"))
    ]
    assert uf["param_folders"] == len(fp32) == 17 and uf["states"] == ["fp32", "exp_avg", "exp_avg_sq", "step"]
    assert uf["tensor_bytes"] == sum(t.numel() * t.element_size() for t in fp32)
    assert uf["param_count"] == sum(t.numel() for t in fp32) and uf["dtypes"] == ["float32"]
    assert doc["schema_version"] == 1


def _copy(converted, tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(converted, dest, symlinks=True)
    return dest


def test_an_incomplete_universal_keeps_the_warning_and_its_advice_works(converted, tmp_path):
    run = _copy(converted, tmp_path)
    (run / UNI / "zero" / "lm_head.weight" / "exp_avg_sq.pt").unlink()  # as if the converter died there
    f = finding(inspect_json("checkpoint-2", run), "universal-info-missing", "global_step2")
    assert f["severity"] == "warning" and f["command"] == f"ckpt-tui universal {TAG}"
    assert f"`{UNI}/` is there but incomplete (lm_head.weight: no exp_avg_sq.pt)" in f["message"]
    rm = re.search(r"`(rm -r [^`]+)`", f["message"]).group(1)
    assert rm == f"rm -r {UNI}"
    r = run_printed(f["command"], run)  # a killed conversion is not taken as done: the converter refuses ...
    assert r.returncode == 1 and "not converted again" not in r.stdout, r.stdout + r.stderr
    subprocess.run(shlex.split(rm), cwd=run, check=True)  # ... until it is removed, as the message says
    r = run_printed(f["command"], run)
    assert r.returncode == 0, r.stderr
    assert finding(inspect_json("checkpoint-2", run), "universal-info-missing", "global_step2")["severity"] == "info"


def test_latest_universal_naming_another_folder_keeps_the_warning(converted, tmp_path):
    run = _copy(converted, tmp_path)
    (run / "checkpoint-2" / "latest_universal").write_text("global_step9_universal")
    doc = inspect_json("checkpoint-2", run)
    f = finding(doc, "universal-info-missing", "global_step2")
    assert f["severity"] == "warning" and "`latest_universal` does not name it" in f["message"]
    assert finding(doc, "latest-dangling", "latest_universal")["severity"] == "error"
    (run / "checkpoint-2" / "latest_universal").unlink()
    f = finding(inspect_json("checkpoint-2", run), "universal-info-missing", "global_step2")
    assert f["severity"] == "warning" and "`latest_universal` is missing" in f["message"]


def test_a_path_with_a_space_is_quoted(converted, tmp_path):
    run = tmp_path / "my runs"
    shutil.copytree(converted, run, symlinks=True)
    given = str(run / "checkpoint-2")
    f = finding(inspect_json(given, ROOT), "universal-info-missing", "global_step2")
    assert f"`{shell_path(given, 'global_step2_universal')}/` is its universal checkpoint" in f["message"]
    assert f["command"] == f"ckpt-tui universal {shell_path(given, 'global_step2')}"
    r = run_printed(f["command"], ROOT)
    assert r.returncode == 0, r.stderr
    assert f"engine.load_checkpoint({given!r})" in r.stdout
