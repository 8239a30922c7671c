"""Repairs for what the inspector flags: ``repairs_for(report)`` -> [Repair]; ``Repair.plan`` is the
dry run (exactly what will change, where the backup goes); ``Repair.apply()`` does it safely
(temp file + fsync + os.replace, backup by hard link), re-inspects and says whether the finding
is gone. The CLI (``ckpt-tui fix``) and the TUI call these same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..model import Plan
from .atomic import RepairError

__all__ = ["Repair", "RepairResult", "RepairError", "repairs_for"]


@dataclass
class RepairResult:
    id: str
    code: str
    path: str
    ok: bool  # the repair ran (or had nothing to do) and the finding is gone
    changed: bool  # a file was written
    message: str
    finding_gone: bool = False  # re-inspected afterwards: the finding no longer appears
    backup: Optional[str] = None
    written: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        return self.message

    def to_json(self) -> dict:
        return {"id": self.id, "code": self.code, "path": self.path, "ok": self.ok, "changed": self.changed,
                "finding_gone": self.finding_gone, "message": self.message, "backup": self.backup,
                "written": self.written}


@dataclass
class Repair:
    id: str  # the fix id (`ckpt-tui fix --only <id>`)
    code: str  # the finding code it addresses
    path: str  # the finding's path, relative to the inspected root
    title: str
    plan: Plan
    root: Path = field(repr=False, default=Path("."))
    writes: bool = True  # False: advice only (e.g. "run ckpt-tui export")
    can_apply: bool = True  # False: the plan explains why it cannot be done
    _run: Optional[Callable] = field(default=None, repr=False)
    trust_pickles: bool = False

    def apply(self, on_progress=None, cancel=None) -> RepairResult:
        from .fix import run_repair

        return run_repair(self, on_progress=on_progress, cancel=cancel)

    def to_json(self) -> dict:
        return {"id": self.id, "code": self.code, "path": self.path, "title": self.title, "writes": self.writes,
                "can_apply": self.can_apply, "plan": self.plan.to_json()}


def repairs_for(report) -> list[Repair]:
    from .fix import repairs_for as _rf

    return _rf(report)
