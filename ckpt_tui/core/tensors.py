"""A per-tensor listing of any component (name, shape, dtype, bytes), lazily, from headers only."""

from __future__ import annotations

from typing import Iterator, Optional

from .formats.registry import format_of
from .types import MODEL_ROLES, Node, Parsed, TensorInfo


def list_tensors(node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
    """Yield the tensors a node holds, as its headers describe them (``parsed``: the scan's cache,
    ``Inventory.parsed``, so headers already read are not read again). A folder of no format lists
    the weights files in it. Raises FormatError on a broken file."""
    fmt = format_of(node)
    if fmt is not None:
        yield from fmt.tensors(node, parsed)
    elif node.is_dir:
        for c in node.children:
            if c.role in MODEL_ROLES and c.format != "dir":
                yield from list_tensors(c, parsed)
