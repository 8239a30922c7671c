"""What the conversions (``universal/``, ``torch_dcp/``) do the same way: what their plans hold first
(:class:`TagPlan`) and resolving SRC to the DeepSpeed tag to convert. Their output is a staged output
(``core/staging.py``: the refusals' wording, the staging folder beside OUT, the sources unchanged, the
install), as every writer's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..export.write import ExportError
from ..jsondoc import JsonFields

if TYPE_CHECKING:
    from ..report import Report
    from ..types import Node


@dataclass
class TagPlan(JsonFields):
    """What a conversion's plan says first: SRC as given, the DeepSpeed tag folder it converts, the
    output folder, and the tag's ZeRO stage, ranks, step and the framework that saved it."""

    src: Path
    tag_dir: Path
    out: Path
    stage: int
    world_size: int
    global_step: Optional[int]
    framework: Optional[str]


def resolve_tag(
    src: Path, tag: Optional[str], trust_pickles: bool, error: type[Exception]
) -> tuple[Report, Optional[Node], list[str]]:
    """Inspect ``src`` and take the checkpoint a conversion converts (``tag``: that tag instead of the one
    `latest` names): (report, the node or None where ``src`` holds no model, what was said about the choice)."""
    from ..export.api import resolve
    from ..report import inspect

    rep = inspect(src, trust_pickles=trust_pickles)
    inv = rep.inventory
    node: Optional[Node] = None
    said: list[str] = []
    if inv.layout == "run-folder" or inv.model_node() is not None:
        try:
            node, said = resolve(rep, tag, verb="converting")
        except ExportError as e:
            raise error(str(e)) from None
    return rep, node, said
