"""path -> Inventory: which folder is the model, which the optimizer, what framework wrote it.

Two passes over the tree. ``walk`` lists files and folders (names and sizes only) and
reports each node as it is found, so a viewer can draw a huge tree at once; ``analyze``
then reads headers and metadata (never tensor data), post-order, and reports each node
again when its facts are in.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .formats import FormatError
from .formats import dcp as dcpfmt
from .formats import deepspeed as dsfmt
from .formats import safetensors_header as stfmt
from .formats import torchfile
from .formats.pickles import iter_tensors
from .humanize_bytes import naturalsize
from .model import Inventory, Node, TensorInfo, numel
from .progress import Cancelled, OnProgress, check_cancel, report

MAX_DEPTH = 24
MAX_ENTRIES = 1_000_000
MAX_TEXT_BYTES = 4096
MAX_JSON_BYTES = 16 * 1024 * 1024
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


class ScanError(Exception):
    """The path itself cannot be scanned (missing, unreadable): exit code 2."""


@dataclass(frozen=True)
class ScanEvent:
    kind: str  # "found" | "analyzed"
    node: Node


OnNode = Callable[[ScanEvent], None]

CKPT_DIR_RE = re.compile(r"^(checkpoint-(\d+)|global_step(\d+)|step-(\d+)|iter_(\d+)|epoch=\d+-step=(\d+)\.ckpt|.*step=(\d+).*\.ckpt)$")
FSDP_MODEL_DIR_RE = re.compile(r"^pytorch_model_fsdp_(\d+)$")
FSDP_OPTIM_DIR_RE = re.compile(r"^optimizer_(\d+)$")
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "vocab.txt", "spiece.model", "chat_template.jinja"}


def step_of(name: str) -> Optional[int]:
    m = CKPT_DIR_RE.match(name)
    if not m:
        return None
    for g in m.groups()[1:]:
        if g is not None:
            return int(g)
    return None


def short_dtype(d: str) -> str:
    return SHORT_DTYPE.get(d, d)


# ---------------------------------------------------------------- walk

def walk(path: Path, on_node: Optional[OnNode] = None, cancel=None) -> Node:
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ScanError(f"{path}: no such file or folder") from None
    except PermissionError:
        raise ScanError(f"{path}: permission denied") from None
    except OSError as e:
        raise ScanError(f"{path}: cannot be read ({e.strerror or e})") from None
    root = Node(".", path.resolve() if path.is_dir() else path.absolute(), stat.S_ISDIR(st.st_mode))
    if not root.is_dir and not stat.S_ISREG(st.st_mode):
        raise ScanError(f"{path}: not a regular file or folder (a FIFO, socket or device) — not a checkpoint")
    if not root.is_dir:
        root.size = st.st_size
        _emit(on_node, "found", root)
        return root
    if not os.access(path, os.R_OK | os.X_OK):
        raise ScanError(f"{path}: permission denied (cannot list the folder)")
    seen = {(st.st_dev, st.st_ino)}
    counter = [0]
    _walk_dir(root, 0, seen, counter, on_node, cancel)
    return root


def _emit(on_node, kind, node):
    if on_node is not None:
        on_node(ScanEvent(kind, node))


def _walk_dir(node: Node, depth: int, seen: set, counter: list, on_node, cancel) -> None:
    _emit(on_node, "found", node)
    check_cancel(cancel)
    if depth >= MAX_DEPTH:
        node.facts["error"] = f"nested more than {MAX_DEPTH} levels deep; not descended"
        node.facts["error_kind"] = "too-deep"
        return
    try:
        entries = sorted(os.scandir(node.abspath), key=lambda e: e.name)
    except PermissionError:
        node.facts["error"] = "permission denied: the folder cannot be listed"
        node.facts["error_kind"] = "permission"
        return
    except OSError as e:
        node.facts["error"] = f"cannot list: {e.strerror or e}"
        node.facts["error_kind"] = "unreadable"
        return
    total = 0
    for e in entries:
        counter[0] += 1
        if counter[0] > MAX_ENTRIES:
            node.facts["error"] = f"more than {MAX_ENTRIES} entries; the rest were not scanned"
            node.facts["error_kind"] = "too-many"
            break
        name = e.name
        rel = name if node.path == "." else f"{node.path}/{name}"
        child_path = Path(e.path)
        try:
            lst = e.stat(follow_symlinks=False)
        except OSError:
            continue
        is_link = stat.S_ISLNK(lst.st_mode)
        try:
            st = e.stat(follow_symlinks=True) if is_link else lst
        except OSError:
            child = Node(rel, child_path, False, format="special", role="unknown")
            child.facts.update(symlink=True, error="broken symbolic link", error_kind="broken-link")
            node.children.append(child)
            _emit(on_node, "found", child)
            continue
        if stat.S_ISDIR(st.st_mode):
            child = Node(rel, child_path, True, format="dir")
            if is_link:
                child.facts["symlink"] = True
            key = (st.st_dev, st.st_ino)
            node.children.append(child)
            if key in seen:
                child.facts["error"] = "symbolic link loop: this folder was already scanned"
                child.facts["error_kind"] = "loop"
                _emit(on_node, "found", child)
                continue
            seen.add(key)
            _walk_dir(child, depth + 1, seen, counter, on_node, cancel)
            total += child.size
        elif stat.S_ISREG(st.st_mode):
            child = Node(rel, child_path, False, size=st.st_size)
            if is_link:
                child.facts["symlink"] = True
            node.children.append(child)
            total += st.st_size
            _emit(on_node, "found", child)
        else:
            child = Node(rel, child_path, False, format="special", role="unknown")
            child.facts["special"] = "fifo" if stat.S_ISFIFO(st.st_mode) else "device or socket"
            node.children.append(child)
            _emit(on_node, "found", child)
    node.size = total


# ---------------------------------------------------------------- files

def _classify_file(node: Node) -> None:
    name = node.name
    low = name.lower()
    fmt, role = "unknown", "unknown"
    if name == ".metadata" or dcpfmt.RANK_META_RE.match(name):
        fmt, role = "dcp-metadata", "metadata"
    elif low.endswith(".distcp"):
        fmt, role = "dcp-shard", "shard"
    elif dsfmt.MODEL_STATES_RE.match(name) or dsfmt.LAYER_RE.match(name):
        fmt, role = "deepspeed-model-states", "model"
    elif dsfmt.OPTIM_STATES_RE.match(name):
        fmt, role = "deepspeed-optim-states", "optimizer"
    elif low.endswith(".safetensors.index.json") or low.endswith(".bin.index.json"):
        fmt, role = "safetensors-sharded-index" if ".safetensors." in low else "json", "model"
    elif low.endswith(".safetensors"):
        fmt = "safetensors"
        role = "optimizer" if "optimizer" in low else "model"
    elif name in ("latest", "latest_universal", "latest_checkpointed_iteration.txt"):
        fmt, role = "text", "marker"
    elif name == "trainer_state.json":
        fmt, role = "json", "trainer-state"
    elif name in TOKENIZER_FILES or low.startswith("tokenizer"):
        fmt, role = ("json" if low.endswith(".json") else "text"), "tokenizer"
    elif low.endswith(".json"):
        fmt = "json"
        role = "config" if ("config" in low or name == "metadata.json") else "unknown"
        if name == "metadata.json":
            role = "metadata"
    elif low.endswith(".py"):
        fmt, role = "python", "script"
    elif name == "training_args.bin":
        fmt, role = "torch-zip", "training-args"
    elif low.startswith("rng_state") or low.startswith("random_states"):
        fmt, role = "torch-zip", "rng"
    elif low.startswith("scheduler") or low.startswith("lr_scheduler"):
        fmt, role = "torch-zip", "scheduler"
    elif low.startswith("sampler") or low.startswith("dataloader"):
        fmt, role = "torch-zip", "data-loader"
    elif low.startswith("scaler"):
        fmt, role = "torch-zip", "scaler"
    elif low.startswith("optimizer"):
        fmt, role = "torch-zip", "optimizer"
    elif name == "model_optim_rng.pt":
        fmt, role = "torch-zip", "model+optimizer"
    elif name == "meta.pt":
        fmt, role = "torch-zip", "metadata"
    elif low.endswith((".pt", ".pth", ".bin", ".ckpt", ".pkl")):
        fmt = "torch-zip"
        role = "model+optimizer" if low.endswith(".ckpt") else "model"
    elif low.endswith((".txt", ".md", ".yaml", ".yml", ".log")):
        fmt = "text"
    node.format, node.role = fmt, role


def _analyze_file(node: Node) -> None:
    if node.format == "special":
        return
    if node.role == "unknown" and node.format == "unknown":
        return
    path = node.abspath
    if not os.access(path, os.R_OK):
        node.facts["error"] = "permission denied: the file cannot be read"
        node.facts["error_kind"] = "permission"
        return
    try:
        if node.format == "torch-zip":
            _torch_facts(node)
        elif node.format in ("deepspeed-optim-states", "deepspeed-model-states"):
            pass  # read once per tag folder (rank 0) by _ds_tag; the other ranks get a zip check
        elif node.format == "safetensors":
            h = stfmt.read_header(path)
            _tensor_facts(node, h.tensors)
            if h.metadata:
                node.facts["header_metadata"] = dict(list(h.metadata.items())[:8])
        elif node.format == "safetensors-sharded-index" or (node.format == "json" and node.name.endswith(".bin.index.json")):
            doc = stfmt.read_index(path)
            wm = doc["weight_map"]
            node.facts["tensor_count"] = len(wm)
            node.facts["shard_files"] = sorted({str(v) for v in wm.values()})
            ts = (doc.get("metadata") or {}).get("total_size") if isinstance(doc.get("metadata"), dict) else None
            if ts is not None:
                node.facts["total_size"] = ts
        elif node.format == "text":
            if node.role == "marker":
                node.facts["names"] = _read_text(path).strip()
        elif node.format == "json":
            _json_facts(node)
    except FormatError as e:
        node.facts["error"] = str(e)
        node.facts["error_kind"] = e.kind
    except PermissionError:
        node.facts["error"] = "permission denied: the file cannot be read"
        node.facts["error_kind"] = "permission"
    except OSError as e:
        node.facts["error"] = f"cannot read: {e.strerror or e}"
        node.facts["error_kind"] = "unreadable"
    except (RecursionError, MemoryError):
        node.facts["error"] = "structure too deep or too large to read safely"
        node.facts["error_kind"] = "corrupt"
    except Exception as e:  # a value of the wrong type somewhere in a damaged file: a finding, never a crash
        node.facts["error"] = f"malformed content ({type(e).__name__}: {e})"
        node.facts["error_kind"] = "corrupt"


def _read_text(path: Path) -> str:
    with open(path, "rb") as f:
        raw = f.read(MAX_TEXT_BYTES)
    return raw.decode("utf-8", errors="replace")


def _json_facts(node: Node) -> None:
    if node.size > MAX_JSON_BYTES:
        node.facts["error"] = f"JSON file larger than {naturalsize(MAX_JSON_BYTES)}; not read"
        node.facts["error_kind"] = "too-large"
        return
    try:
        doc = json.loads(node.abspath.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        node.facts["error"] = f"not valid JSON: {e}"
        node.facts["error_kind"] = "corrupt"
        return
    if not isinstance(doc, dict):
        return
    if node.role == "trainer-state":
        for k in ("global_step", "epoch", "max_steps", "best_model_checkpoint"):
            if doc.get(k) is not None:
                node.facts[k] = doc[k]
    elif node.name == "config.json":
        for k in ("model_type", "architectures", "torch_dtype", "dtype", "tie_word_embeddings"):
            if doc.get(k) is not None:
                node.facts[k] = doc[k]
    elif node.name == "adapter_config.json":
        node.facts["peft_type"] = doc.get("peft_type")
        node.role = "config"
    elif node.name == "metadata.json":
        for k in ("sharded_backend", "sharded_backend_version", "common_backend"):
            if k in doc:
                node.facts[k] = doc[k]


def _tensor_facts(node: Node, tensors) -> None:
    """tensor_count and the sums over ``tensors`` (a file: all it holds)."""
    tensors = list(tensors)
    _tensor_facts_subset(node, tensors)
    node.facts["tensor_count"] = len(tensors)


def _torch_facts(node: Node) -> None:
    tf = torchfile.read(node.abspath)
    if tf.unsafe:
        node.facts["unsafe_globals"] = sorted(tf.unsafe)
    node.facts["pickle"] = "zip" if tf.is_zip else "legacy"
    obj = tf.obj
    if node.format == "deepspeed-model-states":
        node._obj = obj  # type: ignore[attr-defined]  # kept for the tag folder's analysis
        return
    if isinstance(obj, dict):
        node.facts["keys"] = [str(k) for k in list(obj.keys())[:12]]
        sd = obj
        for wrapper in ("state_dict", "module", "model"):
            if isinstance(obj.get(wrapper), dict) and any(True for _ in iter_tensors(obj[wrapper])):
                sd = obj[wrapper]
                node.facts["weights_under"] = wrapper
                break
        tensors = list(iter_tensors(sd))
        if tensors:

            _tensor_facts(node, [TensorInfo(n, t.shape, t.dtype, t.nbytes) for n, t in tensors])
            # tied weights: two names viewing one storage
            by_storage: dict[tuple, list[str]] = {}
            for n, t in tensors:
                if t.storage is not None:
                    by_storage.setdefault((t.storage.key, t.offset, t.shape), []).append(n)
            tied = [v for v in by_storage.values() if len(v) > 1]
            if tied:
                node.facts["tied"] = tied[:16]
        for k in ("global_step", "iteration", "epoch"):
            if isinstance(obj.get(k), int):
                node.facts[k] = obj[k]
        if "optimizer_states" in obj or "optimizer" in obj:
            if tensors and node.role == "model":
                node.role = "model+optimizer"
        if node.role == "model" and "state" in obj and "param_groups" in obj:
            node.role = "optimizer"
    elif obj is not None:
        node.facts["object"] = getattr(obj, "_qualname", type(obj).__name__)


# ---------------------------------------------------------------- folders

def _analyze_dir(node: Node) -> None:
    names = [c.name for c in node.children]
    nameset = set(names)
    if any(n.endswith(".distcp") for n in names) or ".metadata" in nameset or any(dcpfmt.RANK_META_RE.match(n) for n in names):
        _dcp_dir(node)
    elif "zero" in nameset and node.child("zero").is_dir and _is_universal_zero(node.child("zero")):
        _universal_dir(node)
    elif dsfmt.is_tag_dir(names):
        _ds_tag(node)
    elif _is_dcp_safetensors(node):
        _dcp_safetensors_dir(node)
    elif any(n.endswith(".safetensors") for n in names):
        _hf_model_dir(node)


def _dcp_dir(node: Node) -> None:
    node.format = "dcp"
    shards = [c.name for c in node.children if c.name.endswith(".distcp")]
    f = node.facts
    f["shard_files"] = len(shards)
    present_ranks = dcpfmt.ranks_of(shards)
    f["ranks_present"] = sorted(present_ranks)
    try:
        info = dcpfmt.read(node.abspath)
    except FormatError as e:
        if e.kind == "missing":
            f["metadata_missing"] = True
            f["world_size"] = len(present_ranks) or None
            node.role = _role_from_name(node.name) or "unknown"
        else:
            f["error"] = f".metadata: {e}"
            f["error_kind"] = e.kind
        return
    except OSError as e:
        f["error"] = f".metadata: {e.strerror or e}"
        f["error_kind"] = "unreadable"
        return
    if info.unsafe:
        f["unsafe_globals"] = sorted(info.unsafe)
    f["metadata_files"] = info.metadata_files
    f["metadata_bytes"] = info.metadata_bytes
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
            c.facts["error"] = f"{c.size} bytes but .metadata places data up to byte {need}: truncated"
            c.facts["error_kind"] = "truncated"
    if missing:
        f["missing_files"] = missing
    if short:
        f["short_files"] = [s[0] for s in short]
    extra = sorted(set(shards) - set(info.files))
    if extra and info.files:
        f["unreferenced_files"] = extra
    if any(n.endswith(".safetensors") for n in info.files):
        f["storage"] = "safetensors"
    role, containers, model_tensors = _dcp_role(info)
    node.role = role
    f["containers"] = containers
    f["tensor_count"] = len(info.tensors)
    f["bytes_entries"] = len(info.bytes_entries)
    _tensor_facts_subset(node, model_tensors)
    if info.chunk_dims:
        f["split_dims"] = sorted(info.chunk_dims)
    node._dcp = info  # type: ignore[attr-defined]


def _is_dcp_safetensors(node: Node) -> bool:
    sts = [c for c in node.children if c.format == "safetensors"]
    return bool(sts) and all("DCP_SHARDING_INFO" in (c.facts.get("header_metadata") or {}) for c in sts)


def _dcp_safetensors_dir(node: Node) -> None:
    """DCP written in safetensors format (torch's HuggingFace storage writer): one file per rank,
    each header carrying DCP_SHARDING_INFO."""
    node.format = "dcp"
    node.role = "model"
    sts = [c for c in node.children if c.format == "safetensors"]
    f = node.facts
    f["storage"] = "safetensors"
    f["shard_files"] = len(sts)
    f["world_size"] = len(sts)
    f["ranks_present"] = list(range(len(sts)))
    names = set()
    dtypes: dict[str, int] = {}
    for c in sts:
        try:
            info = json.loads(c.facts["header_metadata"]["DCP_SHARDING_INFO"])
        except (ValueError, TypeError):
            info = {}
        names |= set(info)
        for d in c.facts.get("dtypes") or []:
            dtypes[d] = dtypes.get(d, 0) + 1
    f["tensor_count"] = len(names)
    f["dtypes"] = sorted(dtypes, key=lambda d: -dtypes[d])
    f["containers"] = []


def _tensor_facts_subset(node: Node, tensors) -> None:
    """param_count, tensor_bytes and dtypes (most frequent first) over ``tensors`` — for a folder,
    the model's tensors only; its tensor_count is set by the caller."""
    dtypes = {}
    params = 0
    nbytes = 0
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        params += t.numel
        nbytes += t.nbytes
    node.facts["param_count"] = params
    node.facts["tensor_bytes"] = nbytes
    node.facts["dtypes"] = sorted(dtypes, key=lambda d: -dtypes[d])


OPTIM_TOP = {"optimizer", "optim", "optimizers", "optimizer_states"}
OTHER_TOP = {"lr_scheduler", "dataloader", "train_state", "scheduler", "rng", "rng_state", "step", "epoch",
             "global_step", "extra_state", "args", "checkpoint_version", "iteration"}


def _dcp_role(info: dcpfmt.DcpInfo) -> tuple[str, list[str], list]:
    """Model, optimizer or both — from the keys' structure (planner_data), not the folder name."""
    def top(key: str) -> str:
        path = info.planner_data.get(key)
        return path[0] if path else key.split(".", 1)[0]

    tops: dict[str, int] = {}
    for k in info.keys:
        t = top(k)
        tops[t] = tops.get(t, 0) + 1
    containers = sorted(tops, key=lambda t: -tops[t])
    if set(tops) <= {"state", "param_groups"} and "state" in tops:
        return "optimizer", containers, []
    if set(tops) & OPTIM_TOP:
        only_opt = set(tops) - OPTIM_TOP - OTHER_TOP
        if not only_opt:
            return "optimizer", containers, []
        model_t = [t for t in info.tensors if top(t.name) not in OPTIM_TOP | OTHER_TOP]
        return "model+optimizer", containers, model_t
    # FSDP2 get_state_dict saved flat: optimizer keys start with state./param_groups.
    model_t = [t for t in info.tensors if top(t.name) not in {"state", "param_groups"} | OTHER_TOP]
    if "state" in tops and model_t:
        return "model+optimizer", containers, model_t
    return "model", containers, model_t


def _role_from_name(name: str) -> Optional[str]:
    if FSDP_MODEL_DIR_RE.match(name):
        return "model"
    if FSDP_OPTIM_DIR_RE.match(name):
        return "optimizer"
    return None


def _ds_tag(node: Node) -> None:
    names = [c.name for c in node.children]
    tf = dsfmt.classify_files(names)
    node.format = "deepspeed-zero"
    node.role = "model+optimizer"
    f = node.facts
    ms_name = tf.model_files.get((-1, 0)) or tf.model_files.get((0, 0))
    obj = None
    if ms_name:
        c = node.child(ms_name)
        if "error" not in c.facts:
            try:
                _torch_facts(c)
            except FormatError as e:
                c.facts["error"] = str(e)
                c.facts["error_kind"] = e.kind
            except OSError as e:
                c.facts["error"] = f"cannot read: {e.strerror or e}"
                c.facts["error_kind"] = "permission" if isinstance(e, PermissionError) else "unreadable"
            obj = getattr(c, "_obj", None)
    if obj is not None:
        dsfmt.analyze_model_states(obj, tf)
    opt_name = tf.optim_files.get((0, 0)) or (next(iter(tf.optim_files.values())) if tf.optim_files else None)
    if opt_name:
        oc = node.child(opt_name)
        try:
            otf = torchfile.read(oc.abspath)
            if otf.unsafe:
                oc.facts["unsafe_globals"] = sorted(otf.unsafe)
            dsfmt.analyze_optim_states(otf.obj, tf)
        except FormatError as e:
            oc.facts["error"] = str(e)
            oc.facts["error_kind"] = e.kind
        except OSError as e:
            oc.facts["error"] = f"cannot read: {e.strerror or e}"
            oc.facts["error_kind"] = "permission" if isinstance(e, PermissionError) else "unreadable"
    # integrity of every rank file: the zip directory must be there
    for fname in list(tf.optim_files.values()) + list(tf.model_files.values()):
        c = node.child(fname)
        if fname in (ms_name, opt_name) or "error" in c.facts:
            continue
        _zip_check(c)
    f.update(tf.facts)
    stage = f.get("zero_stage")
    if stage is None:
        stage = 3 if any(k[0] >= 0 for k in tf.model_files) else None
        if stage is not None:
            f["zero_stage"] = stage
    f["optim_prefix"] = tf.optim_prefix
    dp_present = sorted({k[0] for k in tf.optim_files})
    f["ranks_present"] = dp_present
    ws = f.get("dp_world_size")
    mp = f.get("mp_world_size") or 1
    f["world_size"] = ws
    expected_optim = [(r, m) for r in range(ws or 0) for m in range(mp)] if ws else []
    missing = [f"{tf.optim_prefix}zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt"
               for (r, m) in expected_optim if (r, m) not in tf.optim_files]
    if stage == 3 and ws:
        missing += [f"zero_pp_rank_{r}_mp_rank_{m:02d}_model_states.pt"
                    for r in range(ws) for m in range(mp) if (r, m) not in tf.model_files]
    elif ws:
        missing += [f"mp_rank_{m:02d}_model_states.pt" for m in range(mp) if (-1, m) not in tf.model_files]
    if missing:
        f["missing_files"] = missing
    extra = [tf.optim_files[k] for k in sorted(tf.optim_files) if ws and k[0] >= ws]
    if extra:
        f["extra_rank_files"] = extra
    pc = f.get("partition_count")
    if ws and isinstance(pc, int) and pc != ws:
        f["partition_mismatch"] = pc
    ts = dsfmt.tensors(tf)
    _tensor_facts_subset(node, ts)
    f["tensor_count"] = len(ts)
    f["params_trainable"] = sum(numel(s) for s in tf.param_shapes.values())
    if tf.frozen_shapes:
        f["frozen_params"] = sorted(tf.frozen_shapes)
    elif f.get("module_params") and f["module_params"] > f["params_trainable"] and stage in (1, 2):
        # ZeRO-1 saves no frozen_param_shapes: frozen weights show only in the module
        f["frozen_params_unrecorded"] = f["module_params"] - f["params_trainable"]
    if tf.module_dtypes:
        f["module_dtypes"] = sorted(tf.module_dtypes)
    if tf.layer_files:
        f["pipeline"] = True
    node._ds = tf  # type: ignore[attr-defined]


def _zip_check(c: Node) -> None:
    import zipfile

    try:
        with zipfile.ZipFile(c.abspath) as zf:
            size = c.size
            for i in zf.infolist():
                if i.header_offset + 30 + len(i.filename) + i.compress_size > size:
                    raise FormatError(f"entry {i.filename} runs past the end of the file: truncated", "truncated")
    except zipfile.BadZipFile:
        c.facts["error"] = ("zip archive without its central directory: the file was cut short, "
                            "most likely by an interrupted save")
        c.facts["error_kind"] = "truncated" if c.size > 0 else "truncated"
    except FormatError as e:
        c.facts["error"] = str(e)
        c.facts["error_kind"] = e.kind
    except PermissionError:
        c.facts["error"] = "permission denied: the file cannot be read"
        c.facts["error_kind"] = "permission"
    except OSError as e:
        c.facts["error"] = f"cannot read: {e.strerror or e}"
        c.facts["error_kind"] = "unreadable"
    except Exception as e:  # zipfile raises NotImplementedError, ValueError... on a corrupt directory
        c.facts["error"] = f"corrupt zip directory: {type(e).__name__}: {e}"
        c.facts["error_kind"] = "corrupt"


def _is_universal_zero(zero: Node) -> bool:
    return any(c.is_dir and c.child("fp32.pt") is not None for c in zero.children[:64]) or \
        zero.child("optimizer_state.pt") is not None


def _universal_dir(node: Node) -> None:
    node.format = "deepspeed-universal"
    node.role = "model+optimizer"
    zero = node.child("zero")
    params = [c for c in zero.children if c.is_dir]
    f = node.facts
    f["param_folders"] = len(params)
    f["with_optimizer_state"] = sum(1 for p in params if p.child("exp_avg.pt") is not None)
    f["fp32_only"] = sorted(p.name for p in params if p.child("exp_avg.pt") is None)[:32]
    ms = [c.name for c in node.children if dsfmt.MODEL_STATES_RE.match(c.name)]
    f["model_state_files"] = len(ms)
    for p in params:
        if p.child("fp32.pt") is None:
            f.setdefault("incomplete_params", []).append(p.name)
    for c in params:
        c.role = "model"
        c.format = "dir"


def _hf_model_dir(node: Node) -> None:
    names = {c.name for c in node.children}
    idx = [c for c in node.children if c.name.endswith(".safetensors.index.json")]
    f = node.facts
    if idx:
        ic = idx[0]
        wm_files = ic.facts.get("shard_files") or []
        shards = [c for c in node.children if c.name in set(wm_files) and "param_count" in c.facts]
        if shards:
            ic.facts["param_count"] = sum(c.facts["param_count"] for c in shards)
            ic.facts["tensor_bytes"] = sum(c.facts.get("tensor_bytes", 0) for c in shards)
            dts: list = []
            for c in shards:
                dts += [d for d in c.facts.get("dtypes", []) if d not in dts]
            ic.facts["dtypes"] = dts
        missing = [x for x in wm_files if x not in names]
        if missing:
            f["index_missing_files"] = missing
        try:
            doc = stfmt.read_index(ic.abspath)
            wm = doc["weight_map"]
            have: dict[str, str] = {}
            for c in node.children:
                if c.name.endswith(".safetensors") and "error" not in c.facts:
                    for t in stfmt.read_header(c.abspath).tensors:
                        have[t.name] = c.name
            wrong = [k for k, v in wm.items() if v not in missing and have.get(k) != v]
            unlisted = [k for k in have if k not in wm]
            bad_path = [v for v in set(wm.values()) if "/" in str(v) or str(v).startswith("..")]
            if wrong:
                f["index_missing_tensors"] = wrong[:32]
            if unlisted:
                f["index_unlisted_tensors"] = unlisted[:32]
            if bad_path:
                f["index_outside"] = sorted(bad_path)[:8]
        except (FormatError, OSError):
            pass


# ---------------------------------------------------------------- inventory

def scan(path, *, on_node: Optional[OnNode] = None, on_progress: Optional[OnProgress] = None, cancel=None,
         trust_pickles: bool = False) -> Inventory:
    """Scan ``path`` (a folder or a single file). Raises ScanError if the path itself is unusable."""
    root = walk(Path(path), on_node, cancel)
    nodes = list(root.walk())
    total_files = sum(1 for n in nodes if not n.is_dir)
    done = [0]

    def visit(n: Node) -> None:
        check_cancel(cancel)
        if n.is_dir:
            for c in n.children:
                visit(c)
            if "error_kind" not in n.facts or n.facts.get("error_kind") in ("too-many",):
                try:
                    _analyze_dir(n)
                except Cancelled:
                    raise
                except (RecursionError, MemoryError):
                    n.facts["error"] = "metadata too deep or too large to read safely"
                    n.facts["error_kind"] = "corrupt"
                except Exception as e:  # malformed metadata (wrong types, missing fields): a finding
                    n.facts["error"] = f"malformed metadata ({type(e).__name__}: {e})"
                    n.facts["error_kind"] = "corrupt"
        else:
            if n.format == "unknown" and n.role == "unknown":
                _classify_file(n)
            if "error" not in n.facts:
                _analyze_file(n)
            done[0] += 1
            report(on_progress, done[0], total_files, "files", n.path)
        _emit(on_node, "analyzed", n)

    for n in nodes:
        if not n.is_dir and n.format != "special":
            _classify_file(n)
    visit(root)
    from .layout import describe

    return describe(root, trust_pickles)
