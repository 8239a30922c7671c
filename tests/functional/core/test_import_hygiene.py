"""Importing any ckpt_tui.core module must not pull in the UI (textual, rich) or the heavy
frameworks (torch, deepspeed): core reads headers and is used by the CLI's fast paths."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import ckpt_tui.core

CORE_MODULES = sorted(m.name for m in pkgutil.walk_packages(ckpt_tui.core.__path__, "ckpt_tui.core."))
BANNED = ("textual", "rich", "torch", "deepspeed")

_PROBE = r"""
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in %r if m in sys.modules)))
""" % (BANNED,)


def test_discovered_modules():
    assert "ckpt_tui.core.report" in CORE_MODULES
    assert "ckpt_tui.core.scan" in CORE_MODULES


@pytest.mark.parametrize("module", ["ckpt_tui.core", *CORE_MODULES])
def test_core_module_imports_no_ui_and_no_frameworks(module):
    p = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-4000:]
    loaded = json.loads(p.stdout.strip().splitlines()[-1])
    ui = [m for m in loaded if m in ("textual", "rich")]
    heavy = [m for m in loaded if m in ("torch", "deepspeed")]
    assert not ui, f"importing {module} imports {ui}"
    assert not heavy, f"importing {module} imports {heavy}"
