"""Every format ckpt-tui knows, in detection order: the first file format whose ``classify``
answers names a file; the first folder format whose ``detect`` is true analyses a folder.
Adding a format: write its module (see ``format.py``) and add an instance here."""

from __future__ import annotations

from typing import Optional, cast

from ..facts import BackupFacts
from ..names import backed_up_name
from ..types import Node, Parsed
from .dcp.format import DcpFiles, DcpFolder, DcpSafetensorsFolder
from .deepspeed.format import DeepSpeedOptimStatesFiles, DeepSpeedStatesFiles, DeepSpeedTag, DeepSpeedUniversal
from .format import FileFormat, FolderFormat, Format
from .plain.format import PlainFiles, TextFiles
from .safetensors.format import HfModelFolder, SafetensorsFiles
from .torch_save.format import TorchSave
from .verl.format import VerlFolder, VerlRankFiles


class BackupFiles(FileFormat):
    """``.<name>.ckpt-tui-bak``: the original a repair (``ckpt-tui fix``) kept beside the file it rewrote.
    Never read (a backup of a broken file is the broken file, not a finding again); named by what it keeps."""

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        return ("backup", "backup") if backed_up_name(name) is not None else None

    def analyze(self, node: Node, parsed: Parsed) -> None:
        orig = backed_up_name(node.name) or ""
        f = cast(BackupFacts, node.facts)
        f["backup_of"] = orig
        hit = next((h for fmt in FILE_FORMATS if fmt is not self and (h := fmt.classify(orig, orig.lower()))), None)
        if hit is not None:
            f["backup_of_format"] = hit[0]


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
    HfModelFolder(),
    PlainFiles(),
    VerlRankFiles(),
    VerlFolder(),
    TorchSave(),
    TextFiles(),
)

FILE_FORMATS = tuple(f for f in FORMATS if isinstance(f, FileFormat))
FOLDER_FORMATS = tuple(f for f in FORMATS if isinstance(f, FolderFormat))
_BY_NAME = {name: f for f in FORMATS for name in f.formats}


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


def format_of(node: Node) -> Optional[Format]:
    """The format that lists, exports and checks a node of this ``node.format``, if any."""
    return _BY_NAME.get(node.format)
