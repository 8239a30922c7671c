"""What diagnose reports about a verl FSDP folder: its rank files."""

from __future__ import annotations

from typing import cast

from ...advice import sibling_hint
from ...facts import (
    VerlFacts,
)
from ...types import Finding, Inventory, Node


def verl_findings(inv: Inventory, n: Node) -> list[Finding]:
    """A verl actor folder: every rank's model/optim/extra_state file of its world size, and one world size."""
    f = cast(VerlFacts, n.facts)
    p = n.path
    out = []
    where = f"`{inv.shown(p, slash=True)}`"
    world = f.get("world_size")
    if f.get("missing_files"):
        miss = f["missing_files"]
        out.append(
            Finding(
                "shard-missing",
                "error",
                p,
                f"{where} lacks {len(miss)} rank file(s) of its world size {world}: {', '.join(miss[:6])}. "
                "Each rank saves its own shard: without every rank's model file the full weights cannot be "
                "rebuilt (verl's model merger fails too). Copy them from the nodes that wrote them, or use an "
                "earlier complete checkpoint." + sibling_hint(inv, n),
            )
        )
    worlds = f.get("rank_file_worlds") or []
    if len(worlds) > 1:
        out.append(
            Finding(
                "world-size-mismatch",
                "error",
                p,
                f"{where} mixes rank files of world sizes {', '.join(map(str, worlds))}: a save from a run "
                "with another number of ranks was left here. verl loads model_world_size_<its world "
                "size>_rank_*.pt; remove the stale files.",
            )
        )
    cw = f.get("config_world_size")
    if cw is not None and world is not None and cw != world:
        out.append(
            Finding(
                "world-size-mismatch",
                "error",
                p,
                f"{where}: fsdp_config.json says world_size {cw} but the rank files are named for world size "
                f"{world}. verl's model merger reads the world size from fsdp_config.json and would look for "
                f"model_world_size_{cw}_rank_*.pt; the config or the files are from another save.",
            )
        )
    return out
