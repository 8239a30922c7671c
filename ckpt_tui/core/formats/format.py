"""What a format module states once.

The model is torch.distributed.checkpoint's ``StorageReader``: ``validate_checkpoint_id`` says
whether a path is its format, ``read_metadata`` reads what describes it, the planner and
``read_data`` turn that into tensors. Here a :class:`FileFormat` or :class:`FolderFormat`
detects its files or folders, analyses them into facts (headers only), lists their tensors,
opens them as an export source and names the reference loader ``verify`` checks them with.
Parsed headers go to the scan's typed cache (``model.Parsed``), never onto nodes.
``registry.py`` holds every format, in detection order.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, cast

from ..facts import TensorFacts
from ..types import Node, Parsed, TensorInfo
from . import FormatError


class NotExportable(Exception):
    """A node of a known format that cannot be an export source; the message says why and what to
    export instead."""


class Format:
    """What every format states. ``formats`` are the ``node.format`` values it answers for
    (tensors, export source, reference loader); a format that only adds facts has none."""

    formats: tuple[str, ...] = ()
    reference: Optional[str] = None  # the reference loader's name, as ``verify`` reports it
    file_layout: Optional[str] = None  # the layout of a checkpoint that is one file of this format

    def analyze(self, node: Node, parsed: Parsed) -> None:
        """Facts from headers and metadata (never tensor data) into ``node.facts``, as ``facts.py``
        declares them for the format. Raises
        FormatError/OSError for a file that cannot be read; the scan turns those into facts."""

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        """The tensors ``node`` holds, as its headers describe them."""
        raise FormatError(f"{node.format} lists no tensors")

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ):
        """``node``'s model weights as an export source (``export.sources.Source``). Raises
        NotExportable, FormatError."""
        raise NotExportable(f"`{node.path}` ({node.format}) is not a format ckpt-tui can export")

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        """(name, torch tensor) from the reference loader, independent of :meth:`source`."""
        raise NotExportable(f"no reference loader for {node.format}")


class FileFormat(Format):
    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        """(format, role) if a file of this name is this format; ``low`` is ``name.lower()``."""
        return None


class FolderFormat(Format):
    def detect(self, node: Node) -> bool:
        """Is this folder (its children walked and analysed) this format?"""
        return False


def set_tensor_facts(node: Node, tensors, *, count: bool = True) -> None:
    """param_count, tensor_bytes and dtypes (most frequent first) over ``tensors``, and
    tensor_count unless ``count`` is False (a folder whose count the caller sets otherwise)."""
    tensors = list(tensors)
    dtypes: dict[str, int] = {}
    params = 0
    nbytes = 0
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        params += t.numel
        nbytes += t.nbytes
    f = cast(TensorFacts, node.facts)
    f.update(TensorFacts(param_count=params, tensor_bytes=nbytes, dtypes=sorted(dtypes, key=lambda d: -dtypes[d])))
    if count:
        f["tensor_count"] = len(tensors)
