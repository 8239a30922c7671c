"""The one place tests/unit imports ckpt-tui from: public entry points only.

``inspect(path, trust_pickles=False) -> Report``; ``Report.inventory`` (layout, framework,
components, summary, checkpoints, node(rel)), ``Report.findings`` (code, severity, path, message,
fix). When the core moves, this is the file to change.
"""
from ckpt_tui.core.report import inspect

__all__ = ["inspect"]
