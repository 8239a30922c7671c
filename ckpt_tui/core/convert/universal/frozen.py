"""Frozen parameters and buffers, which ``load_universal`` does not restore, to a safetensors file
next to the universal checkpoint (the resume instructions say how to load it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from ...fsutil import atomic_path


def export_frozen(
    tag_dir: Union[str, os.PathLike[str]], dest: Union[str, os.PathLike[str]], *, names: Optional[list[str]] = None
) -> dict[str, Any]:
    """Write the frozen parameters and buffers of ``tag_dir`` (as stored: the training dtype) to a
    safetensors file ``dest`` (temp + fsync + ``os.replace``). Returns {name: shape}."""
    from safetensors.torch import save_file

    from ...export.sources import to_torch
    from ...formats.deepspeed.zero import deepspeed_source
    from ...formats.torch_save import torchfile

    tag_dir, dest = Path(tag_dir), Path(dest)
    src = deepspeed_source(tag_dir)
    ms = next(
        (
            p
            for p in (tag_dir / "mp_rank_00_model_states.pt", tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt")
            if p.is_file()
        ),
        None,
    )
    buffers: set[str] = set()
    if ms is not None:
        obj = torchfile.read(ms).obj
        if isinstance(obj, dict):
            buffers = {str(b) for b in (obj.get("buffer_names") or [])}
    tensors = {}
    for t in src.tensors:
        if t.tied_to or not (t.frozen or t.name in buffers):
            continue
        if names is not None and t.name not in names:
            continue
        tensors[t.name] = to_torch(t).contiguous().clone()
    if not tensors:
        return {}
    with atomic_path(dest) as tmp:
        save_file(
            tensors, str(tmp), metadata={"format": "pt", "source": str(tag_dir), "written_by": "ckpt-tui universal"}
        )
    return {k: tuple(v.shape) for k, v in tensors.items()}
