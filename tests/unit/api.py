"""The one place tests/unit imports ckpt-tui from: public entry points only.

``inspect(path, trust_pickles=False) -> Report``; ``Report.inventory`` (layout, framework,
components, summary, checkpoints, node(rel)), ``Report.findings`` (code, severity, path, message,
fix). ``facts_type(format, is_dir)``: the TypedDict declaring a node's facts (``NodeFacts``: those
of every node; ``FACTS_BY_FORMAT``: format -> declaration, as the format registry states it). When the
core moves, this is the file to change. ``plan_export(src, out, component=...)``: an export's plan, or its
refusal (``ExportError``).
"""

from ckpt_tui.core.export.api import plan_export
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.facts import NodeFacts
from ckpt_tui.core.formats.registry import facts_by_format, facts_type
from ckpt_tui.core.report import inspect

FACTS_BY_FORMAT = facts_by_format()

__all__ = ["inspect", "facts_type", "FACTS_BY_FORMAT", "NodeFacts", "plan_export", "ExportError"]
