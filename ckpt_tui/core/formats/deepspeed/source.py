"""The fp32 model of any DeepSpeed tag folder ckpt-tui reads: the layout picks the reader (pipeline, stage 0,
ZeRO-1/2/3 and BF16_Optimizer); each layout is its own module of this package."""

from __future__ import annotations

from pathlib import Path

from ...export.sources import Source
from ...storage import as_path, listdir
from .pipeline import pipeline_source
from .reader import (
    LAYER_RE,
    OPTIM_STATES_RE,
)
from .stage0 import stage0_source
from .zero import deepspeed_source


def tag_source(tag_dir: Path, *, exclude_frozen: bool = False) -> Source:
    """The fp32 model of any DeepSpeed tag folder ckpt-tui reads: pipeline (:func:`pipeline_source`),
    ZeRO stage 0 (:func:`stage0_source`), BF16_Optimizer and ZeRO-1/2/3 (:func:`deepspeed_source`)."""
    tag_dir = as_path(tag_dir)
    if not tag_dir.is_dir():
        raise ValueError(f"{tag_dir} is not a folder")
    names = listdir(tag_dir)
    if any(LAYER_RE.match(n) for n in names):
        return pipeline_source(tag_dir)
    if not any(OPTIM_STATES_RE.match(n) for n in names) and "mp_rank_00_model_states.pt" in names:
        return stage0_source(tag_dir, exclude_frozen=exclude_frozen)
    return deepspeed_source(tag_dir, exclude_frozen=exclude_frozen, bf16_optimizer=True)
