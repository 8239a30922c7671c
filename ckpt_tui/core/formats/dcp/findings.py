"""What diagnose reports about a DCP folder: its metadata, its shards, Megatron's files beside it."""

from __future__ import annotations

import re
from typing import cast

from ...advice import export_command, ranks_text, sibling_hint
from ...facts import (
    DcpFacts,
)
from ...types import Finding, Inventory, Node


def dcp_findings(inv: Inventory, n: Node) -> list[Finding]:
    f = cast(DcpFacts, n.facts)
    p = n.path
    out = []
    if f.get("metadata_missing"):
        ranks = f.get("ranks_present") or []
        tmp = n.child(".metadata.tmp") is not None
        cmd = f"ckpt-tui fix {inv.shown(p)} --only dcp-metadata" if tmp else None
        out.append(
            Finding(
                "dcp-metadata-missing",
                "error",
                p,
                f"`{inv.shown(p, slash=True)}` has {f.get('shard_files', 0)} .distcp shard file(s) (ranks "
                f"{ranks_text(ranks)}) but no .metadata: the save was interrupted before rank 0 wrote it (or "
                ".metadata exists only on another node's disk). Nothing can load this folder; copy .metadata "
                "from the node that wrote it, or use an earlier complete checkpoint."
                + sibling_hint(inv, n)
                + (
                    f" A complete .metadata.tmp may survive (the final rename was interrupted): `{cmd}`." if tmp else ""
                ),
                "dcp-metadata" if tmp else None,
                cmd,
            )
        )
    hf_shards = f.get("storage") == "safetensors" and n.child(".metadata") is None
    if f.get("missing_files") and hf_shards:  # HuggingFaceStorageWriter(save_distributed=True): names, no .metadata
        miss = f["missing_files"]
        present = f.get("ranks_present") or []
        out.append(
            Finding(
                "shard-missing",
                "error",
                p,
                f"`{inv.shown(p, slash=True)}` holds the per-rank shards torch's HuggingFaceStorageWriter"
                f"(save_distributed=True) writes, for ranks {ranks_text(present)}, but {len(miss)} rank(s) in "
                f"between have no file ({', '.join(miss[:6])}): their chunks of every tensor are not here. Copy "
                "them from the nodes that wrote them; without them no tensor can be put together."
                + sibling_hint(inv, n),
            )
        )
    elif f.get("missing_files"):
        miss = f["missing_files"]
        out.append(
            Finding(
                "shard-missing",
                "error",
                p,
                f"`{inv.shown(p + '/.metadata')}` names {len(miss)} file(s) that are not here: {', '.join(miss[:6])}. "
                "Copy them from the nodes that wrote them (each rank writes its own); without them the "
                "tensors they hold cannot be loaded.",
            )
        )
    meta = f"`{inv.shown(p + '/' + ((f.get('metadata_files') or ['.metadata'])[0]))}`"
    if f.get("chunk_gaps") and hf_shards:
        out.append(
            Finding(
                "dcp-chunk-gap",
                "error",
                p,
                f"The per-rank shards in `{inv.shown(p, slash=True)}` do not make whole tensors: "
                + "; ".join(f["chunk_gaps"][:4])
                + ". Their headers' DCP_SHARDING_INFO places the chunks; a rank's file is missing or was rewritten. "
                "Use an earlier complete checkpoint." + sibling_hint(inv, n),
            )
        )
    elif f.get("chunk_gaps"):
        names = ", ".join(f["chunk_gaps"])
        out.append(
            Finding(
                "dcp-chunk-gap",
                "error",
                p,
                f"{meta} gives tensors chunks that leave part of them unwritten ({names}): no file holds "
                "those values, and torch's DCP loader would leave them as whatever memory held. A rank's "
                "chunk records are missing from the metadata; use an earlier complete checkpoint."
                + sibling_hint(inv, n),
            )
        )
    if f.get("chunk_overlaps"):
        names = ", ".join(f["chunk_overlaps"])
        out.append(
            Finding(
                "dcp-chunk-overlap",
                "warning",
                p,
                f"{meta} gives tensors chunks that overlap ({names}): two records hold the same "
                "elements, and which one a load keeps is the loader's order. ckpt-tui exports them as "
                "torch's DCP loader reads them; compare the result with what you expect.",
            )
        )
    lost = megatron_files_missing(inv, n)
    if lost and f.get("common_state"):  # megatron-core >= 0.19: only metadata.json, which its save writes last
        out.append(
            Finding(
                "megatron-files-missing",
                "error",
                p,
                f"`{inv.shown(p, slash=True)}` is a Megatron-Core torch_dist checkpoint (megatron-core 0.19 or "
                "later: its common state is the common_state/ entry inside the DCP) without metadata.json: "
                "megatron writes it last, once every rank's shards and .metadata are written, so without it "
                "the save did not finish (or the file was lost in a copy), and megatron's dist_checkpointing.load "
                'refuses the folder ("is not a distributed checkpoint"). Use an earlier complete checkpoint; '
                "if the save did finish, copy metadata.json from rank 0's node." + sibling_hint(inv, n),
            )
        )
    elif lost:
        them = "it" if len(lost) == 1 else "them"
        out.append(
            Finding(
                "megatron-files-missing",
                "error",
                p,
                f"`{inv.shown(p, slash=True)}` is a Megatron-Core torch_dist checkpoint without "
                f"{' and '.join(lost)}: rank 0 writes {them} beside .metadata, and megatron's "
                "dist_checkpointing.load refuses the folder without "
                f"{them} (metadata.json says it is a distributed checkpoint; common.pt holds the "
                "iteration, the args and every non-tensor state). Copy "
                f"{them} from rank 0's node, or use an earlier complete checkpoint.",
            )
        )
    elif f.get("common_state") and n.child("common.pt") is None:
        broken = f.get("missing_files") or f.get("short_files") or f.get("chunk_gaps")
        export = None if broken else export_command(inv, p)
        out.append(
            Finding(
                "megatron-common-state",
                "info",
                p,
                f"`{inv.shown(p, slash=True)}` is a megatron-core 0.19+ save: its common state (the iteration, the "
                "args, every non-tensor entry) is the common_state/ entry inside the DCP, with no common.pt. "
                "megatron-core 0.18 and older cannot load it: they read the common state from common.pt only "
                '("Common file …/common.pt does not exist"). dist_checkpointing.load of megatron-core 0.19 or '
                "later loads it" + (f"; `{export}` writes its tensors, whole, for any other tool." if export else "."),
                "export" if export else None,
                export,
            )
        )
    offer = f.get("to_hf")
    if offer and not (lost or f.get("missing_files") or f.get("short_files") or f.get("chunk_gaps")):
        out.append(to_hf_finding(inv, n, offer))
    if f.get("unreferenced_files"):
        extra = f["unreferenced_files"]
        out.append(
            Finding(
                "world-size-mismatch",
                "warning",
                p,
                f"`{inv.shown(p, slash=True)}` holds shard files that .metadata does not reference ({', '.join(extra[:6])}): "
                "left over from a save with a different world size. They are ignored on load; remove "
                "them to avoid confusion.",
            )
        )
    return out


def megatron_files_missing(inv: Inventory, n: Node) -> list[str]:
    """The files Megatron-Core's dist_checkpointing.save writes beside a DCP (rank 0 only) that are not there,
    for a DCP folder that megatron wrote: it has one of them, or it is an ``iter_N/`` of a Megatron run."""
    names = {c.name for c in n.children}
    ours = {"metadata.json", "common.pt"} & names
    mcore_json = "metadata.json" in ours and bool(cast(DcpFacts, n.facts).get("tensor_parallel"))
    common_state = bool(cast(DcpFacts, n.facts).get("common_state"))  # 0.19's common state: megatron's on its own
    parent = inv.root.find(n.path.rsplit("/", 1)[0] if "/" in n.path else ".") if n.path != "." else None
    in_run = (
        re.match(r"^iter_\d+$", n.name) is not None
        and parent is not None
        and parent.child("latest_checkpointed_iteration.txt") is not None
    )
    if not (mcore_json or "common.pt" in ours or in_run or common_state):
        return []
    # megatron-core 0.19 keeps the common state inside the DCP (a common_state/… entry) and writes no common.pt;
    # its loader takes common.pt where there is one, else that entry
    needed = ("metadata.json",) if common_state else ("metadata.json", "common.pt")
    return [f for f in needed if f not in names]


def to_hf_command(inv: Inventory, rel: str, *, config: bool = False) -> str:
    """The ``export --to hf`` line for the checkpoint at ``rel`` (``DIR``: the output folder; ``PATH``: the model's
    Hugging Face config.json, where the checkpoint records no configuration)."""
    return f"ckpt-tui export {inv.shown(rel)} --to hf" + (" --config PATH" if config else "") + " --out DIR"


def to_hf_finding(inv: Inventory, n: Node, offer: str) -> Finding:
    """A Llama-family Megatron-Core GPT or torchtitan model: ``export --to hf`` writes it as a Hugging Face model."""
    p = n.path
    megatron = "pipeline_parallel" in n.facts  # written for every folder megatron saved
    what = "a Llama-family Megatron-Core GPT model" if megatron else "a torchtitan Llama model"
    arch = "LlamaForCausalLM, Qwen2ForCausalLM where only q/k/v have biases" if megatron else "LlamaForCausalLM"
    folder = f"a Hugging Face model folder ({arch}: names mapped, fused tensors split, config.json"
    if offer == "ready":
        cmd = to_hf_command(inv, p)
        return Finding(
            "to-hf",
            "info",
            p,
            f"`{inv.shown(p, slash=True)}` is {what}: `{cmd}` writes it as {folder} from the run's own record) "
            "that transformers' AutoModelForCausalLM.from_pretrained loads.",
            "export",
            cmd,
        )
    # not backticked: PATH is the user's file, not a placeholder a command can run with
    return Finding(
        "to-hf",
        "info",
        p,
        f"`{inv.shown(p, slash=True)}` is {what}, and records no model configuration (the heads, the norm's eps, "
        f"rope, which shapes cannot show): given the model's Hugging Face config.json, "
        f"“{to_hf_command(inv, p, config=True)}” writes it as {folder} from that file) that transformers' "
        "AutoModelForCausalLM.from_pretrained loads.",
        "export",
    )
