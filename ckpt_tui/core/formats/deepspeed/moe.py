"""DeepSpeed mixture of experts (``deepspeed.moe.layer.MoE``) in a ZeRO-1/2 tag folder.

What DeepSpeed 0.19 writes (``engine._save_moe_checkpoint``, ``utils/groups.py``), with model parallelism 1:

* ``layer_{L}_expert_{E}_mp_rank_00_model_states.pt``: the module weights of expert ``E`` (global id) of the
  ``L``-th MoE layer (``named_modules`` order), keys already global
  (``<module>.deepspeed_moe.experts.deepspeed_experts.{E}.<param>``). ``mp_rank_00_model_states.pt`` holds the
  rest of the module, ``num_experts`` (one count per MoE layer) and rank 0's ``param_shapes``.
* The expert parameters are their own optimizer param group(s) (``moe: True``, ``name: ep_size_K``), each
  partitioned over its expert-DATA-parallel group only: ``partition_count[g]`` is ``world / K``. Rank ``r``
  holds the experts of expert-parallel rank ``ep_rank(r)`` -- its LOCAL experts ``0..num_local-1``, the global
  ones ``ep_rank * num_local + local`` -- as partition ``edp_rank(r)`` of that group. Default topology: the
  expert-parallel groups are consecutive ranks, ``ep_rank = r % K`` and ``edp_rank = r // K``; with
  ``"use_data_before_expert_parallelism": true`` in the config, ``ep_rank = r // (world / K)`` and
  ``edp_rank = r % (world / K)``.
* Every rank's ``param_shapes`` / ``param_slice_mappings`` name its local experts: the names of rank 0's (the
  only ``param_shapes`` saved) are renamed to global ids for each expert-parallel rank.
* ZeRO stage 0 writes ``expp_rank_{K}_mp_rank_00_optim_states.pt`` instead (not read here).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from ...facts import DeepSpeedZeroFacts
from ..unpickle import Stub, name_part

EXPERT_FILE_RE = re.compile(r"^(?:layer_(\d+)_)?expert_(\d+)_mp_rank_(\d+)_model_states\.pt$")
EXPP_OPTIM_RE = re.compile(r"^expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
EXPERT_PARAM_RE = re.compile(r"^(.*deepspeed_moe\.experts\.deepspeed_experts\.)(\d+)(\..+)$")
GROUP_NAME_RE = re.compile(r"^ep_size_(\d+)$")
DATA_BEFORE_EXPERT = "use_data_before_expert_parallelism"  # a top-level ds_config key (runtime/constants.py)


def experts_words(f: DeepSpeedZeroFacts) -> Optional[str]:
    """A mixture of experts' sizes in words: "4 experts, expert-parallel 2" (per MoE layer where they differ)."""
    counts = f.get("num_experts")
    if not counts:
        return None
    n = (
        f"{counts[0]} experts"
        if len(counts) == 1
        else f"{len(counts)} MoE layers of {'/'.join(map(str, counts))} experts"
    )
    ep = f.get("expert_parallel_size")
    return n + (f", expert-parallel {ep}" if ep else "")


def expert_file(layer: int, expert: int, mp: int = 0) -> str:
    return f"layer_{layer}_expert_{expert}_mp_rank_{mp:02d}_model_states.pt"


def num_experts(model_states: Any) -> Optional[list[int]]:
    """The model states' ``num_experts`` (one count per MoE layer), or None where it is not a MoE checkpoint."""
    v = model_states.get("num_experts") if isinstance(model_states, dict) else None
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v:
        return None
    out = [x for x in v if isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 1 << 20]
    return out if len(out) == len(v) else None


def expected_expert_files(counts: list[int]) -> list[str]:
    return [expert_file(layer, e) for layer, n in enumerate(counts) for e in range(n)]


def data_before_expert(model_states: Any) -> bool:
    cfg = model_states.get("ds_config") if isinstance(model_states, dict) else None
    v = cfg.get(DATA_BEFORE_EXPERT) if isinstance(cfg, dict) else None
    return v is True or v == "true"


def group_ep_sizes(param_groups: Any, partition_counts: list[int], world: int) -> list[int]:
    """The expert-parallel size of each param group: 1 for a dense group, ``world / partition_count`` for a
    MoE group (``moe: True``, ``name: ep_size_K``; where the saved param groups say nothing, a group
    partitioned fewer ways than the world is one). Raises ValueError where the counts do not fit."""
    pgs = list(param_groups) if isinstance(param_groups, (list, tuple)) else []
    out = []
    for gi, pc in enumerate(partition_counts):
        pg = pgs[gi] if gi < len(pgs) and isinstance(pgs[gi], dict) else {}
        moe = pg.get("moe") is True or pc != world
        if not moe:
            out.append(1)
            continue
        if pc < 1 or world % pc:
            raise ValueError(f"param group {gi} is partitioned {pc} ways, which does not divide the world of {world}")
        ep = world // pc
        name = pg.get("name")
        name = name.value if isinstance(name, Stub) else name
        m = GROUP_NAME_RE.match(name) if isinstance(name, str) else None
        if m and int(m.group(1)) != ep:
            raise ValueError(
                f"param group {gi} ({name}) is partitioned {pc} ways over {world} ranks: expert-parallel {ep}, "
                f"not {m.group(1)}"
            )
        out.append(ep)
    return out


def ep_rank(rank: int, ep: int, world: int, data_before: bool = False) -> int:
    return rank // (world // ep) if data_before else rank % ep


def edp_ranks(e: int, ep: int, world: int, data_before: bool = False) -> list[int]:
    """The data-parallel ranks of expert-parallel rank ``e``, in the order they partition its expert groups
    (their rank in the expert-data-parallel group)."""
    stride = world // ep
    return list(range(e * stride, (e + 1) * stride)) if data_before else list(range(e, world, ep))


def local_experts(names: Iterable[str]) -> dict[str, int]:
    """How many experts a rank holds of each MoE layer (by the layer's name prefix), from its local names."""
    ids: dict[str, set[int]] = {}
    for n in names:
        m = EXPERT_PARAM_RE.match(n)
        if m:
            ids.setdefault(m.group(1), set()).add(int(m.group(2)))
    for prefix, s in ids.items():
        if s != set(range(len(s))):
            raise ValueError(f"{prefix}*: local expert ids {sorted(s)} are not 0..{len(s) - 1}")
    return {p: len(s) for p, s in ids.items()}


def global_name(name: str, e: int, num_local: dict[str, int]) -> str:
    """A local expert parameter's name on expert-parallel rank ``e``, with its global expert id."""
    m = EXPERT_PARAM_RE.match(name)
    if not m or e == 0:
        return name
    return f"{m.group(1)}{e * num_local[m.group(1)] + int(m.group(2))}{m.group(3)}"


@dataclass
class Part:
    """One flat vector of a param group: the group as a set of ranks partitioned it (a dense group: every
    rank; a MoE group: the ranks of one expert-parallel rank), and its params, with global names, in order."""

    group: int
    ranks: list[int]
    shapes: "OrderedDict[str, tuple[int, ...]]"
    ep_rank: Optional[int] = None  # of a MoE group


def parts(
    group_shapes: list["OrderedDict[str, tuple[int, ...]]"],
    eps: list[int],
    world: int,
    data_before: bool = False,
) -> list[Part]:
    """Every flat vector of a ZeRO-1/2 tag: each dense group once, each MoE group once per expert-parallel rank
    (``group_shapes``: rank 0's param_shapes, local names; ``eps``: :func:`group_ep_sizes`)."""
    if len(eps) != len(group_shapes):
        raise ValueError(f"{len(eps)} partitioned param groups but {len(group_shapes)} groups in param_shapes")
    out: list[Part] = []
    for gi, (shapes, ep) in enumerate(zip(group_shapes, eps)):
        if ep == 1:
            out.append(Part(gi, list(range(world)), shapes))
            continue
        num_local = local_experts(shapes)
        stray = [n for n in shapes if not EXPERT_PARAM_RE.match(n)]
        if stray:
            raise ValueError(f"MoE param group {gi} holds parameters that are not experts: {stray[:3]}")
        for e in range(ep):
            renamed = OrderedDict((global_name(n, e, num_local), s) for n, s in shapes.items())
            out.append(Part(gi, edp_ranks(e, ep, world, data_before), renamed, e))
    return out


def global_shapes(ps: list[Part], n_groups: int) -> list["OrderedDict[str, tuple[int, ...]]"]:
    """Each param group's params with global names (a MoE group: every expert-parallel rank's experts)."""
    out: list["OrderedDict[str, tuple[int, ...]]"] = [OrderedDict() for _ in range(n_groups)]
    for p in ps:
        out[p.group].update(p.shapes)
    return out


def check_experts(shapes: Iterable[str], counts: Optional[list[int]]) -> None:
    """Every expert of every MoE layer is named once: the global ids of each layer are 0..n-1 and the layers'
    counts are the model states' ``num_experts``. Raises ValueError."""
    if counts is None:
        return
    ids: dict[str, set[int]] = {}
    for n in shapes:
        m = EXPERT_PARAM_RE.match(n)
        if m:
            ids.setdefault(m.group(1), set()).add(int(m.group(2)))
    got = sorted(len(s) for s in ids.values())
    gaps = [p for p, s in ids.items() if s != set(range(len(s)))]
    if gaps or got != sorted(counts):
        raise ValueError(
            f"the optimizer partitions name experts {dict((p + '*', len(s)) for p, s in ids.items())} but the "
            f"model states record num_experts={counts}: the expert-parallel layout is not the one read here"
        )


def slice_names(osd: Any, gi: int) -> set[str]:
    """The parameters a rank's ``param_slice_mappings`` place in its partition of group ``gi`` (local names)."""
    maps = osd.get("param_slice_mappings") if isinstance(osd, dict) else None
    if not isinstance(maps, (list, tuple)) or gi >= len(maps) or not isinstance(maps[gi], dict):
        return set()
    return {name_part(k) for k in maps[gi]}
