"""What `pip install -e '.[test]'` (the README's test command, after `pip install torch==2.13.0`) resolves to."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def test_no_extra_names_the_project_itself():
    """An extra such as "ckpt-tui[s3]" inside the test extra makes pip re-resolve the project and move torch
    off the 2.13.0 CPU build .ci/run installs first (to a 2.14.1 CUDA build: minutes and gigabytes)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra, reqs in project["optional-dependencies"].items():
        assert not [r for r in reqs if r.replace("_", "-").lower().startswith(project["name"])], extra


def test_the_test_extra_carries_the_s3_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["s3"]) <= set(extras["test"])
