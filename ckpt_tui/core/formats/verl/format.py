"""verl's FSDP actor/critic folders (``global_step_N/actor/``), written by ``FSDPCheckpointManager.save_checkpoint``:
``model_world_size_W_rank_R.pt``, ``optim_world_size_W_rank_R.pt``, ``extra_state_world_size_W_rank_R.pt`` (torch.save
of each rank's sharded state dict, optimizer state dict, and scheduler + RNG), ``fsdp_config.json``
(``{"FSDP_version", "world_size"}``) and ``huggingface/`` (config + tokenizer). The rank files hold DTensors (FSDP2,
or FSDP1 given a mesh) or ShardedTensors (FSDP1): read through the restricted unpickler, no process group needed.
Exported by byte range from every rank (``verl.source``); verl's own merger is
``python -m verl.model_merger merge --backend fsdp``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

from ...facts import VerlFacts
from ...types import Finding, Inventory, Node, Parsed, TensorInfo
from .. import FormatError
from ..format import Described, FolderFormat, NotExportable, set_tensor_facts
from ..torch_save import torchfile
from ..torch_save.format import TorchSave
from .findings import verl_findings

if TYPE_CHECKING:
    from ...export.sources import Source

_FILE_ROLES = {"model": "model-shard", "optim": "optimizer-shard", "extra_state": "extra-state"}


def _components(node: Node) -> dict[str, str]:
    return {"model": node.path, "optimizer": node.path} if node.role == "model+optimizer" else {"model": node.path}


class VerlRankFiles(TorchSave):
    """A verl rank file: a torch.save file (analysed as one) whose role says it is one rank's part."""

    formats: dict[str, type] = {}  # it names torch-zip, TorchSave's

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        from .source import RANK_FILE_RE

        m = RANK_FILE_RE.match(name)
        return ("torch-zip", _FILE_ROLES[m.group(1)]) if m else None


class VerlFolder(FolderFormat):
    formats = {"verl-fsdp": VerlFacts}
    reference = "verl.model_merger"
    checkpoint = True
    exportable = True
    optimizer = "verl FSDP actor folders"
    optimizer_with_model = True
    config_subdir = "huggingface"  # verl keeps the config and tokenizer in huggingface/ beside its rank files
    holder_order = 10

    def describe(self, node: Node) -> Optional[Described]:
        return "verl-fsdp", _components(node)

    def describe_holder(self, node: Node, members: list[Node]) -> Optional[Described]:
        """global_step_N/ holding actor/ (and critic/): the actor is the model."""
        first = sorted(members, key=lambda c: (c.name != "actor", c.name))[0]
        return "verl-fsdp", _components(first)

    def summary_detail(self, node: Node) -> str:
        vf = cast(VerlFacts, node.facts)
        kind = vf.get("sharded_as")
        version = vf.get("fsdp_version") or (2 if kind == "DTensor" else 1 if kind == "ShardedTensor" else None)
        return f", FSDP{version or '?'} ({kind or 'unread'}) rank files"

    def findings(self, inv: Inventory, node: Node) -> list[Finding]:
        return verl_findings(inv, node)

    def loader_files(self, node: Node) -> list[Path]:
        from ..screen import local_path

        path = local_path(node.abspath)
        return sorted(p for p in path.iterdir() if p.name.endswith(".pt") and p.is_file())

    def optimizer_source(
        self,
        node: Node,
        *,
        model_tensors: Optional[list[tuple[str, tuple[int, ...]]]] = None,
        model_what: str = "",
        trust_pickles: bool = False,
    ) -> tuple[Source, dict[str, Any], Optional[list[str]]]:
        from .source import verl_optimizer_source

        return verl_optimizer_source(node.abspath, trust_pickles=trust_pickles)

    def detect(self, node: Node) -> bool:
        return any(c.role == "model-shard" and c.name.startswith("model_world_size_") for c in node.children)

    def analyze(self, node: Node, parsed: Parsed) -> None:
        from .source import KINDS, RANK_FILE_RE, fsdp_kind

        node.format = "verl-fsdp"
        f = cast(VerlFacts, node.facts)
        files: dict[str, set[tuple[int, int]]] = {}  # kind -> {(world size, rank)}
        for c in node.children:
            m = RANK_FILE_RE.match(c.name)
            if m:
                files.setdefault(m.group(1), set()).add((int(m.group(2)), int(m.group(3))))
        worlds = sorted({w for d in files.values() for w, _ in d})
        cfg = node.child("fsdp_config.json")
        if cfg is not None:
            try:
                doc = json.loads(cfg.abspath.read_bytes().decode())  # a Location: a RemotePath has no read_text
                if isinstance(doc, dict):
                    if isinstance(doc.get("FSDP_version"), int):
                        f["fsdp_version"] = doc["FSDP_version"]
                    if isinstance(doc.get("world_size"), int):
                        f["config_world_size"] = doc["world_size"]
            except (OSError, ValueError):
                pass
        # the world size: fsdp_config.json's where rank files of it are here (stale files of another beside
        # them), else the largest the names carry
        world = f.get("config_world_size") if f.get("config_world_size") in worlds else max(worlds, default=None)
        f["world_size"] = world
        f.update(
            VerlFacts(ranks_present=sorted(r for w, r in files.get("model", ()) if w == world), rank_file_worlds=worlds)
        )
        if world:
            missing = [
                f"{k}_world_size_{world}_rank_{r}.pt"
                for k in KINDS
                if k in files
                for r in range(world)
                if (world, r) not in files[k]
            ]
            if missing:
                f["missing_files"] = missing
        node.role = "model+optimizer" if files.get("optim") else "model"
        hf = node.child("huggingface")
        if hf is not None and hf.is_dir:
            f["hf_config"] = hf.child("config.json") is not None
            f["tokenizer"] = any(hf.child(n) is not None for n in ("tokenizer.json", "tokenizer_config.json"))
        r0 = node.child(f"model_world_size_{world}_rank_0.pt") if world else None
        if r0 is None or r0.facts.get("error"):
            return
        obj = torchfile.read(r0.abspath).obj
        kind = fsdp_kind(obj)
        if kind:
            f["sharded_as"] = kind
        tensors = list(_global_tensors(obj))
        set_tensor_facts(node, tensors)

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        from .source import world_of

        world = world_of(node.abspath)
        yield from _global_tensors(torchfile.read(node.abspath / f"model_world_size_{world}_rank_0.pt").obj)

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        from .source import verl_source

        try:
            return verl_source(node.abspath, strip_prefix=strip_prefix, trust_pickles=trust_pickles)
        except FormatError as e:
            if e.kind == "missing":
                raise NotExportable(str(e)) from None
            raise

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        """verl's merger's own reading (``FSDPModelMerger``): ``torch.load`` every rank's model file (unrestricted:
        only after the safety screen) and ``torch.cat`` the DTensors' local tensors along their Shard dim.
        torch loads ShardedTensors only inside a process group of the saving size: FSDP1 files have none here."""
        import torch

        from ..screen import torch_load
        from .source import world_of

        f = cast(VerlFacts, node.facts)
        if f.get("sharded_as") == "ShardedTensor":
            raise NotExportable(
                "no reference loader for verl FSDP1 rank files: torch loads ShardedTensors only "
                "inside a process group of the saving size (and verl's merger cannot read them)"
            )
        import logging

        from torch.distributed.tensor import DTensor

        world = world_of(node.abspath)
        mesh_log = logging.getLogger("torch.distributed.device_mesh")  # "unpickling of the DeviceMesh ... before
        level = mesh_log.level  # the PGs were created": true and harmless here, not the user's concern
        mesh_log.setLevel(logging.ERROR)
        try:
            sds = [
                torch_load(node.abspath / f"model_world_size_{world}_rank_{r}.pt", map_location="cpu", mmap=True)
                for r in range(world)
            ]
        finally:
            mesh_log.setLevel(level)
        for name in sds[0]:
            parts = [sd[name] for sd in sds]
            if isinstance(parts[0], DTensor):
                (pl,) = parts[0].placements
                t = torch.cat([p._local_tensor for p in parts], dim=pl.dim) if pl.is_shard() else parts[0]._local_tensor
            else:
                t = parts[0]
            yield (name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name), t


def _global_tensors(obj: Any) -> Iterator[TensorInfo]:
    from ..unpickle import DTensorRef, ShardedTensorRef, TensorRef

    for k, v in obj.items() if isinstance(obj, dict) else ():
        if isinstance(v, (DTensorRef, ShardedTensorRef, TensorRef)):
            yield TensorInfo(str(k), tuple(v.shape), v.dtype, v.nbytes)
