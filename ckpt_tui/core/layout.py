"""What a scanned tree is as a whole: its layout, the framework, which part is the model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional, cast

from .dtypes import short_dtype
from .facts import JsonFacts, TensorFacts
from .formats.deepspeed.format import deepspeed_layout as deepspeed_layout  # layout.deepspeed_layout, as before
from .formats.registry import HOLDERS, format_of
from .names import ACCELERATE_FILE_RE as ACCELERATE_FILE_RE  # layout.ACCELERATE_FILE_RE, as before
from .names import HF_CKPT_DIR_RE, step_of, trainer_written
from .names import MODEL_FILE_RE as MODEL_FILE_RE  # layout.MODEL_FILE_RE, as before
from .types import Inventory, Node, Parsed, RunCheckpoint, model_component
from .units import naturalsize, param_count

PRUNE_MARKER = ".ckpt-tui-prune.json"  # core/prune.py's MARKER (prune imports this module's neighbours)

LAYOUTS = (
    "hf-trainer-fsdp",
    "hf-trainer-deepspeed",
    "hf-trainer",
    "accelerate",
    "accelerate-fsdp",
    "accelerate-deepspeed",
    "fsdp-full",
    "fsdp-local",
    "deepspeed",
    "lightning-deepspeed",
    "lightning-fsdp",
    "lightning",
    "dcp",
    "torchtitan",
    "universal",
    "hf-model",
    "megatron-legacy",
    "megatron-dist",
    "run-folder",
    "torch-file",
    "composer",
    "safetensors-file",
    "verl-fsdp",
    "unknown",
)
FRAMEWORK = {
    "hf-trainer-fsdp": "HF Trainer + FSDP (sharded)",
    "hf-trainer-deepspeed": "HF Trainer + DeepSpeed",
    "hf-trainer": "HF Trainer",
    "accelerate": "Accelerate",
    "accelerate-fsdp": "Accelerate + FSDP (sharded)",
    "accelerate-deepspeed": "Accelerate + DeepSpeed",
    "fsdp-full": "FSDP (full state dict)",
    "fsdp-local": "FSDP (local state dict)",
    "deepspeed": "DeepSpeed",
    "lightning-deepspeed": "Lightning + DeepSpeed",
    "lightning-fsdp": "Lightning + FSDP (sharded)",
    "lightning": "Lightning",
    "dcp": "torch.distributed.checkpoint",
    "torchtitan": "torchtitan",
    "universal": "DeepSpeed universal checkpoint",
    "hf-model": "Hugging Face model",
    "megatron-legacy": "Megatron (legacy)",
    "megatron-dist": "Megatron-Core (torch_dist)",
    "run-folder": None,
    "torch-file": "torch.save",
    "composer": "composer",
    "safetensors-file": "safetensors",
    "verl-fsdp": "verl (FSDP)",
    "unknown": None,
}


def classify(node: Node) -> tuple[str, dict[str, str]]:
    """(layout, components: role -> relative path) for a folder or file node."""
    fmt = format_of(node)
    own = fmt.describe(node)  # a checkpoint that is one node of a format (a DCP folder, a tag, a torch file)
    if own is not None:
        return own
    if not node.is_dir:
        return "unknown", {}
    names = {c.name for c in node.children}
    dirs = [c for c in node.children if c.is_dir]
    for holder in HOLDERS:  # a folder holding checkpoints of a format (a DeepSpeed save_dir, verl's global_step_N)
        members = [c for c in dirs if format_of(c) is holder]
        held = holder.describe_holder(node, members) if members else None
        if held is not None:
            return held
    dcp_children = [c for c in dirs if format_of(c).torch_dcp]
    if "pytorch_model_fsdp.bin" in names:
        full = cast(Node, node.child("pytorch_model_fsdp.bin"))  # one of ``names``
        return "fsdp-full", {"model": full.path, **_optim_files(node)}
    local = sorted(c.name for c in node.children if re.match(r"^pytorch_model_fsdp(_\d+)?_rank\d+\.bin$", c.name))
    if local:
        first = cast(Node, node.child(local[0]))  # a child's name
        return "fsdp-local", {"model": first.path, **_optim_files(node)}
    if "latest_checkpointed_iteration.txt" in names or re.match(r"^iter_\d+$", node.name):
        iters = [c for c in dirs if re.match(r"^iter_\d+$", c.name)] or (
            [node] if re.match(r"^iter_\d+$", node.name) else []
        )
        for it in iters:
            if format_of(it).torch_dcp:
                return "megatron-dist", {"model": it.path}
            if any(c.is_dir and c.name.startswith("mp_rank_") for c in it.children):
                mp = next(c for c in it.children if c.is_dir and c.name.startswith("mp_rank_"))
                f = mp.child("model_optim_rng.pt")
                return "megatron-legacy", {"model+optimizer": (f or mp).path}
    if _checkpoint_dirs(node):
        return "run-folder", {}
    saves = [c for c in node.children if COMPOSER_RE.match(c.name) and not c.is_dir and not c.facts.get("symlink")]
    if saves and all(c.facts.get("weights_under") == "state.model" for c in saves):
        # composer's save_folder: ep{epoch}-ba{batch}-rank{r}.pt per save (latest-rank0.pt links the newest)
        newest = max(saves, key=lambda c: (_composer_batch(c.name), c.name))
        return "composer", {newest.role: newest.path}
    model_files = [c for c in node.children if MODEL_FILE_RE.match(c.name)]
    if model_files:
        comps = {"model": _preferred_model_file(model_files).path}
        shards = whole_hf_shards(node, dcp_children)
        if shards is not None:  # HuggingFaceStorageWriter(enable_consolidation): the consolidation did not finish
            comps["model"] = shards.path
        comps.update(_optim_files(node))
        if trainer_written(names):  # a killed save (no trainer_state.json yet) is still the Trainer's
            return "hf-trainer", comps
        if any(n.startswith("random_states") for n in names) or "optimizer.bin" in names:
            return "accelerate", comps
        return "hf-model", comps
    if node.child("meta.pt") and dcp_children:
        return "lightning-fsdp", {}
    # a folder holding a single checkpoint file
    files = [
        c
        for c in node.children
        if not c.is_dir and c.role in ("model", "model+optimizer") and c.facts.get("tensor_count")
    ]
    if len(files) == 1:  # its format describes the folder too (a weights.safetensors: safetensors, not torch.save)
        only = files[0]
        described = format_of(only).describe(only)
        if described is not None:
            return described
        return ("lightning" if only.name.endswith(".ckpt") else "torch-file"), {only.role: only.path}
    if HF_CKPT_DIR_RE.match(node.name) and trainer_written(names):
        # a Trainer's checkpoint without its weights (a rotation killed mid-delete): still the Trainer's, broken
        return "hf-trainer", _optim_files(node)
    return "unknown", {}


def _optim_files(node: Node) -> dict[str, str]:
    for c in node.children:
        if not c.is_dir and c.role == "optimizer":
            return {"optimizer": c.path}
    return {}


def whole_hf_shards(node: Node, dcps: list[Node]) -> Optional[Node]:
    """The per-rank shards (``sharded/``) torch's HuggingFaceStorageWriter(enable_consolidation=True) writes beside
    the consolidated files, where those are not all there (the index names missing files) and the shards are
    whole: then they are the model. None otherwise (the consolidated files are)."""
    if not node.facts.get("index_missing_files"):
        return None
    for c in dcps:
        f = c.facts
        if (
            f.get("storage") == "safetensors"
            and f.get("tensor_count")
            and not (f.get("missing_files") or f.get("chunk_gaps") or f.get("error"))
        ):
            return c
    return None


def _preferred_model_file(files: Sequence[Node]) -> Node:
    def order(c: Node) -> tuple[int, str]:
        return (0 if c.name.endswith(".index.json") else 1 if c.name.endswith(".safetensors") else 2, c.name)

    return sorted(files, key=order)[0]


def _component_text(root: Node, path: str, role: str) -> str:
    n = _find(root, path)
    if n is None:
        return f"{role} in `{path}`"
    bits = []
    if n.size:
        bits.append(naturalsize(n.size))
    tensors = cast(TensorFacts, n.facts)  # any format's node: those holding tensors declare these keys
    if tensors.get("param_count"):
        bits.append(f"{param_count(tensors['param_count'])} params")
    dt = tensors.get("dtypes") or []
    if dt:
        bits.append("/".join(short_dtype(d) for d in dt[:2]))
    shown = (
        ("this folder" if n.is_dir else "this file") if path == "." else "`" + path + ("/" if n.is_dir else "") + "`"
    )
    return f"{role} in {shown}" + (f" ({', '.join(bits)})" if bits else "")


def _find(root: Node, path: str) -> Optional[Node]:
    return root.find(path)


def _step(root: Node, comps: dict[str, str]) -> Optional[int]:
    ts = root.child("trainer_state.json")
    if ts is not None:
        state = cast(JsonFacts, ts.facts)
        if isinstance(state.get("global_step"), int):
            return state["global_step"]
    for p in comps.values():
        n = _find(root, p)
        step = n.facts.get("global_step") if n is not None else None
        if isinstance(step, int):
            return step
    s = step_of(root.name)
    if s is not None:
        return s
    for p in comps.values():
        s = step_of(p.split("/")[0])
        if s is not None:
            return s
    return None


def _world(root: Node, comps: dict[str, str]) -> Optional[int]:
    for p in comps.values():
        n = _find(root, p)
        ws = n.facts.get("world_size") if n is not None else None
        if ws:
            return cast(int, ws)  # every format declares world_size an Optional[int]
    return None


def summary(
    root: Node,
    layout: str,
    comps: dict[str, str],
    model_text: Optional[str] = None,
    incomplete: frozenset[str] = frozenset(),
) -> str:
    """One line: what the checkpoint is and where its parts are. ``model_text``: what to say of the model
    component instead of its size (a LoRA adapter's description, found by reading more than the layout).
    ``incomplete``: a run folder's checkpoints that have error findings (the newest complete one is described)."""
    if layout == "unknown":
        return "not a checkpoint: nothing here is a format ckpt-tui recognises"
    if layout == "run-folder":
        ck = sorted(_checkpoint_dirs(root), key=lambda c: (step_of(c.name), c.name), reverse=True)
        if not ck:
            return "run folder"
        plural = "s" if len(ck) != 1 else ""
        head = f"run folder with {len(ck)} checkpoint{plural}"
        whole = [c for c in ck if c.path not in incomplete]
        if not whole:
            return f"{head}, none complete (newest `{_shown(ck[0])}`)"
        newest = whole[0]
        skipped = [c for c in ck if c.path in incomplete and (step_of(c.name) or 0) > (step_of(newest.name) or 0)]
        lay, comps = run_classify(newest, ck)
        if skipped:
            head += (
                f"; newest complete `{_shown(newest)}` (newer, incomplete: "
                + ", ".join(f"`{_shown(c)}`" for c in skipped[:3])
                + ")"
            )
        else:
            head += f"; newest `{_shown(newest)}`"
        return f"{head}: " + summary(newest, lay, comps, model_text)
    head = FRAMEWORK.get(layout) or layout
    n_model = _find(root, model_component(comps) or "") if comps else None
    if n_model is not None:
        head += format_of(n_model).summary_detail(n_model)
    tp = n_model.facts.get("tensor_parallel") if n_model is not None else None
    if tp:
        head += f", TP={tp}"  # Megatron-Core torch_dist
    pp = n_model.facts.get("pipeline_parallel") if n_model is not None else None
    if isinstance(pp, int) and pp > 1:
        head += f", PP={pp}"
    elif tp and n_model is not None and "pipeline_parallel" in n_model.facts and pp is None:
        head += ", PP unknown"  # no Megatron-LM args in the common state, and the chunks do not tell
    parts = [head]
    ws = _world(root, comps)
    if ws:
        parts.append(f"{ws} rank" + ("s" if ws != 1 else ""))
    step = _step(root, comps)
    if step is not None:
        parts.append(f"step {step}")
    text = ", ".join(parts)
    where = []
    if model_text is not None and (comps.get("model") or comps.get("model+optimizer")):
        opt = comps.get("model+optimizer") or comps.get("optimizer")
        if opt:  # a LoRA adapter's tag holds its optimizer state too: the adapter, then where the state is
            where.append(f"optimizer in `{opt}{'/' if _isdir(root, opt) else ''}`")
        where.insert(0, model_text)
    elif comps.get("model") and comps.get("model") == comps.get("optimizer"):
        where.append(_component_text(root, comps["model"], "model and optimizer"))
    else:
        for role in ("model", "model+optimizer", "optimizer"):
            if role == "model" and model_text is not None and role in comps:
                where.append(model_text)
            elif role in comps:
                where.append(
                    _component_text(root, comps[role], role.replace("+", " and "))
                    if role != "optimizer"
                    else f"optimizer in `{comps[role]}{'/' if _isdir(root, comps[role]) else ''}`"
                )
    if where:  # a LoRA adapter's text has commas of its own: its parts are set apart with semicolons
        text += ": " + ("; " if model_text is not None else ", ").join(where)
    return text


def _shown(c: Node) -> str:
    """A run's checkpoint as the summary names it: a folder with its slash, a file (a Lightning .ckpt) without."""
    return f"{c.path}/" if c.is_dir else c.path


def _isdir(root: Node, path: str) -> bool:
    n = _find(root, path)
    return bool(n and n.is_dir)


def describe(root: Node, trust_pickles: bool = False, parsed: Optional[Parsed] = None) -> Inventory:
    layout, comps = classify(root)
    inv = Inventory(
        root=root,
        layout=layout,
        summary=summary(root, layout, comps),
        framework=FRAMEWORK.get(layout),
        components=comps,
        trust_pickles=trust_pickles,
        parsed=parsed if parsed is not None else Parsed(),
        format_of=format_of,
    )
    _label_frameworks(root, layout)
    if layout == "run-folder":
        inv.checkpoints, inv.checkpoint_components = _checkpoints(root)
    elif root.is_dir and layout in ("deepspeed", "hf-trainer-deepspeed"):
        tags, comps_of = _checkpoints(root)
        if len(tags) > 1:  # a DeepSpeed save_dir holding several tags
            inv.checkpoints, inv.checkpoint_components = tags, comps_of
    return inv


def _label_frameworks(root: Node, layout: str) -> None:
    fw = FRAMEWORK.get(layout)
    if root.is_dir:
        root.role = (
            "run"
            if layout == "run-folder"
            else ("checkpoint" if layout != "unknown" and root.role == "unknown" else root.role)
        )
    root.framework = fw
    runs = _checkpoint_dirs(root) if layout == "run-folder" else []
    for c in runs if layout == "run-folder" else root.children:
        if c.is_dir and step_of(c.name) is not None and format_of(c).plain_folder:
            sub, _ = classify(c)
            c.framework = FRAMEWORK.get(sub)
            if sub != "unknown":
                c.role = "checkpoint"
            _label_frameworks_children(c, sub)
        elif format_of(c).checkpoint:
            # a run's checkpoint that is itself one format (torchtitan's step-N, Megatron's iter_N): its own layout's
            c.framework = FRAMEWORK.get(run_classify(c, runs)[0]) if layout == "run-folder" else fw


def _label_frameworks_children(node: Node, layout: str) -> None:
    fw = FRAMEWORK.get(layout)
    for c in node.children:
        if format_of(c).checkpoint:
            c.framework = fw


COMPOSER_RE = re.compile(r"^ep(\d+)-ba(\d+)-rank(\d+)\.pt$")


def _composer_batch(name: str) -> int:
    m = COMPOSER_RE.match(name)
    return int(m.group(2)) if m else -1


def run_classify(checkpoint: Node, siblings: list[Node]) -> tuple[str, dict[str, str]]:
    """A run's checkpoint's layout, knowing its siblings: in a torchtitan run (a step-N holding torchtitan's
    train_state / dataloader / lr_scheduler), a step-N holding the model alone is torchtitan's last-step export,
    not a plain DCP."""
    lay, comps = classify(checkpoint)
    if lay == "dcp" and re.match(r"^step-\d+$", checkpoint.name):
        if any(
            s is not checkpoint and re.match(r"^step-\d+$", s.name) and classify(s)[0] == "torchtitan" for s in siblings
        ):
            return "torchtitan", comps
    return lay, comps


def _checkpoint_dirs(node: Node, depth: int = 0) -> list[Node]:
    """Checkpoint folders (checkpoint-N, global_stepN, step-N, iter_N, *step=N.ckpt) at most
    three levels down (Lightning keeps them in lightning_logs/version_0/checkpoints/). A checkpoint folder a prune
    emptied down to its marker (killed before removing the folder) is one too: listed, and incomplete
    (prune-interrupted), not gone from the run."""
    out: list[Node] = []
    for c in node.children:
        if not c.is_dir:
            # Lightning's ModelCheckpoint under DDP (or one device): one torch.save file per save,
            # epoch=E-step=N.ckpt (last.ckpt, a copy or link of the newest, has no step: not listed)
            if c.name.endswith(".ckpt") and step_of(c.name) is not None and classify(c)[0] == "lightning":
                out.append(c)
            continue
        if step_of(c.name) is not None:
            if classify(c)[0] != "unknown" or c.child(PRUNE_MARKER) is not None:
                out.append(c)
        elif depth < 2 and format_of(c).plain_folder:
            out.extend(_checkpoint_dirs(c, depth + 1))
    return out


def _checkpoints(root: Node) -> tuple[list[RunCheckpoint], dict[str, dict[str, str]]]:
    """The checkpoints below ``root``, newest first, and each one's components."""
    out: list[RunCheckpoint] = []
    comps_of = {}
    dirs = _checkpoint_dirs(root)
    for c in dirs:
        lay, comps = run_classify(c, dirs)
        step = cast(int, step_of(c.name))  # _checkpoint_dirs keeps the names with a step
        out.append({"path": c.path, "step": step, "layout": lay, "complete": True})
        comps_of[c.path] = comps
    out.sort(key=lambda d: (-d["step"], d["path"]))
    return out, comps_of
