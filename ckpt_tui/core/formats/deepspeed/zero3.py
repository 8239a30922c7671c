"""ZeRO-3: each trainable parameter is ``ceil(numel / world)`` elements at the same offset of every rank's flat groups."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Optional

from ...export.sources import SourceTensor
from .states import Flat, StatesFile, master_groups, merge_ranges


def zero3_params(
    out: "OrderedDict[str, SourceTensor]",
    shapes: list["OrderedDict[str, tuple[int, ...]]"],
    optim: dict[int, StatesFile],
    world: int,
    *,
    groups_of: Optional[Callable[[StatesFile], list[Any]]] = None,
    suffix: str = "",
    what: str = "fp32",
) -> None:
    """ZeRO-3: each param's ``ceil(numel / world)`` slice at the same offset of every rank's flat
    groups (concatenated); ``groups_of``/``suffix`` as for :func:`zero2_params`."""
    groups_of = groups_of or (lambda f: master_groups(f, 3))
    flats = []
    sizes0 = None
    for r in range(world):
        flat = Flat()
        for gi, t in enumerate(groups_of(optim[r])):
            flat.add(optim[r], t, f"{optim[r].path.name} {what} group {gi}")
        sizes = [p[2] for p in flat.parts]
        if sizes0 is None:
            sizes0 = sizes
        elif sizes != sizes0:
            raise ValueError(f"ranks hold differently sized {what} flat groups ({sizes0} vs {sizes})")
        flats.append(flat)
    offset = 0
    merged = OrderedDict((k, v) for g in shapes for k, v in g.items())
    for name, shape in merged.items():
        n = math.prod(shape)
        pn = math.ceil(n / world)
        ranges, left = [], n
        for r in range(world):
            take = min(pn, left)
            if take > 0:
                ranges += flats[r].slice(offset, take)
                left -= take
        out[name + suffix] = SourceTensor(name + suffix, shape, "float32", merge_ranges(ranges))
        offset += pn
    if offset != flats[0].numel:
        raise ValueError(
            f"params consume {offset * world} of {flats[0].numel * world} {what} elements - "
            "param_shapes and the optimizer partitions do not match"
        )
