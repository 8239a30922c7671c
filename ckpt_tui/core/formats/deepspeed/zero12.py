"""ZeRO-1/2: each trainable parameter is a slice of its group's flat fp32 vector, the ranks' partitions back to back."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Optional

from ...export.sources import SourceTensor
from .states import Flat, StatesFile, master_groups, merge_ranges


def zero2_params(
    out: "OrderedDict[str, SourceTensor]",
    shapes: list["OrderedDict[str, tuple[int, ...]]"],
    optim: dict[int, StatesFile],
    world: int,
    osd0: dict[str, Any],
    *,
    groups_of: Optional[Callable[[StatesFile], list[Any]]] = None,
    suffix: str = "",
    what: str = "fp32",
) -> None:
    """ZeRO-1/2: each param's slice of its group's flat vector (the ranks' partitions back to back).
    ``groups_of(file)``: a rank's flat tensor of each group -- the fp32 masters by default, or an
    optimizer state laid out like them (exp_avg, exp_avg_sq); written as ``name + suffix``."""
    groups_of = groups_of or (lambda f: master_groups(f, 2))
    groups_per_rank = [groups_of(optim[r]) for r in range(world)]
    n_groups = len(groups_per_rank[0])
    if any(len(g) != n_groups for g in groups_per_rank) or n_groups != len(shapes):
        raise ValueError(f"{n_groups} {what} param groups but {len(shapes)} groups in param_shapes")
    paddings = osd0.get("param_alignment_paddings")
    align_to = 2 * world
    for gi, group_shapes in enumerate(shapes):
        flat = Flat()
        for r in range(world):
            flat.add(optim[r], groups_per_rank[r][gi], f"{optim[r].path.name} {what} group {gi}")
        pads = None
        if paddings is not None:
            pads = paddings[gi]
            if len(pads) != len(group_shapes):
                raise ValueError(
                    f"expected {len(group_shapes)} parameter alignment paddings for group {gi}, found {len(pads)}"
                )
        offset = 0
        for pi, (name, shape) in enumerate(group_shapes.items()):
            n = math.prod(shape)
            out[name + suffix] = SourceTensor(name + suffix, shape, "float32", merge_ranges(flat.slice(offset, n)))
            offset += n
            if pads is not None:
                offset += int(pads[pi])
        # same sanity check as zero_to_fp32 (both rounded up to 2 * world)
        if align_to * math.ceil(offset / align_to) != align_to * math.ceil(flat.numel / align_to):
            raise ValueError(
                f"group {gi}: params consume {offset} of {flat.numel} {what} elements - "
                "param_shapes and the optimizer partitions do not match"
            )
