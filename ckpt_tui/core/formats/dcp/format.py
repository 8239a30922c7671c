"""torch.distributed.checkpoint folders: ``.metadata`` (or rank-local ``__{rank}.metadata``) and
``*.distcp``, or DCP written in safetensors format. Analysed from the metadata (which ranks,
which files, model or optimizer by the keys' structure), exported by byte range, checked against
torch's own DCP loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

from ...facts import DcpFacts, JsonFacts, NodeFacts, SafetensorsFacts
from ...names import (
    ACCELERATE_FILE_RE,
    FSDP_MODEL_DIR_RE,
    FSDP_OPTIM_DIR_RE,
    MODEL_FILE_RE,
    OPTIMIZER_KEYS,
    OPTIMIZER_STATE_KEYS,
    TRAINING_STATE_KEYS,
    step_of,
    trainer_written,
)
from ...types import Finding, Inventory, Node, Parsed, TensorInfo, numel
from .. import FormatError, screen
from ..format import Described, FileFormat, FolderFormat, NotExportable, set_tensor_facts
from ..plain.format import MAX_FACT_CHARS
from ..safetensors.header import read_header
from ..torch_save.format import MAX_UNSAFE, fact_text
from . import reader as dcpfmt
from .findings import dcp_findings

if TYPE_CHECKING:
    from ...export.sources import Source

MAX_CONTAINERS = 64  # top-level containers the `containers` fact lists (`containers_total` counts them all)


class DcpFiles(FileFormat):
    """A DCP folder's files: its ``.metadata`` (or a rank's ``__{rank}.metadata``) and ``*.distcp`` shards."""

    formats = {"dcp-metadata": NodeFacts, "dcp-shard": NodeFacts}

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        if name == ".metadata" or dcpfmt.RANK_META_RE.match(name):
            return "dcp-metadata", "metadata"
        if low.endswith(".distcp"):
            return "dcp-shard", "shard"
        return None


# what torchtitan's CheckpointManager saves beside the model and optimizer; a DCP holding any of them is torchtitan's
TORCHTITAN_ENTRIES = frozenset({"train_state", "dataloader", "lr_scheduler"})


class DcpFolder(FolderFormat):
    formats = {"dcp": DcpFacts}
    reference = "torch.distributed.checkpoint"
    checkpoint = True
    exportable = True
    torch_dcp = True
    components_apart = True
    files_list_folder = True
    collapsed = True
    shard_files = True
    optimizer = (
        "torch DCP optimizer folders (HF Trainer/Accelerate FSDP optimizer_0/, FSDP2 get_state_dict saves, "
        "torchtitan, Lightning FSDP)"
    )
    holder_order = 20

    def describe(self, node: Node) -> Optional[Described]:
        names = {c.name for c in node.children}
        conts = set(cast(DcpFacts, node.facts).get("containers") or [])
        comps = dcp_components(node)
        if node.name.endswith(".ckpt") and "meta.pt" in names:
            return "lightning-fsdp", comps
        parent_meta = node.child("metadata.json")
        if parent_meta is not None and "torch_dist" in str(
            cast(JsonFacts, parent_meta.facts).get("sharded_backend", "")
        ):
            return "megatron-dist", comps
        if cast(DcpFacts, node.facts).get("common_state"):  # megatron-core 0.19's, before its metadata.json (last)
            return "megatron-dist", comps
        if TORCHTITAN_ENTRIES & conts:  # evidence, not a folder name: a plain dcp.save run saves step-N too
            return "torchtitan", comps
        return "dcp", comps  # a folder name alone (pytorch_model_fsdp_0) is no evidence of who wrote it

    def describe_holder(self, node: Node, members: list[Node]) -> Optional[Described]:
        """A folder of DCP components (HF Trainer/Accelerate FSDP: pytorch_model_fsdp_0/ and optimizer_0/), neither
        a run's checkpoints nor beside consolidated weights."""
        names = {c.name for c in node.children}
        has_model_files = any(MODEL_FILE_RE.match(c.name) for c in node.children)
        if any(step_of(c.name) is not None for c in members) or has_model_files:
            return None
        comps = _dcp_folder_components(members)
        if trainer_written(names):
            return "hf-trainer-fsdp", comps
        if any(ACCELERATE_FILE_RE.match(n) for n in names):
            return "accelerate-fsdp", comps
        if node.name.endswith(".ckpt") and "meta.pt" in names:
            return "lightning-fsdp", comps
        return "dcp", comps

    def findings(self, inv: Inventory, node: Node) -> list[Finding]:
        return dcp_findings(inv, node)

    def holds_optimizer(self, node: Node) -> bool:
        from .optim import has_optimizer_state

        try:
            return has_optimizer_state(dcpfmt.read(node.abspath))
        except (FormatError, OSError):
            return False

    def optimizer_source(
        self,
        node: Node,
        *,
        model_tensors: Optional[list[tuple[str, tuple[int, ...]]]] = None,
        model_what: str = "",
        trust_pickles: bool = False,
    ) -> tuple[Source, dict[str, Any], Optional[list[str]]]:
        from .optim import dcp_optimizer_source

        source, config = dcp_optimizer_source(node.abspath, [n for n, _ in model_tensors or []])
        return source, config, None

    def detect(self, node: Node) -> bool:
        return any(
            c.name.endswith(".distcp") or c.name == ".metadata" or dcpfmt.RANK_META_RE.match(c.name)
            for c in node.children
        )

    def analyze(self, node: Node, parsed: Parsed) -> None:
        node.format = "dcp"
        shards = [c.name for c in node.children if c.name.endswith(".distcp")]
        present_ranks = dcpfmt.ranks_of(shards)
        f = cast(DcpFacts, node.facts)
        f.update(DcpFacts(shard_files=len(shards), ranks_present=sorted(present_ranks)))
        try:
            info = dcpfmt.read(node.abspath)
        except FormatError as e:
            if e.kind == "missing":
                f.update(DcpFacts(metadata_missing=True, world_size=len(present_ranks) or None))
                node.role = _role_from_name(node.name) or "unknown"
            else:
                f.update(DcpFacts(error=f".metadata: {e}", error_kind=e.kind))
            return
        except OSError as e:
            f.update(DcpFacts(error=f".metadata: {e.strerror or e}", error_kind="unreadable"))
            return
        if info.unsafe:
            f["unsafe_globals"] = [fact_text(g) for g in sorted(info.unsafe)[:MAX_UNSAFE]]
        f.update(DcpFacts(metadata_files=info.metadata_files, metadata_bytes=info.metadata_bytes))
        if len(info.metadata_files) > 1 or (info.metadata_files and info.metadata_files[0] != ".metadata"):
            f["rank_local_metadata"] = True
        expected_ranks = dcpfmt.ranks_of(info.files)
        # safetensors-format DCP names its files differently; fall back to the number of files
        f["world_size"] = len(expected_ranks) if expected_ranks else None
        missing = [r for r in sorted(info.files) if node.child(r) is None]
        short = []
        for rel, need in sorted(info.files.items()):
            c = node.child(rel)
            if c is not None and c.size < need:
                short.append((rel, c.size, need))
                c.facts.update(
                    NodeFacts(
                        error=f"{c.size} bytes but .metadata places data up to byte {need}: truncated",
                        error_kind="truncated",
                    )
                )
        if missing:
            f["missing_files"] = missing
        if short:
            f["short_files"] = [s[0] for s in short]
        extra = sorted(set(shards) - set(info.files))
        if extra and info.files:
            f["unreferenced_files"] = extra
        if any(n.endswith(".safetensors") for n in info.files):
            f["storage"] = "safetensors"
        role, containers, model_tensors = dcp_role(info)
        node.role = role
        f.update(
            DcpFacts(
                containers=[fact_text(c) for c in containers[:MAX_CONTAINERS]],
                tensor_count=len(info.tensors),
                bytes_entries=len(info.bytes_entries),
            )
        )
        if len(containers) > MAX_CONTAINERS:
            f["containers_total"] = len(containers)
        set_tensor_facts(node, model_tensors, count=False)
        if role == "model+optimizer":  # what export writes of the model (tensors lists them), beside every entry
            from .source import output_tensors

            try:
                f["model_tensor_count"] = len(output_tensors(node.abspath, info))
            except (FormatError, OSError):
                pass
        if role == "optimizer":  # its bytes and dtypes are the optimizer state's; it holds no model params
            set_tensor_facts(node, info.tensors, count=False)
            f["param_count"] = 0
        if info.chunk_dims:
            f["split_dims"] = sorted(info.chunk_dims)
        if info.chunk_gaps:
            f["chunk_gaps"] = info.chunk_gaps[:8]
        if info.chunk_overlaps:
            f["chunk_overlaps"] = info.chunk_overlaps[:8]
        # megatron-core >= 0.19 writes no common.pt: its common state is this entry (written even where the save
        # never got to metadata.json, which comes last): evidence of megatron's save on its own
        common_key = next((k for k in info.bytes_entries if dcpfmt.MEGATRON_COMMON_RE.match(k)), None)
        if common_key is not None:
            f["common_state"] = True
        if common_key is not None or (
            node.child("metadata.json") is not None and dcpfmt.is_megatron_dist(node.abspath)
        ):
            tp = dcpfmt.megatron_tensor_parallel(info)
            if tp:
                f["tensor_parallel"] = tp
            args, unsafe = _megatron_args(node, common_key)
            if unsafe:  # megatron's loader would unpickle it: an unsafe-pickle finding, as for common.pt
                f["unsafe_globals"] = sorted({*(f.get("unsafe_globals") or []), *unsafe})[:MAX_UNSAFE]
            # Megatron-LM's args say the parallel sizes; megatron saves each layer as its own chunk whichever stage
            # holds it, so the chunks tell tensor parallelism (splits of the weights) but not pipeline stages: without
            # args (a plain megatron-core or NeMo save) the pipeline size is unknown (None), never guessed
            f["pipeline_parallel"] = None
            for fact, arg in (
                ("tensor_parallel", "tensor_model_parallel_size"),
                ("pipeline_parallel", "pipeline_model_parallel_size"),
            ):
                v = args.get(arg)
                if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 20:
                    f[fact] = v  # type: ignore[literal-required]
            layers = {n for _, _, n in dcpfmt.megatron_stacked(info).values()}
            if len(layers) == 1:
                f["stacked_layers"] = layers.pop()
            megatron_args_read: Optional[dict[str, Any]] = None if unsafe else args
        else:
            megatron_args_read = None
        if role in ("model", "model+optimizer") and not (missing or short or info.unsafe or info.chunk_gaps):
            offer = _hf_offer(node, info, megatron_args_read)
            if offer is not None:
                f["to_hf"] = offer
        if role in ("optimizer", "model+optimizer") and not missing and not short and not info.unsafe:
            from .optim import params_without_state  # reads the param groups' `params` lists only

            gaps = params_without_state(node.abspath, info)
            if gaps:
                f["optimizer_gaps"] = [fact_text(g) for g in gaps[:16]]
                f["optimizer_gaps_total"] = len(gaps)
        parsed.put(node, info)

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        if hf_shards(node):
            from .hfshards import ShardLayout, read_layout

            lay = (parsed.get(node, ShardLayout) if parsed is not None else None) or read_layout(
                screen.local_path(node.abspath)
            )
            yield from lay.tensor_infos()
            return
        info = (parsed.get(node, dcpfmt.DcpInfo) if parsed is not None else None) or dcpfmt.read(node.abspath)
        yield from info.tensors

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        if hf_shards(node):
            from .hfshards import shards_source

            return shards_source(screen.local_path(node.abspath))
        if cast(DcpFacts, node.facts).get("storage") == "safetensors" and not (node.abspath / ".metadata").exists():
            raise NotExportable("DCP in safetensors format without .metadata and without per-rank shard files")
        from .source import dcp_source

        return dcp_source(node.abspath, strip_prefix=strip_prefix)

    def reference_for(self, node: Node) -> Optional[str]:
        if hf_shards(node):
            return "safetensors (each rank's shard placed at its DCP_SHARDING_INFO offsets)"
        if _safetensors_data_files(node) is not None:
            return "safetensors (the .distcp files are safetensors files)"
        return self.reference

    def loader_files(self, node: Node) -> list[Path]:
        path = screen.local_path(node.abspath)
        if not path.is_dir() or _safetensors_data_files(node) is not None:
            return []  # safetensors' loader reads no pickle
        return screen.dcp_metadata_files(path)

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        """torch's DCP loader, a tensor at a time. Two layouts it cannot read in one process take another
        reference: rank-local metadata only (torch reads rank 0's chunks alone): each rank's metadata in turn,
        into one tensor; data files torch's ``FileSystemWriter(serialization_format=SAFETENSORS)`` wrote (its
        own reader ``torch.load``s them and fails): the safetensors library, each chunk placed at the offsets
        its header's ``DCP_SHARDING_INFO`` gives."""
        import torch

        from .source import load_one, output_tensors, refuse_gaps

        if hf_shards(node):
            from .hfshards import reference_tensors

            yield from reference_tensors(screen.local_path(node.abspath))
            return
        info = dcpfmt.read(node.abspath)
        by_name = {t.name: t for t in info.tensors}
        outputs = output_tensors(node.abspath, info, strip_prefix)
        refuse_gaps(info, {k for k, _, _ in outputs})
        st_files = _safetensors_data_files(node)
        folder = screen.local_path(node.abspath)
        ranks = (
            []
            if st_files is not None or (folder / ".metadata").is_file()
            else sorted(int(m.group(1)) for p in folder.iterdir() if (m := dcpfmt.RANK_META_RE.match(p.name)))
        )

        def whole(key: str) -> Any:
            ti = by_name[key]
            if st_files is not None:
                return _from_safetensors(st_files, key, ti)
            if ranks:
                full = torch.empty(ti.shape, dtype=getattr(torch, ti.dtype))
                for r in ranks:
                    load_one(node.abspath, key, ti, rank=r, into=full)
                return full
            return load_one(node.abspath, key, ti, bool(info.planner_data))

        loaded: dict[str, Any] = {}
        for key, name, layer in outputs:
            if key not in loaded:
                loaded.clear()
                loaded[key] = whole(key)
            yield name, (loaded[key] if layer is None else loaded[key][layer])


def _hf_offer(node: Node, info: dcpfmt.DcpInfo, args: Optional[dict[str, Any]]) -> Optional[str]:
    """``to_hf``: "ready" where ``export --to hf`` converts this DCP as it is, "config" where it would with
    ``--config PATH``, None where it does not apply: from the metadata's names and shapes, never a tensor read.
    ``args``: Megatron-LM's args of a Megatron-Core torch_dist folder (None: not megatron's, or unsafe to read)."""
    from ...export.to_hf import hf_offer, is_megatron_gpt, is_torchtitan_llama
    from .source import model_names, output_tensors

    names = model_names(info)
    if not (is_megatron_gpt(list(names.values())) or is_torchtitan_llama(list(names.values()))):
        return None  # the common case, answered without listing layers
    by = {t.name: t for t in info.tensors}
    try:
        outs = output_tensors(node.abspath, info)
    except (FormatError, OSError):
        return None
    tensors = [
        (name, tuple(by[key].shape if layer is None else by[key].shape[1:]), by[key].dtype)
        for key, name, layer in outs
        if key in by
    ]
    step_dir = node.abspath if isinstance(node.abspath, Path) else None
    return hf_offer(tensors, megatron=args is not None, args=args or {}, step_dir=step_dir)


def megatron_args(node: Node) -> dict[str, Any]:
    """Megatron-LM's ``args`` of a Megatron-Core torch_dist folder (read as data), {} where it has none."""
    try:
        info = dcpfmt.read(node.abspath)
    except (FormatError, OSError):
        return {}
    common_key = next((k for k in info.bytes_entries if dcpfmt.MEGATRON_COMMON_RE.match(k)), None)
    args, unsafe = _megatron_args(node, common_key)
    return {} if unsafe else args


def _megatron_args(node: Node, common_key: Optional[str]) -> tuple[dict[str, Any], list[str]]:
    """Megatron-LM's ``args`` (an argparse Namespace, read as an inert stand-in) from the common state: ``common.pt``
    (megatron-core <= 0.18) or the ``common_state/`` entry inside the DCP (0.19); {} where there are none. And the
    globals outside the allowlist the entry names (megatron's loader would unpickle them)."""
    from ..unpickle import Stub

    obj: Any = None
    try:
        if common_key is not None:
            from .optim import UnsafeObject, read_objects

            try:
                obj = read_objects(screen.local_path(node.abspath), {common_key}).get(common_key)
            except UnsafeObject as e:
                return {}, [fact_text(g) for g in e.globals]
        elif node.child("common.pt") is not None:
            from ..torch_save import torchfile

            tf = torchfile.read(screen.local_path(node.abspath) / "common.pt")
            obj = None if tf.unsafe else tf.obj
    except (FormatError, OSError, ValueError, KeyError, TypeError):
        return {}, []
    if isinstance(obj, list) and len(obj) == 1:  # the ShardedObject's data: [common state dict]
        obj = obj[0]
    args = obj.get("args") if isinstance(obj, dict) else None
    return (dict(args.__dict__) if isinstance(args, Stub) else {}), []


def hf_shards(node: Node) -> bool:
    """A folder torch's ``HuggingFaceStorageWriter(save_distributed=True)`` wrote: per-rank shard files, no
    .metadata."""
    from .hfshards import SHARD_RE

    return (
        cast(DcpFacts, node.facts).get("storage") == "safetensors"
        and isinstance(node.abspath, Path)
        and not (node.abspath / ".metadata").exists()
        and any(SHARD_RE.match(c.name) for c in node.children)
    )


def _safetensors_data_files(node: Node) -> Optional[list[Path]]:
    """The ``*.distcp`` files of a DCP folder written with ``serialization_format=SAFETENSORS`` (each a
    safetensors file whose header metadata holds ``DCP_SHARDING_INFO``), or None for any other DCP."""
    folder = screen.local_path(node.abspath)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".distcp") and p.is_file())
    if not files:
        return None
    for p in files:
        try:
            head = read_header(p)
        except (FormatError, OSError):
            return None
        if "DCP_SHARDING_INFO" not in (head.metadata or {}):
            return None
    return files


def _from_safetensors(files: list[Path], key: str, ti: TensorInfo) -> Any:
    """The whole tensor ``key``: every file's chunk of it (the safetensors library reads it) at its offsets."""
    import torch
    from safetensors import safe_open

    full = torch.empty(ti.shape, dtype=getattr(torch, ti.dtype))
    for p in files:
        head = read_header(p)
        if not any(t.name == key for t in head.tensors):
            continue
        try:
            offsets = json.loads(head.metadata["DCP_SHARDING_INFO"])[key]["saved_offsets"]
        except (ValueError, KeyError, TypeError):
            raise FormatError(f"{p.name}: DCP_SHARDING_INFO gives no saved_offsets for {key!r}") from None
        with safe_open(str(p), framework="pt") as f:
            part = f.get_tensor(key)
        if len(offsets) != part.dim() or any(o + n > s for o, n, s in zip(offsets, part.shape, ti.shape)):
            raise FormatError(f"{p.name}: the chunk of {key!r} at {offsets} does not fit its shape {list(ti.shape)}")
        full[tuple(slice(o, o + n) for o, n in zip(offsets, part.shape))] = part
    return full


class DcpSafetensorsFolder(FolderFormat):
    """DCP written in safetensors format (torch's HuggingFace storage writer) without ``.metadata``:
    one file per rank, each header carrying DCP_SHARDING_INFO. Tensors, export and reference are
    the ``dcp`` format's."""

    def detect(self, node: Node) -> bool:
        """torch's ``HuggingFaceStorageWriter(save_distributed=True)``: per-rank ``shard-…`` files. Its
        ``save_distributed=False`` output (``model-0000X-of-0000N.safetensors`` and an index, each tensor whole) is
        a Hugging Face model folder, whatever the headers' DCP_SHARDING_INFO says."""
        from .hfshards import SHARD_RE

        sts = [c for c in node.children if c.format == "safetensors"]
        return (
            bool(sts)
            and any(SHARD_RE.match(c.name) for c in sts)
            and all("DCP_SHARDING_INFO" in (cast(SafetensorsFacts, c.facts).get("header_metadata") or {}) for c in sts)
        )

    def analyze(self, node: Node, parsed: Parsed) -> None:
        from .hfshards import SHARD_RE, read_layout

        node.format = "dcp"
        node.role = "model"
        sts = [c for c in node.children if c.format == "safetensors"]
        f = cast(DcpFacts, node.facts)
        f.update(DcpFacts(storage="safetensors", shard_files=len(sts)))
        if any(SHARD_RE.match(c.name) for c in sts) and isinstance(node.abspath, Path):
            try:
                lay = read_layout(node.abspath)
            except (FormatError, OSError) as e:
                f["error"] = fact_text(str(e))
                return
            f.update(
                DcpFacts(
                    world_size=max(lay.ranks) + 1,
                    ranks_present=lay.ranks,
                    tensor_count=len(lay.shapes),
                    param_count=sum(numel(s) for s in lay.shapes.values()),
                    tensor_bytes=sum(c.length for cs in lay.chunks.values() for c in cs),
                    containers=[],
                )
            )
            counts: dict[str, int] = {}
            for d in lay.dtypes.values():
                counts[d] = counts.get(d, 0) + 1
            f["dtypes"] = sorted(counts, key=lambda d: -counts[d])
            if lay.missing_ranks:
                f["missing_files"] = [f"shard-{r + 1:05d}-model-…" for r in lay.missing_ranks[:16]]
            gaps = [p for p in lay.problems if not p.startswith("rank(s)")]
            if gaps:
                f["chunk_gaps"] = [fact_text(g) for g in gaps[:8]]
            parsed.put(node, lay)
            return
        f.update(DcpFacts(world_size=len(sts), ranks_present=list(range(len(sts)))))
        names = set()
        dtypes: dict[str, int] = {}
        for c in sts:
            cf = cast(SafetensorsFacts, c.facts)
            try:
                raw = cf["header_metadata"]["DCP_SHARDING_INFO"]
                if len(raw) >= MAX_FACT_CHARS:  # the fact quotes it cut: the header's own value
                    raw = read_header(c.abspath).metadata["DCP_SHARDING_INFO"]
                info = json.loads(raw)
            except (ValueError, TypeError, KeyError, FormatError, OSError):
                info = {}
            names |= set(info)
            for d in cf.get("dtypes") or []:
                dtypes[d] = dtypes.get(d, 0) + 1
        f.update(DcpFacts(tensor_count=len(names), dtypes=sorted(dtypes, key=lambda d: -dtypes[d]), containers=[]))


def dcp_role(info: dcpfmt.DcpInfo) -> tuple[str, list[str], list[TensorInfo]]:
    """Model, optimizer or both — from the keys' structure (planner_data), not the folder name:
    (role, top-level containers most frequent first, the model's tensors)."""

    def top(key: str) -> str:
        path = info.planner_data.get(key)
        return path[0] if path else key.split(".", 1)[0]

    tops: dict[str, int] = {}
    for k in info.keys:
        t = top(k)
        tops[t] = tops.get(t, 0) + 1
    containers = sorted(tops, key=lambda t: -tops[t])
    if set(tops) <= OPTIMIZER_STATE_KEYS and "state" in tops:
        return "optimizer", containers, []
    if set(tops) & OPTIMIZER_KEYS:
        only_opt = set(tops) - OPTIMIZER_KEYS - TRAINING_STATE_KEYS
        if not only_opt:
            return "optimizer", containers, []
        model_t = [t for t in info.tensors if top(t.name) not in OPTIMIZER_KEYS | TRAINING_STATE_KEYS]
        return "model+optimizer", containers, model_t
    # FSDP2 get_state_dict saved flat: optimizer keys start with state./param_groups.
    model_t = [t for t in info.tensors if top(t.name) not in OPTIMIZER_STATE_KEYS | TRAINING_STATE_KEYS]
    if "state" in tops and model_t:
        return "model+optimizer", containers, model_t
    return "model", containers, model_t


def dcp_components(node: Node) -> dict[str, str]:
    """The components a DCP folder is, by its role."""
    role = node.role
    if role == "model+optimizer":
        return {"model": node.path, "optimizer": node.path}
    if role in ("model", "optimizer"):
        return {role: node.path}
    return {}


def _dcp_folder_components(dcps: list[Node]) -> dict[str, str]:
    """Components of a folder holding several DCP folders: a DCP holding only the model (or only the
    optimizer) is that component before one holding both (FSDP2's ``dcp.save({"model": ..., "optimizer":
    ...})``), which still exports when named as SRC. Ties go by name."""
    comps: dict[str, str] = {}
    for c in sorted(dcps, key=lambda c: (c.role == "model+optimizer", c.name)):
        for role, p in dcp_components(c).items():
            comps.setdefault(role, p)
    return comps


def merges_with_accelerate(node: Node) -> bool:
    """Does ``accelerate merge-weights`` work on this DCP folder? It loads the whole state dict, unwraps
    it only if it has a single top-level key, and saves what is left as safetensors: that takes a
    model-only DCP whose tensors sit under one container (``{"model": ...}``) or all at the top level.
    A DCP also holding the optimizer (or anything else) fails ("Key `model` is invalid")."""
    f = cast(DcpFacts, node.facts)
    if node.format != "dcp" or node.role != "model" or f.get("error_kind") or f.get("metadata_missing"):
        return False
    if f.get("storage") == "safetensors" or f.get("bytes_entries"):
        return False
    n = f.get("containers_total") or len(f.get("containers") or [])
    return n == 1 or n == f.get("tensor_count")


def _role_from_name(name: str) -> Optional[str]:
    if FSDP_MODEL_DIR_RE.match(name):
        return "model"
    if FSDP_OPTIM_DIR_RE.match(name):
        return "optimizer"
    return None
