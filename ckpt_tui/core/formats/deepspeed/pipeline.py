"""Pipeline-parallel tags: ``layer_NN-model_states.pt`` files, one per layer, named as the model's modules."""

from __future__ import annotations

import re
from typing import cast

from ...dtypes import short_dtype
from ...export.sources import Source, SourceTensor
from ...storage import Location, LocationLike, as_path, listdir
from ..unpickle import iter_tensors
from .reader import (
    LAYER_INDEX_RE,
    LAYER_RE,
    layer_name,
)
from .states import MOE_RE, StatesFile, config_train_dtype, ref_ranges


def pipeline_layers(tag_dir: Location) -> list[tuple[str, StatesFile]]:
    names = sorted(listdir(tag_dir))
    layers = [n for n in names if LAYER_RE.match(n)]
    by_index: dict[int, list[str]] = {}
    for n in layers:
        index = cast("re.Match[str]", LAYER_INDEX_RE.match(n))  # a layer file's name: LAYER_RE matched it
        by_index.setdefault(int(index.group(1)), []).append(n)
    if any(len(v) > 1 for v in by_index.values()):
        raise ValueError(
            "pipeline layers split by tensor parallelism (layer_XX-model_YY-model_states.pt) are not "
            "supported: each layer must be one file"
        )
    if any(MOE_RE.search(n) for n in names):
        raise ValueError("MoE checkpoints (expert_*/expp_rank_* files) are not supported")
    return [(by_index[i][0], StatesFile(tag_dir / by_index[i][0])) for i in sorted(by_index)]


def pipeline_source(tag_dir: LocationLike) -> Source:
    """A pipeline-parallel tag (``PipelineModule``): each ``layer_XX-model_states.pt`` holds one layer's
    ``state_dict``; merged, named as the PipelineModule names them (``<layer index>.<key>``, e.g.
    ``3.weight``). Written as stored: with fp32 training these are the masters; with bf16/fp16 the
    training-dtype weights (the masters stay in the stages' optimizer states; said in a note)."""
    tag = as_path(tag_dir)
    out: list[SourceTensor] = []
    for fname, f in pipeline_layers(tag):
        if not isinstance(f.obj, dict):
            raise ValueError(f"{fname} holds no state_dict")
        first_by_view: dict[tuple[object, ...], str] = {}
        for key, t in iter_tensors(f.obj):
            name = layer_name(fname, key)
            if t.storage is None:
                raise ValueError(f"{fname}: {key} has no storage (a tensor subclass?)")
            view = (t.storage.key, t.offset, tuple(t.shape), t.stride)
            tied = first_by_view.setdefault(view, name)
            out.append(
                SourceTensor(
                    name, tuple(t.shape), t.dtype, ref_ranges(f, t, name), tied_to=tied if tied != name else None
                )
            )
    if not out:
        raise ValueError(f"no tensors in the layer files of {tag.name}")
    train = None
    ms = tag / "mp_rank_00_model_states.pt"
    if ms.is_file():
        m0 = StatesFile(ms).obj
        train = config_train_dtype(m0) if isinstance(m0, dict) else None
    notes = [
        "pipeline parallel: the layer_XX-model_states.pt files merged; names as DeepSpeed's PipelineModule "
        "names them, <layer index>.<parameter> (e.g. 0.weight)"
    ]
    if train in ("bfloat16", "float16"):
        notes.append(
            f"HALF PRECISION ({short_dtype(train)}): the layer files hold the training-dtype weights; the "
            "fp32 masters stay in the stages' optimizer states and are not written"
        )
    else:
        notes.append("fp32 training: the layer weights are the masters (no separate fp32 copy)")
    return Source("deepspeed", tag, out, train_dtype=train, notes=notes)
