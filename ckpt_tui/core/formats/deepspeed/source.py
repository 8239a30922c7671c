"""The fp32 model of any DeepSpeed tag folder ckpt-tui reads: the layout picks the reader (pipeline, stage 0,
ZeRO-1/2/3 and BF16_Optimizer); each layout is its own module of this package."""

from __future__ import annotations

from ...export.sources import Source
from ...storage import LocationLike, as_path, listdir
from .pipeline import pipeline_source
from .reader import (
    LAYER_RE,
    OPTIM_STATES_RE,
)
from .stage0 import stage0_source
from .zero import deepspeed_source


def tag_source(tag_dir: LocationLike, *, exclude_frozen: bool = False) -> Source:
    """The fp32 model of any DeepSpeed tag folder ckpt-tui reads: pipeline (:func:`pipeline_source`),
    ZeRO stage 0 (:func:`stage0_source`), BF16_Optimizer and ZeRO-1/2/3 (:func:`deepspeed_source`)."""
    tag = as_path(tag_dir)
    if not tag.is_dir():
        raise ValueError(f"{tag} is not a folder")
    names = listdir(tag)
    if any(LAYER_RE.match(n) for n in names):
        return pipeline_source(tag)
    if not any(OPTIM_STATES_RE.match(n) for n in names) and "mp_rank_00_model_states.pt" in names:
        return stage0_source(tag, exclude_frozen=exclude_frozen)
    return deepspeed_source(tag, exclude_frozen=exclude_frozen, bf16_optimizer=True)
