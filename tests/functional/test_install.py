"""The first five minutes, as a new user has them: the wheel that `pip install .` builds — not this source
tree, not an editable install — installed into a fresh virtual environment and run from another folder.

Builds the sdist and, from it, the wheel (`python -m build`); the wheel must carry every non-Python file of
`ckpt_tui/` that git tracks (the stylesheets). The fresh venv gets the wheel with `--no-deps`; its
dependencies (torch, DeepSpeed, textual, ...) come from this environment through a `.pth` line, so nothing is
downloaded. Then: `ckpt-tui demo --no-open` (clean stderr, no DeepSpeed op compiled), again (reused),
`ckpt-tui inspect`, the TUI in tmux up to its first screen, `ckpt-tui demo --clean`.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.tmux import HAVE_TMUX, Tmux

ROOT = Path(__file__).resolve().parents[2]


def _project_files() -> list[str]:
    """What a clone would hold: tracked files plus untracked ones git does not ignore (not yet committed)."""
    r = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip("not a git checkout: cannot tell which files a clone holds")
    return [f for f in r.stdout.split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv folder, wheel, sdist, env) with the wheel installed into a fresh venv."""
    base = tmp_path_factory.mktemp("install")
    files = _project_files()
    src = base / "src"
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    dist = base / "dist"
    r = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [whl] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")

    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this environment's packages (torch, deepspeed, textual ...) as plain path entries: their .pth files, such
    # as the editable install of this tree, are not processed, so ckpt_tui can only come from the wheel
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "zz_test_dependencies.pth").write_text("\n".join(deps) + "\n")
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr

    home = base / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        XDG_CACHE_HOME=str(home / "cache"),
        TORCH_EXTENSIONS_DIR=str(home / "torch_extensions"),
    )
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return {
        "venv": venv,
        "py": py,
        "whl": whl,
        "sdist": sdist,
        "env": env,
        "cwd": elsewhere,
        "home": home,
        "files": files,
    }


def _run(inst, *args, timeout=300):
    return subprocess.run(
        [str(inst["venv"] / "bin" / "ckpt-tui"), *args],
        capture_output=True,
        text=True,
        env=inst["env"],
        cwd=inst["cwd"],
        timeout=timeout,
    )


def test_the_wheel_and_sdist_carry_every_data_file(installed):
    wanted = {f for f in installed["files"] if f.startswith("ckpt_tui/") and not f.endswith(".py")}
    assert "ckpt_tui/ui/app.tcss" in wanted
    with zipfile.ZipFile(installed["whl"]) as z:
        in_wheel = {n for n in z.namelist() if n.startswith("ckpt_tui/") and not n.endswith(".py")}
    assert in_wheel == wanted
    with tarfile.open(installed["sdist"]) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/ckpt_tui/" in n and not n.endswith(".py")}
    assert wanted <= in_sdist


def test_ckpt_tui_comes_from_the_fresh_venv(installed):
    r = subprocess.run(
        [str(installed["py"]), "-c", "import ckpt_tui; print(ckpt_tui.__file__)"],
        capture_output=True,
        text=True,
        env=installed["env"],
        cwd=installed["cwd"],
        check=True,
    )
    assert Path(r.stdout.strip()).is_relative_to(installed["venv"]), r.stdout


STEP = re.compile(r"^ +\d+\.\d s  \S")


def test_demo_builds_quietly_then_is_reused_then_cleaned(installed):
    demo = installed["home"] / "cache" / "ckpt-tui" / "demo"
    r = _run(installed, "demo", "--no-open")
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    # our words only: what it does and how long each step took, no framework warning or log line
    assert err[0] == (
        f"Building the demo run in {demo}: real torch FSDP and DeepSpeed training on 2 CPU ranks, "
        "once (later runs reuse it)."
    )
    assert err[1].endswith("starting 2 ranks with torchrun (each imports torch and DeepSpeed)")
    assert all(STEP.match(line) for line in err[1:]), r.stderr
    assert err[-1].endswith(f"done: {demo}") and len(err) == 5, r.stderr
    # the report of both runs: the two user-report problems
    assert "dcp-components" in r.stdout and "universal-info-missing" in r.stdout
    assert (demo / "fsdp-trainer-run" / "checkpoint-20" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert sorted(p.name for p in demo.iterdir()) == ["deepspeed-zero2", "fsdp-trainer-run"]  # only the runs
    # DeepSpeed's CPU op is not compiled (it would cost ~30 s with g++ and serve nothing here)
    assert not any(installed["home"].joinpath("torch_extensions").glob("*/*.so"))
    assert not list((installed["home"] / "cache" / "ckpt-tui" / "logs").glob("demo-*"))  # kept only on failure

    again = _run(installed, "demo", "--no-open")
    assert again.returncode == 0
    assert again.stderr == (f"Using the demo run built earlier in {demo} (`ckpt-tui demo --clean` removes it).\n")
    assert again.stdout == r.stdout

    insp = _run(installed, "inspect", str(demo / "fsdp-trainer-run" / "checkpoint-20"))
    assert insp.returncode == 0 and "model in `pytorch_model_fsdp_0/`" in insp.stdout, insp.stderr

    if HAVE_TMUX:  # the TUI from the wheel (its stylesheet included), up to its first screen, and out
        with Tmux(
            "ckpt-tui demo",
            {k: installed["env"][k] for k in ("PATH", "XDG_CACHE_HOME", "HOME")} | {"TERM": "xterm-256color"},
            cwd=installed["cwd"],
        ) as t:
            t.wait_for("fsdp-trainer-run")
            t.wait_for("deepspeed-zero2")
            t.keys("q")
            assert t.exit_code() == 0
            assert "Error" not in t.screen(history=100)

    clean = _run(installed, "demo", "--clean")
    assert clean.returncode == 0 and clean.stderr.startswith(f"Removed the demo run {demo} (")
    assert not demo.exists() and not list(demo.parent.glob(".demo*"))  # the stamp went with it
    assert _run(installed, "demo", "--clean").stderr == f"Nothing to remove: {demo} does not exist.\n"


def test_demo_never_removes_a_folder_it_did_not_make(installed, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    for args in (["--clean"], ["--no-open"]):
        r = _run(installed, "demo", "--out", str(mine), *args)
        assert r.returncode == 2 and "not a ckpt-tui demo" in r.stderr, r.stderr
    assert (mine / "notes.txt").read_text() == "precious"
    assert not list((installed["home"] / "cache" / "ckpt-tui" / "logs").glob("demo-*"))  # no stray log either
