"""ARCHITECTURE.md's "Adding a format" made true: its ``.npy`` example, taken from ARCHITECTURE.md as written (so the two cannot
drift), runs through inspect, the folder layout, ``tensors``, export and verify in a ``ckpt-tui`` process whose only
change is one ``register(Npy())`` call (nothing monkeypatched)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]

# the whole of what the subprocess adds to ckpt-tui: ARCHITECTURE.md's module, and one registry call
MAIN = """\
import sys
from ckpt_tui.core.formats.registry import register
from npy_format import Npy
register(Npy())
from ckpt_tui.cli import main
main(sys.argv[1:])
"""


def architecture_example() -> str:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text[text.index("\n## Adding a format\n") :]
    section = section[: section.index("\n## ", 1)]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "ARCHITECTURE.md's Adding a format section has no python block"
    return m.group(1)


@pytest.fixture
def npy_ckpt_tui(tmp_path):
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "npy_format.py").write_text(architecture_example())
    (mod / "run_ckpt_tui.py").write_text(MAIN)
    env = dict(os.environ, PYTHONPATH=f"{mod}{os.pathsep}{ROOT}", COLUMNS="120", NO_COLOR="1")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(mod / "run_ckpt_tui.py"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    return run


def test_the_readme_npy_format_inspects_lists_exports_and_verifies(npy_ckpt_tui, tmp_path):
    weights = np.arange(24, dtype=np.float32).reshape(4, 6)
    (tmp_path / "ckpt").mkdir()
    np.save(tmp_path / "ckpt" / "weights.npy", weights)

    r = npy_ckpt_tui("inspect", "ckpt", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["layout"] == "npy-file" and doc["components"] == {"model": "weights.npy"}  # the folder's layout
    assert doc["summary"].startswith("npy-file: model in `weights.npy` (") and doc["findings"] == []
    (node,) = [n for n in doc["nodes"] if n["path"] == "weights.npy"]
    assert node["format"] == "npy" and node["facts"]["param_count"] == 24 and node["facts"]["dtypes"] == ["float32"]

    r = npy_ckpt_tui("tensors", "ckpt")
    assert r.returncode == 0, r.stderr
    assert "weights" in r.stdout and "float32" in r.stdout

    r = npy_ckpt_tui("export", "ckpt", "--out", "out")
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file

    assert np.array_equal(load_file(tmp_path / "out" / "model.safetensors")["weights"], weights)

    r = npy_ckpt_tui("verify", "out", "--against", "ckpt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "numpy.load" in r.stdout


def test_the_readme_npy_format_refuses_an_object_array(npy_ckpt_tui, tmp_path):
    """An object array is a pickle: the header says so, and the example never reads past it."""
    (tmp_path / "ckpt").mkdir()
    np.save(tmp_path / "ckpt" / "weights.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    r = npy_ckpt_tui("inspect", "ckpt")
    assert "not a C-order numeric array" in r.stdout + r.stderr


def test_without_the_registry_line_npy_is_unknown(tmp_path):
    from ckpt_tui.core.report import inspect

    (tmp_path / "ckpt").mkdir()
    np.save(tmp_path / "ckpt" / "weights.npy", np.zeros(3, dtype=np.float32))
    assert inspect(tmp_path / "ckpt").inventory.layout == "unknown"
