"""Guided wizards, one module each over the frame in base.py: export (`e`), universal (`u`), resume under
torch FSDP2 (`m`, over the tag-conversion frame in tag.py) and repair (`x`). Each is a
``ModalScreen[<its result> | None]``: a dataclass to run, or None when cancelled. Their CSS is wizards.tcss
(type selectors on Wizard match every subclass)."""

from .base import PlannedWizard, Wizard
from .export import ExportChoice, ExportSource, ExportWizard
from .repair import RepairWizard
from .resume import ResumeWizard
from .tag import TagConversionWizard
from .universal import UniversalWizard

__all__ = [
    "ExportChoice",
    "ExportSource",
    "ExportWizard",
    "PlannedWizard",
    "RepairWizard",
    "ResumeWizard",
    "TagConversionWizard",
    "UniversalWizard",
    "Wizard",
]
