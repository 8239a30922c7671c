"""tests/unit stays fast because nothing in it imports torch or DeepSpeed: checked in a fresh
interpreter that imports what pytest imports for this folder, then builds and inspects every tree
of every table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from . import test_findings, test_layouts

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "deepspeed")

_PROBE = r"""
import importlib, json, pathlib, sys, tempfile
import tests.conftest  # pytest imports it first: tests/fixtures.py and ckpt_tui.samples
import tests.unit.conftest
modules = [importlib.import_module("tests.unit." + p.stem) for p in sorted(pathlib.Path("tests/unit").glob("test_*.py"))]
from tests.unit.api import inspect
built = 0
with tempfile.TemporaryDirectory() as tmp:
    for m in modules:
        for i, case in enumerate(getattr(m, "CASES", ())):
            base = pathlib.Path(tmp) / f"{m.__name__}.{i}"
            base.mkdir()
            inspect(case.build(base), **case.options)
            built += 1
print(json.dumps({"trees": built, "loaded": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def test_unit_trees_are_inspected_without_torch_or_deepspeed():
    p = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["trees"] == len(test_layouts.CASES) + len(test_findings.CASES)
    assert out["loaded"] == [], f"tests/unit imported {out['loaded']}"
