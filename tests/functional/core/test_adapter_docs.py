"""The worked LoRA example of docs/export.md, run as written on the fixture it describes (samples/hf_peft.py
`peft-llama`): each `$` command from the Trainer's output folder, its output's lines as the page shows them
(the time of a run aside), and the load code it prints, run."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from tests.fixtures import fixture_path
from tests.snippets import run_load_snippets, snippet_after
from tests.util import ckpt_tui

DOC = Path(__file__).resolve().parents[3] / "docs" / "export.md"


def _example() -> list[tuple[str, list[str]]]:
    text = DOC.read_text().split("## LoRA adapters (PEFT)", 1)[1]
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    runs: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            runs.append((line[2:].split("#", 1)[0].strip(), []))
        elif line.strip():
            runs[-1][1].append(line)
    return runs


def _same(shown: str, printed: str) -> bool:
    t = r"[0-9.]+ s"  # seconds differ from run to run
    return (
        re.fullmatch(re.escape(shown).replace(re.escape("0.0 s"), t).replace(re.escape("2.1 s"), t), printed)
        is not None
    )


def test_the_worked_lora_example_runs_as_written(tmp_path):
    v = tmp_path / "peft-llama"
    shutil.copytree(fixture_path("peft-llama"), v)
    cwd = v
    runs = _example()
    assert [c.split()[0:3] for c, _ in runs][0] == ["cd", "run", "&&"]
    for cmd, shown in runs:
        if cmd.startswith("cd "):
            where, cmd = cmd[3:].split(" && ", 1)
            cwd = cwd / where
        args = shlex.split(cmd)
        assert args[0] == "ckpt-tui"
        r = ckpt_tui(*args[1:], cwd=cwd, env={"COLUMNS": "104"})
        assert r.returncode == 0, r.stderr
        if args[1] == "inspect":  # the summary, as the page wraps it
            assert " ".join(shown) == " ".join(r.stdout.split("\n")[: len(shown)]).replace("  ", " ").strip(), r.stdout
            continue
        printed = r.stdout.splitlines()
        for line in shown:
            assert any(_same(line, p) for p in printed), (line, printed)
        run_load_snippets([(snippet_after(r.stdout), cwd, "peft-llama")])
