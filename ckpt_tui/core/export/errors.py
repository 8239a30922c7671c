"""The export's refusal: a module of its own (nothing imported), so what checks before an export (``to_hf``, which
the inspector asks too) raises it without importing the writer."""

from __future__ import annotations


class ExportError(Exception):
    """The export cannot run or failed; the message says why and what to do."""
