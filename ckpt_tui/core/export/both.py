"""The model and the optimizer state of one checkpoint, exported side by side into one folder
(``model.safetensors``… and ``optimizer.safetensors``… + ``optimizer_config.json``): the TUI's
"both".

:func:`.write.execute` owns its output folder: it writes a temp folder and renames it into place,
refusing a non-empty one, so a second export cannot add to the first's folder. Here each plan is
executed (written, verified) into a hidden staging folder beside OUT, the optimizer's files are
moved into the model's staging folder (their names never collide: ``model*``/config files vs
``optimizer*``), and that folder is renamed to OUT: OUT appears complete or not at all.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Optional

from ..fsutil import OutputError, fsync_dir, preflight_output
from ..progress import OnProgress
from .plan import ExportPlan
from .write import (
    ExportError,
    ExportResult,
    OutputLock,
    check_out_vs_sources,
    execute,
    preflight,
    refusal,
    sweep_beside,
)


def execute_both(
    model: ExportPlan,
    optimizer: ExportPlan,
    *,
    verify: bool = True,
    on_progress: Optional[OnProgress] = None,
    cancel=None,
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
    for plan in (model, optimizer):  # OUT is neither's source, holds none and lies in none
        try:
            check_out_vs_sources(plan)
        except OutputError as e:
            raise ExportError(refusal(e, plan)) from None
    try:
        preflight_output(out, need=need)
    except OutputError as e:
        preflight(model, False)  # says why, as a single export would
        from ..units import naturalsize

        raise ExportError(
            f"{out}: {e.kind} (the model and optimizer exports together need {naturalsize(need)})"
        ) from None
    pid = os.getpid()
    stage_m = out.parent / f".{out.name}.model-{pid}"
    stage_o = out.parent / f".{out.name}.optimizer-{pid}"
    lock = OutputLock(out)  # held throughout: the staging folders beside OUT are ours alone
    lock.acquire()
    try:
        sweep_beside(out)  # what killed runs into OUT left (their staging folders too)
        rm = execute(dataclasses.replace(model, out=stage_m), verify=verify, on_progress=on_progress, cancel=cancel)
        ro = execute(dataclasses.replace(optimizer, out=stage_o), verify=verify, on_progress=on_progress, cancel=cancel)
        for f in sorted(stage_o.iterdir()):
            os.replace(f, stage_m / f.name)
        fsync_dir(stage_m)
        if out.exists():
            if any(out.iterdir()):
                raise ExportError(f"{out} appeared and is not empty; nothing was replaced")
            out.rmdir()
        os.replace(stage_m, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(stage_m, ignore_errors=True)
        shutil.rmtree(stage_o, ignore_errors=True)
        lock.release()
    rm.out = ro.out = out
    ro.notes = ro.notes + [f"written beside the model's files in {out.name}/"]
    return rm, ro
