"""The house rules that a tool can check, checked on every test run: ruff (pyflakes, pycodestyle, import
order), ruff's formatter, import-linter's layer contracts in pyproject.toml (cli -> ui -> core, never
back; the core imports no textual/rich; formats below the scan), and mypy as [tool.mypy] configures it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean():
    r = _run(sys.executable, "-m", "ruff", "check", "ckpt_tui", "tests", "bench", "screenshots")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_applied():
    # the formatting commit is listed in .git-blame-ignore-revs (git blame --ignore-revs-file)
    r = _run(sys.executable, "-m", "ruff", "format", "--check", "ckpt_tui", "tests", "bench", "screenshots")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layers_hold():
    r = _run(str(BIN / "lint-imports"), "--no-cache")
    assert r.returncode == 0 and " 0 broken" in r.stdout, r.stdout + r.stderr


def test_mypy_passes():
    # no arguments: what is checked, and how strictly, is [tool.mypy] in pyproject.toml (torch and friends
    # skipped, so the run takes seconds, not minutes)
    r = _run(sys.executable, "-m", "mypy")
    assert r.returncode == 0, r.stdout + r.stderr
