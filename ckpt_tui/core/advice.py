"""What findings say alike, whichever format raises them: the export line, the newest intact checkpoint beside
a broken one, and what one ``diagnose()`` call has worked out already about the tree (:data:`MEMO`)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Optional, TypeVar, cast

from .names import step_of
from .types import Inventory, Node

_T = TypeVar("_T")


# what one diagnose() call has already worked out about the tree (keyed by kind and node path), so a question
# asked once per file (is the checkpoint beside it intact?) costs one walk of the tree, not one per file
MEMO: ContextVar[Optional[dict[Any, Any]]] = ContextVar("diagnose_memo", default=None)


def memo(key: tuple[Any, ...], compute: Callable[[], _T]) -> _T:
    shared = MEMO.get()
    if shared is None:  # called outside diagnose (a repair's plan): nothing to share
        return compute()
    if key not in shared:
        shared[key] = compute()
    return cast(_T, shared[key])


def export_command(inv: Inventory, rel: str) -> str:
    """The export line for the weights at ``rel`` (``DIR``: the user's choice of output folder)."""
    return f"ckpt-tui export {inv.shown(rel)} --out DIR"


def sibling_hint(inv: Inventory, n: Node) -> str:
    s = last_complete_sibling(inv, n)
    return f" The newest other checkpoint here is `{inv.shown(s, slash=True)}`." if s else ""


def checkpoint_of(n: Node) -> Optional[str]:
    parts = n.path.split("/")
    for i in range(len(parts), 0, -1):
        if step_of(parts[i - 1]) is not None:
            return "/".join(parts[:i])
    return None


def last_complete_sibling(inv: Inventory, n: Node) -> Optional[str]:
    """The newest other checkpoint beside the one holding ``n`` with no sign of breakage."""
    mine = checkpoint_of(n)
    if mine is None:
        return None
    parent = mine.rsplit("/", 1)[0] if "/" in mine else "."
    newest = memo(("intact", parent), lambda: two_newest_intact(inv, parent))
    return next((path for _, path in newest if path != mine), None)


def two_newest_intact(inv: Inventory, parent: str) -> list[tuple[int, str]]:
    """The two newest checkpoints in ``parent`` with no sign of breakage, newest first: the newest other
    than any one of them is among these two (one question per folder, not per checkpoint in it)."""
    pnode = inv.node(parent)
    if pnode is None:
        return []
    cands = []
    for c in pnode.children:
        step = step_of(c.name) if c.is_dir else None
        if step is not None and not has_breakage(c):
            cands.append((step, c.path))
    return sorted(cands, reverse=True)[:2]


def has_breakage(n: Node) -> bool:
    """Is a file or folder at or below ``n`` truncated, corrupt or missing files? (Within diagnose: from one
    walk of the whole tree.)"""
    memo = MEMO.get()
    if memo is None:
        return any(broken_here(x) for x in n.walk())
    if "breakage" not in memo:
        memo["breakage"] = broken = set()

        def visit(x: Node) -> bool:
            bad = broken_here(x)
            for c in x.children:
                bad = visit(c) or bad
            if bad:
                broken.add(id(x))
            return bad

        visit(memo["root"])
    return id(n) in memo["breakage"]


def broken_here(x: Node) -> bool:
    f = x.facts
    return bool(f.get("error_kind") in ("truncated", "corrupt") or f.get("metadata_missing") or f.get("missing_files"))


def ranks_text(rs: list[int]) -> str:
    if not rs:
        return "none"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"{rs[0]}–{rs[-1]}"
    return ", ".join(str(r) for r in rs)
