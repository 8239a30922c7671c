"""Shared pytest fixtures: real checkpoints written by the real frameworks (see tests/fixtures.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

try:
    from tests.fixtures import fixture_path
except ImportError:  # tests/ collected as rootdir-relative modules
    from fixtures import fixture_path


@pytest.fixture(scope="session")
def real_ckpt():
    """real_ckpt(name) -> Path of the cached checkpoint. Read-only: copy it before modifying."""
    return fixture_path


def real_ckpt_copy(name: str, tmp_path: Path) -> Path:
    """Copy fixture ``name`` to ``tmp_path/name`` and return the copy."""
    target = Path(tmp_path) / name
    shutil.copytree(fixture_path(name), target, symlinks=True)
    return target


@pytest.fixture(name="real_ckpt_copy")
def _real_ckpt_copy_fixture(tmp_path):
    """real_ckpt_copy(name) -> Path of a private, modifiable copy under tmp_path."""
    return lambda name: real_ckpt_copy(name, tmp_path)
