"""A repair (its dry-run Plan and the action that applies it), its result, and running one: the
action, then a re-inspect that says whether the finding is gone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..formats import FormatError
from ..jsondoc import JsonFields
from ..progress import Cancelled, CancelToken, OnProgress
from ..types import Plan
from .atomic import RepairError
from .pickle_edit import EditError

# a repair's action: (on_progress, cancel) -> (a file was written, the message, the backup made, the files written)
RepairAction = Callable[[Optional[OnProgress], Optional[CancelToken]], tuple[bool, str, Optional[Path], list[Path]]]


@dataclass
class RepairResult(JsonFields):
    json_keys = ("id", "code", "path", "ok", "changed", "finding_gone", "message", "backup", "written")

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


@dataclass
class Repair(JsonFields):
    json_keys = ("id", "code", "path", "title", "writes", "can_apply", "plan")

    id: str  # the fix id (`ckpt-tui fix --only <id>`)
    code: str  # the finding code it addresses
    path: str  # the finding's path, relative to the inspected root
    title: str
    plan: Plan
    root: Path = field(repr=False, default=Path("."))
    writes: bool = True  # False: advice only (e.g. "run ckpt-tui export")
    can_apply: bool = True  # False: the plan explains why it cannot be done
    refused: bool = False  # it would apply, but ckpt-tui refuses it (a symbolic link on the way): a failure
    # (on_progress, cancel) -> (changed, message, backup, written); set by the repair's planner
    action: Optional[RepairAction] = field(default=None, repr=False)
    trust_pickles: bool = False

    def apply(self, on_progress: Optional[OnProgress] = None, cancel: Optional[CancelToken] = None) -> RepairResult:
        return run_repair(self, on_progress=on_progress, cancel=cancel)


def run_repair(
    r: Repair, on_progress: Optional[OnProgress] = None, cancel: Optional[CancelToken] = None
) -> RepairResult:
    """Run ``r``'s action, turn its failure into a result that says nothing was changed, re-inspect
    and say whether the finding is gone."""
    from ..report import inspect

    if not r.can_apply or r.action is None:
        return RepairResult(
            r.id,
            r.code,
            r.path,
            False,
            False,
            r.plan.title if not r.plan.notes else r.plan.title + " — " + "; ".join(r.plan.notes),
        )
    try:
        changed, msg, bak, written = r.action(on_progress, cancel)
    except Cancelled:
        raise
    except RepairError as e:
        return RepairResult(r.id, r.code, r.path, False, False, str(e))
    except EditError as e:
        return RepairResult(r.id, r.code, r.path, False, False, f"{e}. Nothing was changed.")
    except FormatError as e:
        return RepairResult(r.id, r.code, r.path, False, False, f"{e}. Nothing was changed.")
    except OSError as e:
        return RepairResult(
            r.id,
            r.code,
            r.path,
            False,
            False,
            f"{e.strerror or e}: {getattr(e, 'filename', '') or ''}. Nothing was changed.",
        )
    rep = inspect(r.root, trust_pickles=r.trust_pickles)
    gone = not any(x.code == r.code and x.path == r.path for x in rep.findings)
    if not gone:
        msg += f"; but re-inspecting still reports {r.code} at {r.path}"
    return RepairResult(
        r.id, r.code, r.path, gone, changed, msg, gone, str(bak) if bak else None, [str(p) for p in written]
    )
