"""What a format states once, and every question the rest of ckpt-tui asks about a node's format.

The model is torch.distributed.checkpoint's ``StorageReader``: ``validate_checkpoint_id`` says
whether a path is its format, ``read_metadata`` reads what describes it, the planner and
``read_data`` turn that into tensors. Here a :class:`FileFormat` or :class:`FolderFormat`
detects its files or folders, analyses them into facts (headers only), lists their tensors,
opens them as an export source and names the reference loader ``verify`` checks them with.
Parsed headers go to the scan's typed cache (``model.Parsed``), never onto nodes.
``registry.py`` holds every format, in detection order, and ``registry.format_of(node)`` answers
for every node: the pseudo-formats (a plain folder, an unknown file, a special file, a leftover of
a killed run, a backup) are formats too. Nothing outside ``formats/`` compares ``node.format``
with a name (tests/unit/test_format_registry.py): it asks the node's format.

What a format declares (class attributes; the defaults are a format that is none of these):

``formats``
    ``{node.format value: the TypedDict (facts.py) declaring its facts}`` -- the names this format
    answers for. A format that only adds facts (and names a format another one owns) has none.
``reference``, ``file_layout``
    The reference loader's name, as ``verify`` reports it; the layout of a checkpoint that is one
    file of this format (also of a folder holding only that file).
``checkpoint``
    A folder of this format is a checkpoint of its own (a run folder lists it; layout names its framework).
``exportable``
    ``source()`` opens its nodes as the model export (the export wizard's candidates).
``tag``, ``universal``
    DeepSpeed's two kinds of checkpoint folder: a tag folder (``latest`` beside it names one; ``--tag``
    picks one; ``--from-module-states``, ``universal`` and ``--to torch-dcp`` read it) and a universal
    checkpoint (``latest_universal`` names one).
``components_apart``
    Its folders are the separate components (model, optimizer) of a checkpoint holding several
    (HF Trainer/Accelerate FSDP's ``pytorch_model_fsdp_0/`` and ``optimizer_0/``).
``torch_dcp``
    torch.distributed.checkpoint's own layout (what Megatron-Core's torch_dist, torchtitan and Lightning's
    FSDP strategy write): a Megatron ``iter_N/`` of this format is Megatron-Core's, ``meta.pt`` beside
    folders of it is Lightning's.
``files_list_folder``
    Its files (a ``.metadata``, the shards) show the tensors of the folder holding them.
``optimizer``
    What ``--component optimizer`` reads of it, in words (None: nothing), as the CLI help and the
    refusals say it; ``optimizer_with_model``: the model's own node holds that state (a DeepSpeed
    tag, a verl actor folder), else it is a component of its own (a DCP optimizer folder, a torch file).
``shard_index``
    The name of the index that, beside a node of this format, makes it one shard of a model (the index is
    then the export candidate): safetensors' ``model.safetensors.index.json``.
``config_subdir``
    A folder inside its checkpoints holding the model's config and tokenizer (verl's ``huggingface/``).
``from_walk``, ``plain_folder``, ``shown``, ``collapsed``, ``one_line``, ``shard_files``, ``weights_as_saved``
    The walk named the node itself (a special file, a leftover), never classified by name nor
    opened; a folder of no format (what it is comes from what it holds); the format's name is shown
    beside a node in a tree; a folder shown closed in a tree; a universal checkpoint's one line
    (its summary, no parameter count); shard files listed in short; a single file of weights as
    they were saved (its mixed dtypes are worth a note).

What a format answers (methods): ``describe`` (the layout and components of a checkpoint that is
this node), ``describe_holder`` (of a folder holding nodes of this format, tried in ``holder_order``),
``summary_detail`` and ``tree_label`` (its words in the summary and in a tree), ``findings`` (what
diagnose reports about a node of this format), ``reference_for`` and ``loader_files`` (the reference loader's
name, and what verify screens before that loader reads the node), ``optimizer_source`` and ``holds_optimizer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, cast

from ..facts import NodeFacts, TensorFacts
from ..types import Finding, Inventory, Node, Parsed, TensorInfo
from . import FormatError

if TYPE_CHECKING:
    from ..export.sources import Source

Described = tuple[str, dict[str, str]]  # (layout, components: role -> relative path)


class NotExportable(Exception):
    """A node of a known format that cannot be an export source; the message says why and what to
    export instead."""


class Format:
    """What every format states (see the module's docstring for each attribute)."""

    formats: Mapping[str, type] = {}
    reference: Optional[str] = None  # the reference loader's name, as ``verify`` reports it
    file_layout: Optional[str] = None  # the layout of a checkpoint that is one file of this format
    checkpoint: bool = False
    exportable: bool = False
    tag: bool = False
    universal: bool = False
    components_apart: bool = False
    torch_dcp: bool = False
    files_list_folder: bool = False
    optimizer: Optional[str] = None
    optimizer_with_model: bool = False
    config_subdir: Optional[str] = None
    shard_index: Optional[str] = None
    from_walk: bool = False
    plain_folder: bool = False
    shown: bool = True
    collapsed: bool = False
    one_line: bool = False
    shard_files: bool = False
    weights_as_saved: bool = False
    holder_order: int = 100  # describe_holder is asked in this order (lowest first)

    @property
    def lists_tensors(self) -> bool:
        """Does :meth:`tensors` list a node of this format?"""
        return type(self).tensors is not Format.tensors

    def facts_type(self, name: str) -> type:
        """The TypedDict declaring the facts of a node whose ``node.format`` is ``name``."""
        return self.formats.get(name, NodeFacts)

    def describe(self, node: Node) -> Optional[Described]:
        """The layout and components of a checkpoint that is ``node`` (None: this format says nothing).
        By default a file of a format with a ``file_layout`` is that layout, its role its one component."""
        if self.file_layout and not node.is_dir:
            return self.file_layout, {node.role: node.path}
        return None

    def describe_holder(self, node: Node, members: list[Node]) -> Optional[Described]:
        """The layout and components of folder ``node`` holding ``members``, folders of this format."""
        return None

    def summary_detail(self, node: Node) -> str:
        """What the summary adds after the framework for a model component of this format ("" for none)."""
        return ""

    def tree_label(self, node: Node) -> Optional[str]:
        """The words a tree adds to a node's label (e.g. "ZeRO-2"), or None."""
        return None

    def findings(self, inv: Inventory, node: Node) -> list[Finding]:
        """What diagnose reports about ``node`` because of its format (after the findings of every node)."""
        return []

    def reference_for(self, node: Node) -> Optional[str]:
        """The reference loader's name for ``node`` (a DeepSpeed tag's depends on its layout)."""
        return self.reference

    def loader_files(self, node: Node) -> list[Path]:
        """The files :meth:`reference_tensors` reads whose pickles its loader runs: verify screens each first
        (``screen.require``). None where the loader reads no pickle (safetensors)."""
        return []

    def holds_optimizer(self, node: Node) -> bool:
        """Does the model component ``node`` also hold the optimizer state (Lightning FSDP's one DCP)?"""
        return False

    def optimizer_source(
        self,
        node: Node,
        *,
        model_tensors: Optional[list[tuple[str, tuple[int, ...]]]] = None,
        model_what: str = "",
        trust_pickles: bool = False,
    ) -> tuple["Source", dict[str, Any], Optional[list[str]]]:
        """``node``'s optimizer state as an export source: (the source, the config written beside it, the model's
        parameter names in order, or None where ``model_tensors``, the model's (name, shape), gave them).
        Raises FormatError, ValueError."""
        raise NotExportable(f"exporting the optimizer state of {node.format or 'this format'} is not supported")

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
    ) -> "Source":
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


def set_tensor_facts(node: Node, tensors: Iterable[TensorInfo], *, count: bool = True) -> None:
    """param_count, tensor_bytes and dtypes (most frequent first) over ``tensors``, and
    tensor_count unless ``count`` is False (a folder whose count the caller sets otherwise)."""
    listed = list(tensors)
    dtypes: dict[str, int] = {}
    params = 0
    nbytes = 0
    for t in listed:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        params += t.numel
        nbytes += t.nbytes
    f = cast(TensorFacts, node.facts)
    f.update(TensorFacts(param_count=params, tensor_bytes=nbytes, dtypes=sorted(dtypes, key=lambda d: -dtypes[d])))
    if count:
        f["tensor_count"] = len(listed)
