"""A per-tensor listing of any component (name, shape, dtype, bytes), lazily, from headers only.

:func:`listable` decides which node's tensors the user sees for a node (selected in the TUI's
tree, or named on ``ckpt-tui tensors``); :func:`list_tensors` lists them. Both faces ask these
two, so the TUI's table and the CLI's listing cannot disagree."""

from __future__ import annotations

from typing import Iterator, Optional

from .formats.registry import format_of
from .layout import classify
from .types import MODEL_ROLES, Inventory, Node, Parsed, TensorInfo, model_component


def lists_tensors(node: Node) -> bool:
    """Can :func:`list_tensors` list ``node`` itself (its format lists tensors: DCP and DeepSpeed tag
    folders, universal folders, safetensors files and indexes, torch files, DeepSpeed model- and
    optim-states files)?"""
    return format_of(node).lists_tensors


def _weights_folder(node: Node) -> bool:
    """A folder of no format holding weights files (a universal checkpoint's ``zero/<param>/``)."""
    return node.is_dir and any(c.role in MODEL_ROLES and not c.is_dir and lists_tensors(c) for c in node.children)


def listable(inv: Inventory, node: Node) -> tuple[Optional[Node], str]:
    """Which node's tensors the user sees for ``node``, and a note (for a caption; "" when it is ``node``
    itself). ``node`` when its format lists tensors; for a checkpoint folder its model component (a
    run folder: its newest checkpoint's); for a file of a DCP folder (``.metadata``, a ``.distcp``
    shard) the folder; None when there is nothing to list (the note says why, or is "")."""
    if node.role == "backup":
        orig = node.facts.get("backup_of") or "a file"
        return None, f"a backup `ckpt-tui fix` kept of {orig}: not read (select {orig} to see its tensors)"
    if lists_tensors(node):
        return node, ""
    if not node.is_dir:
        parent = inv.node(node.path.rsplit("/", 1)[0] if "/" in node.path else ".")
        if parent is not None and parent is not node and format_of(parent).files_list_folder:
            return parent, f"the DCP folder {inv.shown(parent.path, slash=True)}"
        return None, ""
    rel = None
    if node.path in inv.checkpoint_components:  # a checkpoint of a run folder
        rel = inv.model_path(node.path)
    elif node is inv.root and inv.layout == "run-folder" and inv.checkpoints:
        whole = [c for c in inv.checkpoints if c["complete"]]
        ck = (whole or inv.checkpoints)[0]["path"]
        rel = inv.model_path(ck)
        if rel:
            sub = inv.node(rel)
            if sub is not None and lists_tensors(sub):
                newest = "newest complete" if whole and ck != inv.checkpoints[0]["path"] else "newest"
                return sub, f"the model component {inv.shown(rel, slash=sub.is_dir)} of the {newest} checkpoint"
    if rel is None:
        rel = model_component(classify(node)[1])
    if rel and rel != node.path:
        sub = inv.node(rel)
        if sub is not None and (lists_tensors(sub) or _weights_folder(sub)):
            return sub, f"the model component {inv.shown(rel, slash=sub.is_dir)}"
    if _weights_folder(node):
        return node, ""
    return None, ""


def list_tensors(node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
    """Yield the tensors a node holds, as its headers describe them (``parsed``: the scan's cache,
    ``Inventory.parsed``, so headers already read are not read again). A folder of no format lists
    the weights files in it. Raises FormatError on a broken file."""
    fmt = format_of(node)
    if fmt.lists_tensors:
        yield from fmt.tensors(node, parsed)
    elif node.is_dir:
        for c in node.children:
            if c.role in MODEL_ROLES and not format_of(c).plain_folder:
                yield from list_tensors(c, parsed)
