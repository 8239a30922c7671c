"""The killed-save example of docs/inspect.md ("Is it whole, and will it resume?"), run as written on the fixture
it shows (samples/hf_broken.py `hf-killed-save`, from the folder holding the Trainer's output_dir `run/`), at
the 100 columns the page was printed at: its lines, in order (`...` stands for the tree it leaves out)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from tests.fixtures import fixture_path
from tests.util import ckpt_tui

DOC = Path(__file__).resolve().parents[3] / "docs" / "inspect.md"


def test_the_killed_save_example_runs_as_written(tmp_path):
    text = DOC.read_text().split("## Is it whole, and will it resume?", 1)[1]
    block = text.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("$ ")
    cmd, shown = shlex.split(block[0][2:]), [ln.rstrip() for ln in block[1:]]
    v = tmp_path / "v"
    shutil.copytree(fixture_path("hf-killed-save"), v)
    r = ckpt_tui(*cmd[1:], cwd=v, env={"COLUMNS": "100"})
    assert r.returncode == 1, r.stderr  # an error finding
    printed = [ln.rstrip() for ln in r.stdout.splitlines()]
    at = 0
    for line in shown:
        if line == "...":
            continue
        assert line in printed[at:], f"{line!r} not printed after line {at}:\n" + "\n".join(printed)
        at = printed.index(line, at) + 1
