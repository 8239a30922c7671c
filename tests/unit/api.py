"""The one place tests/unit imports ckpt-tui from: public entry points only.

``inspect(path, trust_pickles=False) -> Report``; ``Report.inventory`` (layout, framework,
components, summary, checkpoints, node(rel)), ``Report.findings`` (code, severity, path, message,
fix). ``facts_type(format, is_dir)``: the TypedDict declaring a node's facts (``NodeFacts``: those
of every node; ``FACTS_BY_FORMAT``: format -> declaration). When the core moves, this is the file
to change.
"""

from ckpt_tui.core.facts import FACTS_BY_FORMAT, NodeFacts, facts_type
from ckpt_tui.core.report import inspect

__all__ = ["inspect", "facts_type", "FACTS_BY_FORMAT", "NodeFacts"]
