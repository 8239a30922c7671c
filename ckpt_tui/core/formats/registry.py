"""Every format ckpt-tui knows, in detection order: the first file format whose ``classify``
answers names a file; the first folder format whose ``detect`` is true analyses a folder.
:func:`format_of` answers for every node, the pseudo-formats (a plain folder, an unknown or
special file, a leftover, a backup) included; the rest of ckpt-tui asks it, never ``node.format``.
Adding a format: write its package (see ``format.py``) and add an instance here, or
:func:`register` one."""

from __future__ import annotations

from typing import Optional, cast

from ..facts import BackupFacts, DirFacts
from ..names import backed_up_name
from ..types import Node, Parsed
from .dcp.format import DcpFiles, DcpFolder, DcpSafetensorsFolder
from .deepspeed.format import DeepSpeedOptimStatesFiles, DeepSpeedStatesFiles, DeepSpeedTag, DeepSpeedUniversal
from .format import FileFormat, FolderFormat, Format
from .plain.format import Leftover, PlainFiles, PlainFolder, SpecialFile, TextFiles, UnknownFile
from .safetensors.format import HfModelFolder, SafetensorsFiles, SafetensorsIndex
from .torch_save.format import TorchSave
from .verl.format import VerlFolder, VerlRankFiles


class BackupFiles(FileFormat):
    """``.<name>.ckpt-tui-bak``: the original a repair (``ckpt-tui fix``) kept beside the file it rewrote.
    Never read (a backup of a broken file is the broken file, not a finding again); named by what it keeps."""

    formats = {"backup": BackupFacts}

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        return ("backup", "backup") if backed_up_name(name) is not None else None

    def analyze(self, node: Node, parsed: Parsed) -> None:
        orig = backed_up_name(node.name) or ""
        f = cast(BackupFacts, node.facts)
        f["backup_of"] = orig
        hit = next((h for fmt in FILE_FORMATS if fmt is not self and (h := fmt.classify(orig, orig.lower()))), None)
        if hit is not None:
            f["backup_of_format"] = hit[0]


UNKNOWN = UnknownFile()
FORMATS: tuple[Format, ...] = (
    BackupFiles(),
    DcpFiles(),
    DcpFolder(),
    DeepSpeedUniversal(),
    DeepSpeedStatesFiles(),
    DeepSpeedOptimStatesFiles(),
    DeepSpeedTag(),
    DcpSafetensorsFolder(),
    SafetensorsFiles(),
    SafetensorsIndex(),
    HfModelFolder(),
    PlainFiles(),
    VerlRankFiles(),
    VerlFolder(),
    TorchSave(),
    TextFiles(),
    # what the walk names itself, and the default: never detected
    PlainFolder(),
    SpecialFile(),
    Leftover(),
    UNKNOWN,
)

FILE_FORMATS: tuple[FileFormat, ...] = ()
FOLDER_FORMATS: tuple[FolderFormat, ...] = ()
HOLDERS: tuple[Format, ...] = ()  # the formats whose describe_holder describes a folder holding some, in order
_BY_NAME: dict[str, Format] = {}


def _index() -> None:
    global FILE_FORMATS, FOLDER_FORMATS, HOLDERS, _BY_NAME
    FILE_FORMATS = tuple(f for f in FORMATS if isinstance(f, FileFormat))
    FOLDER_FORMATS = tuple(f for f in FORMATS if isinstance(f, FolderFormat))
    HOLDERS = tuple(
        sorted(
            (f for f in FORMATS if type(f).describe_holder is not Format.describe_holder), key=lambda f: f.holder_order
        )
    )
    _BY_NAME = {name: f for f in FORMATS for name in f.formats}


_index()


def register(fmt: Format) -> None:
    """Add ``fmt`` to the formats ckpt-tui knows: detected after every built-in one (before the pseudo-formats),
    answering for the ``node.format`` names in its ``formats``."""
    global FORMATS
    taken = sorted(set(fmt.formats) & set(_BY_NAME))
    if taken:
        raise ValueError(f"{type(fmt).__name__}: format names already registered: {', '.join(taken)}")
    at = FORMATS.index(next(f for f in FORMATS if not isinstance(f, (FileFormat, FolderFormat))))
    FORMATS = FORMATS[:at] + (fmt,) + FORMATS[at:]
    _index()


def classify_file(node: Node) -> Optional[FileFormat]:
    """Set ``node.format`` and ``node.role`` from the file's name; the format that named it, if any."""
    name = node.name
    low = name.lower()
    for fmt in FILE_FORMATS:
        hit = fmt.classify(name, low)
        if hit is not None:
            node.format, node.role = hit
            return fmt
    node.format, node.role = "unknown", "unknown"
    return None


def detect_folder(node: Node) -> Optional[FolderFormat]:
    """The format of a folder whose children are analysed, if any."""
    for fmt in FOLDER_FORMATS:
        if fmt.detect(node):
            return fmt
    return None


def format_of(node: Node) -> Format:
    """The format of ``node``: the one answering for its ``node.format`` (every name a scan gives has one;
    an unknown name is an unknown file's)."""
    return _BY_NAME.get(node.format, UNKNOWN)


def facts_type(name: str, is_dir: bool) -> type:
    """The TypedDict declaring the facts of a node of ``node.format`` ``name`` (a folder left ``unknown`` is a
    plain folder)."""
    if is_dir and name == "unknown":
        return DirFacts
    fmt = _BY_NAME.get(name)
    return fmt.facts_type(name) if fmt is not None else UNKNOWN.facts_type(name)


def facts_by_format() -> dict[str, type]:
    """Every ``node.format`` name a registered format answers for -> the TypedDict declaring its facts."""
    return {name: f.facts_type(name) for f in FORMATS for name in f.formats}


def optimizer_sources() -> str:
    """What ``--component optimizer`` reads, in words: each registered format's ``optimizer``, in registry order
    (the CLI's help and the export's refusals say this one list)."""
    words = list(dict.fromkeys(f.optimizer for f in FORMATS if f.formats and f.optimizer))
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)
