"""The model and the optimizer state of one checkpoint, exported side by side into one folder
(``model.safetensors``… and ``optimizer.safetensors``… + ``optimizer_config.json``): the TUI's
"both".

One staged output (``core/staging.py``) for the two plans: OUT is checked against both plans' sources
and for the space both need, locked itself, and both plans are written and verified into its one
staging folder (their names never collide: ``model*``/config files vs ``optimizer*``), which is then
installed as OUT: OUT appears complete or not at all.
"""

from __future__ import annotations

import time
from typing import Optional

from ..progress import CancelToken, OnProgress
from .plan import ExportPlan
from .write import ExportError, ExportResult, raise_no_space, stage_export, write_plan


def execute_both(
    model: ExportPlan,
    optimizer: ExportPlan,
    *,
    verify: bool = True,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
) -> tuple[ExportResult, ExportResult]:
    """Execute ``model`` and ``optimizer`` (plans with the same ``out``) into that one folder, atomically."""
    out = model.out
    if optimizer.out != out:
        raise ValueError("both plans must write the same folder")
    clash = {f.name for f in model.files} | {n for _, n in model.copies} | {model.index_name}
    theirs = {f.name for f in optimizer.files} | {n for n, _ in optimizer.extra_files} | {optimizer.index_name}
    if clash & theirs:
        raise ExportError(f"the model and optimizer exports would both write {sorted(clash & theirs)[0]}")
    need = model.output_bytes + optimizer.output_bytes + (2 << 20)
    t0 = time.monotonic()
    try:
        with stage_export([model, optimizer], need_bytes=need) as stage:
            rm = write_plan(model, stage, verify=verify, on_progress=on_progress, cancel=cancel)
            rm.seconds = time.monotonic() - t0
            ro = write_plan(optimizer, stage, verify=verify, on_progress=on_progress, cancel=cancel)
            ro.seconds = time.monotonic() - t0 - rm.seconds
            stage.commit()
    except OSError as e:
        raise_no_space(e, model)
        raise
    ro.notes = ro.notes + [f"written beside the model's files in {out.name}/"]
    return rm, ro
