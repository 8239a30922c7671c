"""ZeRO-1/2: each trainable parameter is a slice of its group's flat fp32 vector, the ranks' partitions back to back."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Optional

from ...export.sources import SourceTensor
from .moe import Part
from .states import Flat, StatesFile, master_groups, merge_ranges, optimizer_state


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
    parts: Optional[list[Part]] = None,
) -> None:
    """ZeRO-1/2: each param's slice of its group's flat vector (the ranks' partitions back to back).
    ``groups_of(file)``: a rank's flat tensor of each group -- the fp32 masters by default, or an
    optimizer state laid out like them (exp_avg, exp_avg_sq); written as ``name + suffix``.
    ``parts``: the flat vectors where they are not one per group over every rank (MoE: an expert group once
    per expert-parallel rank, over its expert-data-parallel ranks, names global: :func:`.moe.parts`)."""
    groups_of = groups_of or (lambda f: master_groups(f, 2))
    groups_per_rank = {r: groups_of(optim[r]) for r in range(world)}
    n_groups = len(groups_per_rank[0])
    if any(len(g) != n_groups for g in groups_per_rank.values()) or n_groups != len(shapes):
        raise ValueError(f"{n_groups} {what} param groups but {len(shapes)} groups in param_shapes")
    if parts is None:
        parts = [Part(gi, list(range(world)), group_shapes) for gi, group_shapes in enumerate(shapes)]
    for part in parts:
        gi, ranks = part.group, part.ranks
        flat = Flat()
        for r in ranks:
            flat.add(optim[r], groups_per_rank[r][gi], f"{optim[r].path.name} {what} group {gi}")
        # a rank records the paddings of its own flat groups (a MoE group's: of its expert-parallel rank's experts)
        paddings = (osd0 if ranks[0] == 0 else optimizer_state(optim[ranks[0]])).get("param_alignment_paddings")
        pads = None
        if paddings is not None:
            pads = paddings[gi]
            if len(pads) != len(part.shapes):
                raise ValueError(
                    f"expected {len(part.shapes)} parameter alignment paddings for group {gi}, found {len(pads)}"
                )
        offset = 0
        for pi, (name, shape) in enumerate(part.shapes.items()):
            n = math.prod(shape)
            out[name + suffix] = SourceTensor(name + suffix, shape, "float32", merge_ranges(flat.slice(offset, n)))
            offset += n
            if pads is not None:
                offset += int(pads[pi])
        # same sanity check as zero_to_fp32 (both rounded up to 2 * the ranks partitioning the group)
        align_to = 2 * len(ranks)
        if align_to * math.ceil(offset / align_to) != align_to * math.ceil(flat.numel / align_to):
            raise ValueError(
                f"group {gi}: params consume {offset} of {flat.numel} {what} elements - "
                "param_shapes and the optimizer partitions do not match"
            )
