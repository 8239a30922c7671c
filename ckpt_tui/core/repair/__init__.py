"""Repairs for what the inspector flags: ``repairs_for(report)`` -> [Repair]; ``Repair.plan`` is the
dry run (exactly what will change, where the backup goes); ``Repair.apply()`` does it safely
(temp file + fsync + os.replace, backup by hard link), re-inspects and says whether the finding
is gone. The CLI (``ckpt-tui fix``) and the TUI call these same functions.
"""

from __future__ import annotations

from .atomic import RepairError
from .repairs import repairs_for
from .run import Repair, RepairResult

__all__ = ["Repair", "RepairResult", "RepairError", "repairs_for"]
