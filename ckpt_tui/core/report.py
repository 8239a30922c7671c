"""scan + diagnose: what ``ckpt-tui inspect`` and the TUI show."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .diagnose import diagnose, mark_complete
from .formats.unpickle import gc_paused
from .progress import OnProgress
from .scan import OnNode, scan
from .storage import LocationLike, as_path, bytes_fetched, is_url
from .types import SCHEMA_VERSION, Finding, Inventory, run_checkpoint_doc

if TYPE_CHECKING:
    from .run_view import RunView


@dataclass
class Report:
    inventory: Inventory
    findings: list[Finding]
    # bytes read from object storage to inspect a remote checkpoint (None for a local one)
    bytes_fetched: Optional[int] = None

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def to_json(self, view: Optional[RunView] = None) -> dict[str, Any]:
        """The JSON document; a run folder's with ``view`` (its run view, ``--best-metric``'s), else the default one."""
        with gc_paused():  # plain dicts and lists, one per file and finding: no cycle for a collection to find
            return self._json(view)

    def run_view(self, *, best_metric: Optional[str] = None, higher_is_better: Optional[bool] = None) -> RunView:
        """The run view of a run folder (core/run_view.py): no rows for anything else."""
        from .run_view import run_view

        return run_view(self.inventory, self.findings, best_metric=best_metric, higher_is_better=higher_is_better)

    def _json(self, view: Optional[RunView]) -> dict[str, Any]:
        inv = self.inventory
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "path": str(inv.path),
            "summary": inv.summary,
            "layout": inv.layout,
            "framework": inv.framework,
            "components": inv.components,
            "nodes": [n.to_json() for n in inv.nodes()],
            "findings": [f.to_json() for f in self.findings],
        }
        if inv.checkpoints:
            # each entry: its own components; a run folder's top level: its newest complete checkpoint's
            view = view if view is not None else self.run_view()
            rows = {r.path: r for r in view.rows}
            doc["checkpoints"] = [
                run_checkpoint_doc(c, inv.checkpoint_components.get(c["path"], {}), rows[c["path"]].to_json())
                for c in inv.checkpoints
            ]
            doc["run"] = view.to_json()
            if not inv.components:
                whole = next((c for c in inv.checkpoints if c["complete"]), None)
                if whole is not None:
                    doc["components"] = dict(inv.checkpoint_components.get(whole["path"], {}))
        if self.bytes_fetched is not None:
            doc["bytes_fetched"] = self.bytes_fetched
        return doc


def inspect(
    path: LocationLike,
    *,
    on_node: Optional[OnNode] = None,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
    trust_pickles: bool = False,
) -> Report:
    remote = is_url(path)
    before = bytes_fetched()
    inv = scan(
        path if remote else as_path(path),
        on_node=on_node,
        on_progress=on_progress,
        cancel=cancel,
        trust_pickles=trust_pickles,
    )
    if not remote and inv.layout != "unknown":
        from .adapters.found import adapter_info
        from .layout import summary

        inv.adapter = adapter_info(inv)
        if inv.adapter is not None:
            inv.summary = summary(inv.root, inv.layout, inv.components, inv.adapter.headline())
    with gc_paused():  # findings are plain data, one per broken file: collections would walk the tree again
        findings = diagnose(inv)
        mark_complete(inv, findings)
    if inv.layout == "run-folder" and any(not c["complete"] for c in inv.checkpoints):
        from .layout import summary as run_summary

        model_text = inv.adapter.headline() if inv.adapter is not None else None
        broken = frozenset(c["path"] for c in inv.checkpoints if not c["complete"])
        inv.summary = run_summary(inv.root, inv.layout, inv.components, model_text, incomplete=broken)
    return Report(inv, findings, bytes_fetched() - before if remote else None)
