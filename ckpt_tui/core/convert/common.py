"""What the conversions (``universal/``, ``torch_dcp/``) do the same way: what their plans hold first
(:class:`TagPlan`), resolving SRC to the DeepSpeed tag to convert, why an output folder is refused,
and around the write: a private temp folder beside the output, the source unchanged while it ran,
the verified result moved into place. Each raises its own error class (``error``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..export.write import ExportError
from ..fsutil import OutputError, changed, fsync_dir, owned_temp
from ..jsondoc import JsonFields


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


def resolve_tag(src: Path, tag: Optional[str], trust_pickles: bool, error: type):
    """Inspect ``src`` and take the checkpoint a conversion converts (``tag``: that tag instead of the one
    `latest` names): (report, the node or None where ``src`` holds no model, what was said about the choice)."""
    from ..export.api import resolve
    from ..report import inspect

    rep = inspect(src, trust_pickles=trust_pickles)
    inv = rep.inventory
    node, said = None, []
    if inv.layout == "run-folder" or inv.model_node() is not None:
        try:
            node, said = resolve(rep, tag, verb="converting")
        except ExportError as e:
            raise error(str(e)) from None
    return rep, node, said


def output_refusal(e: OutputError, out: Path, source: str, need_why: str = "") -> str:
    """What the output preflight found, said for a conversion; ``source``: what the output may not be
    inside ("the checkpoint …"), ``need_why``: said after the space it needs."""
    if e.kind == "inside-source":
        rel = {"is": "is", "inside": "is inside", "holds": "holds"}[e.relation]
        return f"the output {out} {rel} {source}; the source is never modified: choose --out elsewhere"
    if e.kind in ("not-a-folder", "not-empty"):
        return f"{out} already exists and is not empty; remove it or choose --out"
    if e.kind == "missing":
        return f"{out.parent} does not exist; create it first or choose --out"
    if e.kind == "no-space":
        return f"{out.parent} has {e.free:,} bytes free; the conversion needs about {e.need:,}{need_why}"
    return f"cannot write to {out.parent} (permission denied or read-only); choose --out on a writable filesystem"


def temp_beside(out: Path, prefix: str, error: type) -> Path:
    """A private temp folder beside ``out`` (on its filesystem: the result moves into place by rename),
    holding its owner lock until ``fsutil.remove_temp``; the temp folders of killed runs there are swept
    first (``fsutil.owned_temp``)."""
    try:
        return owned_temp(out.parent, prefix)
    except OSError as e:
        raise error(f"cannot create a temp folder in {out.parent}: {e.strerror or e}") from None


def check_unchanged(before: dict, after: dict, tag_dir: Path, error: type) -> None:
    """The source's files as they were when the conversion began (``fsutil.snapshot``), else refuse the result."""
    if changed(before, after):
        raise error(
            f"files in {tag_dir} changed during the conversion (a job still writing?); "
            "the result was discarded. Convert once the checkpoint is complete"
        )


def move_into_place(inner: Path, out: Path, error: type) -> None:
    """``os.replace`` the verified ``inner`` to ``out`` (an empty folder there is replaced, one that
    appeared meanwhile with files in it is not)."""
    if out.exists():
        if any(out.iterdir()):
            raise error(f"{out} appeared while converting and is not empty; the result was discarded")
        out.rmdir()
    os.replace(inner, out)
    fsync_dir(out.parent, best_effort=True)
