"""A per-tensor listing of any component (name, shape, dtype, bytes), lazily, from headers only.

:func:`listable` decides which node's tensors the user sees for a node (selected in the TUI's
tree, or named on ``ckpt-tui tensors``); :func:`list_tensors` lists them. Both faces ask these
two, so the TUI's table and the CLI's listing cannot disagree."""

from __future__ import annotations

from typing import Iterator, Optional

from .formats.registry import format_of
from .layout import classify
from .types import MODEL_ROLES, Inventory, Node, Parsed, TensorInfo, model_component, numel


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


def list_tensors(node: Node, parsed: Optional[Parsed] = None, *, stored: bool = False) -> Iterator[TensorInfo]:
    """Yield the tensors a node holds, as its headers describe them (``parsed``: the scan's cache,
    ``Inventory.parsed``, so headers already read are not read again). A folder of no format lists
    the weights files in it. Raises FormatError on a broken file.

    A DCP folder holding the model lists what ``export`` writes of it: the model's tensors alone (not the optimizer
    state saved beside them), under the names export gives them (its single container unwrapped, Megatron-Core's
    stacked layers one per layer); ``stored``: every entry under its stored key instead."""
    fmt = format_of(node)
    if fmt.lists_tensors and not stored and fmt.torch_dcp and node.role in MODEL_ROLES:
        yield from _dcp_as_exported(node, parsed)
    elif fmt.lists_tensors and not stored and node.facts.get("weights_under") and node.role in MODEL_ROLES:
        yield from _file_as_exported(node, parsed, str(node.facts.get("weights_under")))
    elif fmt.lists_tensors:
        yield from fmt.tensors(node, parsed)
    elif node.is_dir:
        for c in node.children:
            if c.role in MODEL_ROLES and not format_of(c).plain_folder:
                yield from list_tensors(c, parsed)


def _dcp_as_exported(node: Node, parsed: Optional[Parsed]) -> Iterator[TensorInfo]:
    from .formats.dcp import reader as dcpfmt
    from .formats.dcp.format import hf_shards
    from .formats.dcp.source import output_tensors

    if hf_shards(node):  # torch's HuggingFaceStorageWriter shards: its tensors are what export writes
        yield from format_of(node).tensors(node, parsed)
        return
    info = (parsed.get(node, dcpfmt.DcpInfo) if parsed is not None else None) or dcpfmt.read(node.abspath)
    from .export.prefix import choose

    by_key = {t.name: t for t in info.tensors}
    outputs = output_tensors(node.abspath, info)
    strip = choose(node, [name for _, name, _ in outputs]).strip  # a LightningModule's one attribute, as export
    for key, name, layer in outputs:
        if strip and name.startswith(strip):
            name = name[len(strip) :]
        t = by_key[key]
        shape = t.shape if layer is None else t.shape[1:]
        item = t.nbytes // max(1, numel(t.shape)) if t.shape else t.nbytes
        yield TensorInfo(name, tuple(shape), t.dtype, numel(shape) * item, t.upcast_from)


def optimizer_listable(inv: Inventory, node: Node) -> tuple[Optional[Node], str]:
    """The node whose optimizer state the user sees for ``node`` (``tensors --component optimizer``, the TUI's
    optimizer node), and a note; None when there is none."""
    if node.role in ("optimizer", "model+optimizer") and lists_tensors(node):
        return node, ""
    rel = classify(node)[1].get("optimizer") or classify(node)[1].get("model+optimizer")
    sub = inv.node(rel) if rel else None
    if sub is not None and lists_tensors(sub):
        return sub, f"the optimizer component {inv.shown(sub.path, slash=sub.is_dir)}"
    return None, ""


def list_optimizer_tensors(node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
    """The optimizer state's entries of ``node``, as stored: a DCP holding model and optimizer gives only the
    entries that are not the model's."""
    fmt = format_of(node)
    if fmt.torch_dcp and node.role == "model+optimizer":
        from .formats.dcp import reader as dcpfmt
        from .formats.dcp.source import model_names

        info = (parsed.get(node, dcpfmt.DcpInfo) if parsed is not None else None) or dcpfmt.read(node.abspath)
        model = set(model_names(info))
        yield from (t for t in info.tensors if t.name not in model)
        return
    if fmt.reference == "torch.load" and not node.is_dir:  # a torch file: the entry its optimizer state is in
        from .formats.torch_save import torchfile
        from .formats.torch_save.optim import find_optimizer_state

        _, where, _ = find_optimizer_state(torchfile.read(node.abspath).obj)
        if where and where != "the file itself":
            head = where.replace("[", ".").replace("]", "") + "."
            yield from (t for t in list_tensors(node, parsed, stored=True) if t.name.startswith(head))
            return
    yield from list_tensors(node, parsed, stored=True)


def _file_as_exported(node: Node, parsed: Optional[Parsed], under: str) -> Iterator[TensorInfo]:
    """A torch file's model entry (Lightning's ``state_dict``, composer's ``state.model``, …) under the names export
    writes: the entry's key dropped, a LightningModule's or ComposerModel's one attribute stripped; the file's
    other entries (optimizer, RNG state) are not the model."""
    from .export.prefix import choose

    head = under + "."
    inside = [t for t in format_of(node).tensors(node, parsed) if t.name.startswith(head)]
    strip = choose(node, [t.name[len(head) :] for t in inside]).strip or ""
    for t in inside:
        name = t.name[len(head) :]
        yield TensorInfo(
            name[len(strip) :] if strip and name.startswith(strip) else name, t.shape, t.dtype, t.nbytes, t.upcast_from
        )
