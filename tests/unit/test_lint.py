"""The house rules that a tool can check, checked on every test run: ruff (pyflakes, pycodestyle, import
order), ruff's formatter, import-linter's layer contracts in pyproject.toml (cli -> ui -> core, never
back; the core imports no textual/rich; formats below the scan), and mypy as [tool.mypy] configures it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean():
    r = _run(sys.executable, "-m", "ruff", "check", "ckpt_tui", "tests", "bench", "screenshots", "scripts")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_applied():
    # the formatting commit is listed in .git-blame-ignore-revs (git blame --ignore-revs-file)
    r = _run(sys.executable, "-m", "ruff", "format", "--check", "ckpt_tui", "tests", "bench", "screenshots", "scripts")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layers_hold():
    r = _run(str(BIN / "lint-imports"), "--no-cache")
    assert r.returncode == 0 and " 0 broken" in r.stdout, r.stdout + r.stderr


def test_mypy_passes():
    # no arguments: what is checked, and how strictly, is [tool.mypy] in pyproject.toml (torch and friends
    # skipped, so the run takes seconds, not minutes)
    r = _run(sys.executable, "-m", "mypy")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_strict_on_the_core_and_exempts_nothing(tmp_path):
    # the configuration says it (strict flags on ckpt_tui.core and everything below it; no ignore_errors,
    # no module skipped but the third-party ones)…
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    assert not [o for o in overrides if o.get("ignore_errors")]
    ours = [o for o in overrides if any(m.startswith("ckpt_tui") for m in o["module"])]
    assert [o["module"] for o in ours] == [["ckpt_tui.core", "ckpt_tui.core.*"]]
    assert ours[0]["disallow_untyped_defs"] and ours[0]["disallow_any_generics"] and ours[0]["warn_return_any"]
    # …and mypy does it: a core module with an unannotated function fails, the same function in a face passes
    for pkg in ("ckpt_tui", "ckpt_tui/core", "ckpt_tui/cli"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    args = ("--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"))

    def check(face: str) -> subprocess.CompletedProcess:
        (tmp_path / f"ckpt_tui/{face}/probe.py").write_text("def f(x):\n    return x\n")
        cmd = [sys.executable, "-m", "mypy", *args, f"ckpt_tui/{face}/probe.py"]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    core, face = check("core"), check("cli")
    assert core.returncode == 1 and "no-untyped-def" in core.stdout, core.stdout + core.stderr
    assert face.returncode == 0, face.stdout + face.stderr
