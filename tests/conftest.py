"""Shared pytest fixtures: real checkpoints written by the real frameworks (see tests/fixtures.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

try:
    from tests.fixtures import fixture_path
except ImportError:  # tests/ collected as rootdir-relative modules
    from fixtures import fixture_path


@pytest.fixture
def shared_tmp(_temp_files_under_basetemp):
    """A temp folder another user can traverse (pytest's base temp folder is private), for tests that drop
    root; removed afterwards, whatever modes the test left inside."""
    import os
    import tempfile

    base = tempfile.mkdtemp(prefix="ckpt-tui-shared-", dir=_temp_files_under_basetemp)
    os.chmod(base, 0o755)
    yield Path(base)
    for d, dirs, _ in os.walk(base):
        for name in dirs:
            os.chmod(os.path.join(d, name), 0o755)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _temp_files_under_basetemp(tmp_path_factory):
    """Everything the tests and their subprocesses put in a temp folder (torchrun's logs, DeepSpeed's,
    tempfile.mkdtemp) goes under pytest's base temp folder, which pytest removes after a passing run
    (tmp_path_retention_policy = "failed" in pyproject.toml): a full run leaves nothing behind but the
    fixture cache. Yields the system's temp folder, which other users can traverse (see shared_tmp)."""
    import os
    import tempfile

    system_tmp = tempfile.gettempdir()
    tmp = tmp_path_factory.getbasetemp() / "tmp"
    tmp.mkdir(exist_ok=True)
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None  # recomputed from TMPDIR on next use
    yield system_tmp
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


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


def _tally():
    """The advice corpus's tally in this process, if it ran cases here."""
    import sys

    for name, mod in list(sys.modules.items()):
        if name.endswith("test_advice_corpus") and getattr(mod, "TALLY", None) is not None and mod.TALLY.cases:
            return mod.TALLY
    return None


def pytest_configure(config):
    """The file a test process (pytest-xdist's worker) leaves the advice corpus's tally in, for the summary."""
    import os
    import tempfile

    if not hasattr(config, "workerinput"):  # the controller, or a run in one process
        fd, path = tempfile.mkstemp(prefix="ckpt-tui-tally-")
        os.close(fd)
        os.environ["CKPT_TUI_TALLY_FILE"] = path  # the workers, started after this, inherit it
        config.stash[_TALLY_KEY] = path


def pytest_sessionfinish(session):
    import os

    tally, path = _tally(), os.environ.get("CKPT_TUI_TALLY_FILE")
    if tally is not None and path and hasattr(session.config, "workerinput"):
        with open(path, "a") as f:
            f.write(tally.line() + "\n")


def pytest_terminal_summary(terminalreporter):
    """The advice corpus's count of what it ran (quoted in the figures table of docs/safety.md), from this
    process or from the worker that ran it."""
    import os

    tally = _tally()
    if tally is not None:
        terminalreporter.write_line(tally.line())
    path = terminalreporter.config.stash.get(_TALLY_KEY, None)
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f.read().splitlines():
                terminalreporter.write_line(line)
        os.remove(path)


_TALLY_KEY = pytest.StashKey[str]()
