"""Where ckpt-tui keeps what it makes for the user: one cache folder, ``$XDG_CACHE_HOME/ckpt-tui``
(``~/.cache/ckpt-tui`` by default).

    demo/               the ``ckpt-tui demo`` run (``ckpt-tui demo --clean`` removes it)
    logs/               a log file for each crash of the terminal UI and each failed demo build
    torch_extensions/   DeepSpeed's compiled ops, when a DeepSpeed launch of ours builds one
    fixtures/           the test suite's real-framework checkpoints (developers only)
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ckpt-tui"


def demo_dir() -> Path:
    return cache_home() / "demo"


def log_file(kind: str) -> Path:
    """A new, unique log path ``logs/<kind>-<date>-<time>-<pid>.log`` (the folder is created)."""
    import time

    folder = cache_home() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
