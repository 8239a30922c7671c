"""Is a checkpoint whole, and will it resume? Pure, like diagnose: reads the facts the scan gathered (and, for an
adapter file, its header's shapes; for a checkpoint inspected alone, the names beside it), never a tensor.

- ``weights-empty``: weights saved under ZeRO-3 or FSDP without gathering them first (every tensor has a 0 in its
  shape, or the file holds no tensors at all), and where the real weights are: the DeepSpeed tag or DCP folder
  beside it, and the export that takes them from there.
- ``checkpoint-incomplete``: an HF Trainer ``checkpoint-N`` whose save was killed (no ``trainer_state.json``, which
  the Trainer writes last) or half deleted by a rotation (a file its siblings have is gone); the newest complete
  sibling and the exact way to resume from it.
- ``rng-state-missing``: resumes, but not bit-reproducibly.
- ``resume-model-only``: saved with ``save_only_model`` (read from ``training_args.bin``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, cast

from .advice import has_breakage
from .facts import DcpFacts, JsonFacts, TensorFacts, TorchZipFacts
from .formats.deepspeed import reader as dsfmt
from .formats.registry import format_of
from .names import HF_CKPT_DIR_RE, MODEL_FILE_RE, step_of, trainer_written
from .storage import is_url
from .types import Finding, Inventory, Node, Parsed, TensorInfo, user_path

RNG_RE_PREFIX = "rng_state"
PRUNE_MARKER = ".ckpt-tui-prune.json"  # core/prune.py's MARKER: what it says, prune.marker_findings reports
RNG_RANK_RE = re.compile(r"rng_state_(\d{1,6})\.pth")


def empty_weights(n: Node, inv: Optional[Inventory] = None) -> Optional[str]:
    """What makes the weights ``n`` holds empty (a phrase), or None: they are not, or it holds no weights.
    With ``inv``, also a file holding one rank's slice of the tensors a DCP folder beside it holds whole."""
    why = _empty(n, inv.parsed if inv is not None else None)
    if why is None and inv is not None:
        why = _slice(inv, n)
    return why


def _slice(inv: Inventory, n: Node) -> Optional[str]:
    """A model or adapter file whose tensors are smaller than the same names in a whole DCP model folder or
    DeepSpeed tag beside it (rank 0 saving its FSDP shard: ``save_file({k: v.to_local()})``). Headers only: the
    file's, the DCP's metadata and the tag's recorded shapes (``param_shapes``, as the scan parsed them)."""
    if n.is_dir or n.role != "model" or not format_of(n).weights_as_saved or not n.facts.get("param_count"):
        return None
    try:
        found = _whole_beside(inv, n)
        if found is None:
            return None
        shown, whole = found
        mine = list(format_of(n).tensors(n, inv.parsed))
    except Exception:  # a header that cannot be read is another finding's
        return None
    smaller = []
    for t in mine:
        w = whole.get(t.name) or whole.get("model." + t.name)
        if w is not None and t.numel < w.numel:
            smaller.append((t, w))
    if not smaller:
        return None
    t, w = smaller[0]
    from .present import shape_text

    return (
        f"holds {len(smaller)} of its {len(mine)} tensors smaller than the same names in "
        f"`{shown}` beside it (`{t.name}`: {shape_text(t.shape)} here, "
        f"{shape_text(w.shape)} there): one rank's slice of each sharded tensor"
    )


def _whole_beside(inv: Inventory, n: Node) -> Optional[tuple[str, dict[str, TensorInfo]]]:
    """(as shown, its tensors by name) of the whole DCP model folder or DeepSpeed tag beside ``n``; None if none."""
    for c in _folder_of(inv, n).children:
        if not c.is_dir or not c.facts.get("param_count") or has_breakage(c):
            continue
        fmt = format_of(c)
        if fmt.torch_dcp and c.role == "model":
            return inv.shown(c.path, slash=True), {t.name: t for t in fmt.tensors(c, inv.parsed)}
        if fmt.tag:
            tf = inv.parsed.get(c, dsfmt.TagFacts)  # what the scan read of it: never read again here
            if tf is not None and (tf.param_shapes or tf.frozen_shapes):
                return inv.shown(c.path, slash=True), _tag_shapes(tf)
    if n is inv.root:  # the file inspected alone: an FSDP model folder or a DeepSpeed tag beside it
        return _dcp_beside_root(inv) or _tag_beside_root(inv)
    return None


def _tag_shapes(tf: dsfmt.TagFacts) -> dict[str, TensorInfo]:
    """The whole shapes a DeepSpeed tag records, by name (a PEFT adapter's also as its adapter file names them:
    ``…lora_A.weight`` for the tag's ``…lora_A.default.weight``)."""
    out: dict[str, TensorInfo] = {}
    for name, shape in {**tf.frozen_shapes, **tf.param_shapes}.items():
        t = TensorInfo(name, shape, "float32", 0)
        out[name] = t
        out.setdefault(_ADAPTER_NAME_RE.sub(r".\1", name), t)
    return out


# PEFT names a LoRA weight ``<module>.lora_A.<adapter name>.weight`` in the model, ``<module>.lora_A.weight`` in
# the adapter file it saves (get_peft_model_state_dict drops the adapter name)
_ADAPTER_NAME_RE = re.compile(r"\.(lora_[AB]|lora_embedding_[AB])\.[^.]+(?=\.|$)")


def _tag_beside_root(inv: Inventory) -> Optional[tuple[str, dict[str, TensorInfo]]]:
    """(as shown, its recorded shapes) of the DeepSpeed tag beside the file inspected alone (the one ``latest``
    names, else the only one), its rank-0 model states read through the screened reader; None if there is none,
    or it cannot be read safely."""
    found = _sharded_beside(inv)
    if found is None:
        return None
    parent = os.path.dirname(os.path.abspath(str(inv.root.abspath)))
    try:
        with open(os.path.join(parent, "latest"), encoding="utf-8") as fh:
            name = fh.read(256).strip()
    except (OSError, ValueError):
        tags = [e for e in os.listdir(parent) if e.startswith("global_step")]
        name = tags[0] if len(tags) == 1 else ""
    folder = os.path.join(parent, name)
    if not name or name.startswith(".") or os.sep in name or "/" in name or os.path.islink(folder):
        return None
    if not os.path.isdir(folder):
        return None
    from .formats.torch_save.format import read_torch_file
    from .scan import walk

    node = walk(Path(folder))
    tf = dsfmt.classify_files(c.name for c in node.children)
    states = node.child(tf.model_files.get((-1, 0)) or tf.model_files.get((0, 0)) or "")
    if states is None:
        return None
    obj = read_torch_file(states).obj  # its structure only (param_shapes), nothing executed
    if states.facts.get("unsafe_globals"):
        return None
    dsfmt.analyze_model_states(obj, tf)
    if not (tf.param_shapes or tf.frozen_shapes):
        return None
    return os.path.join(found[0], name) + "/", _tag_shapes(tf)


def _dcp_beside_root(inv: Inventory) -> Optional[tuple[str, dict[str, TensorInfo]]]:
    """(as shown, its tensors) of the FSDP model DCP folder (``pytorch_model_fsdp_N/``) beside the file inspected
    alone, read through the screened .metadata reader; None if there is none, or it cannot be read."""
    found = _sharded_beside(inv)
    if found is None or not found[1].startswith("pytorch_model_fsdp"):
        return None
    from .formats.dcp import reader as dcpfmt

    folder = os.path.join(os.path.dirname(os.path.abspath(str(inv.root.abspath))), found[1])
    info = dcpfmt.read(Path(folder))
    if info.unsafe:
        return None
    return os.path.join(found[0], found[1]) + "/", {t.name: t for t in info.tensors}


def _empty(n: Node, parsed: Optional[Parsed] = None) -> Optional[str]:
    f = cast(TensorFacts, n.facts)
    if "tensor_count" not in f or n.role != "model":
        return None
    fmt = format_of(n)
    if n.is_dir:
        if not fmt.torch_dcp:
            return None
        return "holds no tensor entries" if not f["tensor_count"] else None
    if not fmt.weights_as_saved:
        return None  # a ZeRO-3 tag's own model_states.pt holds empty placeholders by design
    count = f["tensor_count"]
    if not count:
        return "holds no tensors at all"
    if not f.get("param_count"):
        return f"holds {count} tensors, every one empty (a 0 in its shape)"
    if n.name.startswith("adapter_model."):
        lora = [t for t in fmt.tensors(n, parsed) if ".lora_A." in t.name or ".lora_B." in t.name]
        if lora and all(len(t.shape) < 2 or 0 in t.shape for t in lora):
            return f"holds {len(lora)} LoRA tensors, none of them a matrix (PEFT's own check: fewer than 2 dimensions)"
    return None


def _folder_of(inv: Inventory, n: Node) -> Node:
    parent = n.path.rsplit("/", 1)[0] if "/" in n.path else "."
    return inv.node(parent) or inv.root


def weights_recovery(inv: Inventory, n: Node) -> Optional[Node]:
    """The DeepSpeed tag or DCP model folder beside ``n`` that holds its weights whole (not itself empty or broken)."""
    folder = _folder_of(inv, n)
    for c in folder.children:
        if c is n or not c.is_dir or has_breakage(c):
            continue
        fmt = format_of(c)
        if fmt.tag and c.facts.get("module_tensors"):
            return c
        if fmt.torch_dcp and c.role in ("model", "model+optimizer") and cast(TensorFacts, c.facts).get("param_count"):
            return c
    return None


def weights_empty_finding(inv: Inventory, n: Node) -> Optional[Finding]:
    why = empty_weights(n, inv)
    if why is None:
        return None
    where = f"`{inv.shown(n.path, slash=n.is_dir)}`"
    adapter = n.name.startswith("adapter_model.") or (inv.adapter is not None and inv.adapter.node is n)
    what = "the adapter" if adapter else "the model"
    dcp = n.is_dir and format_of(n).torch_dcp
    if dcp:
        msg = f"{where} {why}: the save wrote none of the model's weights, so there is nothing in it to load."
    else:
        msg = (
            f"{where} {why}: it was saved under ZeRO-3 or FSDP without gathering the sharded weights first, so "
            f"loading it fails or gives {'an adapter that changes nothing' if adapter else 'an empty or randomly initialised model'}."
        )
    command = None
    src = weights_recovery(inv, n)
    if src is not None:
        folder = _folder_of(inv, n)
        # export the checkpoint folder when it picks that tag/DCP for its model (it then also finds adapter_config.json)
        target = folder if inv.model_node(None if folder is inv.root else _checkpoint_key(inv, folder)) is src else src
        command = f"ckpt-tui export {inv.shown(target.path)} --out DIR"
        msg += (
            f" The weights are whole in `{inv.shown(src.path, slash=True)}` beside it: `{command}` writes "
            f"{what} from there as safetensors" + (" (with adapter_config.json, as PEFT loads it)." if adapter else ".")
        )
    elif n is inv.root and (listed := _sharded_beside(inv)) is not None:
        # the file was inspected alone: its folder was not scanned, only listed (once)
        beside, sub = listed
        command = f"ckpt-tui export {beside} --out DIR"
        msg += (
            f" `{os.path.join(beside, sub)}/` beside it is where such a run keeps the sharded weights: "
            f"`ckpt-tui inspect {beside}` says whether they are whole there, and `{command}` takes them from there."
        )
    elif dcp:
        optim = [c for c in _folder_of(inv, n).children if c.is_dir and c.role == "optimizer"]
        kept = (
            f" What survives is `{inv.shown(optim[0].path, slash=True)}`: the optimizer's moments, not the weights."
            if optim
            else ""
        )
        msg += (
            " Nothing beside it holds the weights, and no tool can recover them from this save (the HF Trainer with "
            "FSDP1, SHARDED_STATE_DICT and a PEFT model saves this way)." + kept + " Train again with FSDP2 "
            "(fsdp_config version 2), which saves the adapter in pytorch_model_fsdp_0/."
        )
    else:
        msg += (
            " Nothing beside it holds the weights: take them from the run's DeepSpeed tag (global_stepN/) or DCP "
            "folder if you have it, or save again after gathering (DeepSpeed: stage3_gather_16bit_weights_on_model_save "
            "true, or engine.save_16bit_model)."
        )
    return Finding("weights-empty", "error", n.path, msg, None, command)


def _sharded_beside(inv: Inventory) -> Optional[tuple[str, str]]:
    """(the folder as shown, the sub-folder's name) of a DeepSpeed tag or FSDP model folder beside the file the
    user inspected alone, by name only; None if there is none (or it is not a local file)."""
    if is_url(inv.given) or inv.root.is_dir:
        return None
    parent = os.path.dirname(os.path.abspath(str(inv.root.abspath)))
    try:
        with os.scandir(parent) as it:
            subs = sorted(
                e.name
                for e in it
                if e.is_dir(follow_symlinks=False)
                and (e.name.startswith("global_step") or e.name.startswith("pytorch_model_fsdp"))
            )
    except OSError:
        return None
    if not subs:
        return None
    shown = os.path.dirname(inv.shown(".")) or "."
    return shown, subs[-1]


def _checkpoint_key(inv: Inventory, folder: Node) -> Optional[str]:
    return folder.path if folder.path in inv.checkpoint_components else None


def optimizer_gap_finding(inv: Inventory, n: Node) -> Optional[Finding]:
    """``optimizer-state-missing``: a DCP optimizer state without entries for some parameters it optimises."""
    f = cast(DcpFacts, n.facts)
    gaps = f.get("optimizer_gaps")
    if not gaps:
        return None
    total = f.get("optimizer_gaps_total", len(gaps))
    names = ", ".join(f"`{g}`" for g in gaps[:4]) + (f" and {total - 4} more" if total > 4 else "")
    where = inv.shown(n.path)
    return Finding(
        "optimizer-state-missing",
        "warning",
        n.path,
        f"`{where}/`'s optimizer lists {total} parameter(s) it holds no state for ({names}): they never received a "
        "gradient, so the optimizer never created their moments. torch's standard resume (get_state_dict(model, "
        'optimizer), then dcp.load, as accelerate does) stops with "Missing key in checkpoint state_dict: '
        f'optimizer.state.{gaps[0]}…". Load it with `dcp.load(state, checkpoint_id={py(user_path(inv.given or str(inv.root.abspath), n.path))}, '
        "planner=DefaultLoadPlanner(allow_partial_load=True))` (torch.distributed.checkpoint.default_planner): "
        "those parameters then restart with fresh moments, the others resume as saved.",
    )


# --- HF Trainer checkpoints ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerSave:
    """What an HF Trainer checkpoint folder holds, by name (nothing read)."""

    path: str  # relative to the scanned root ("" for a sibling outside it)
    name: str
    weights: bool
    optimizer: bool
    scheduler: bool
    state: bool  # trainer_state.json
    rng: frozenset[str]  # rng_state*.pth names
    save_only_model: Optional[bool]
    deepspeed: Optional[bool]
    written: bool  # trainer_written(its names)
    pruned: bool = False  # a `ckpt-tui prune` marker (core/prune.py): its optimizer state went on purpose

    @property
    def step(self) -> int:
        return cast(int, step_of(self.name))


def _save_of(path: str, name: str, entries: dict[str, bool], args: Optional[TorchZipFacts] = None) -> TrainerSave:
    """``entries``: name -> is a folder."""
    names = set(entries)
    tag = any(d and n.startswith("global_step") for n, d in entries.items())
    return TrainerSave(
        path=path,
        name=name,
        weights=tag
        or any(MODEL_FILE_RE.match(n) for n in names)
        or any(d and n.startswith("pytorch_model_fsdp") for n, d in entries.items()),
        optimizer=tag or "optimizer.pt" in names or any(d and n.startswith("optimizer_") for n, d in entries.items()),
        scheduler="scheduler.pt" in names,
        state="trainer_state.json" in names,
        rng=frozenset(n for n in names if n.startswith(RNG_RE_PREFIX) and n.endswith(".pth")),
        save_only_model=args.get("save_only_model") if args else None,
        deepspeed=args.get("deepspeed") if args else None,
        written=trainer_written(names),
        pruned=PRUNE_MARKER in names,
    )


def _node_save(n: Node) -> TrainerSave:
    args = n.child("training_args.bin")
    return _save_of(
        n.path, n.name, {c.name: c.is_dir for c in n.children}, cast(TorchZipFacts, args.facts) if args else None
    )


def _outside_siblings(inv: Inventory) -> list[TrainerSave]:
    """The HF checkpoints beside a checkpoint inspected alone: their names only (a local folder; at most 64)."""
    if is_url(inv.given):
        return []
    parent = os.path.dirname(os.path.abspath(str(inv.root.abspath)))
    out: list[TrainerSave] = []
    try:
        with os.scandir(parent) as it:
            for e in it:
                if len(out) >= 64:
                    break
                if e.name == inv.root.name or not HF_CKPT_DIR_RE.match(e.name) or not e.is_dir(follow_symlinks=False):
                    continue
                entries: dict[str, bool] = {}
                with os.scandir(e.path) as inner:
                    for i, x in enumerate(inner):
                        if i >= 256:
                            break
                        entries[x.name] = x.is_dir(follow_symlinks=False)
                out.append(_save_of("", e.name, entries))
    except OSError:
        return []
    return out


def trainer_findings(inv: Inventory) -> list[Finding]:
    """``checkpoint-incomplete``, ``rng-state-missing`` and ``resume-model-only`` on every HF Trainer checkpoint."""
    groups: list[tuple[Optional[Node], list[Node]]] = []
    if inv.root.is_dir and HF_CKPT_DIR_RE.match(inv.root.name):
        groups.append((None, [inv.root]))
    for n in inv.nodes():
        if n.is_dir:
            cks = [c for c in n.children if c.is_dir and HF_CKPT_DIR_RE.match(c.name)]
            if cks:
                groups.append((n, cks))
    out: list[Finding] = []
    for parent, cks in groups:
        saves = [_node_save(c) for c in cks]
        others = _outside_siblings(inv) if parent is None else []
        every = saves + others
        if not any(s.written for s in every):
            continue  # a user's own save_pretrained("checkpoint-5"): not the Trainer's
        verdicts = {s: _incomplete(s, every) for s in every}  # every save in the folder, scanned or listed
        for c, s in zip(cks, saves):
            why = verdicts[s]
            if why:
                out.append(_incomplete_finding(inv, c, s, why, every, verdicts))
                continue
            if not s.pruned:
                out.extend(_resume_findings(inv, s, every))
    return out


def _incomplete(s: TrainerSave, every: list[TrainerSave]) -> Optional[str]:
    """Why ``s`` is not a whole Trainer save, or None."""
    if not s.state:
        return "it has no trainer_state.json, which the Trainer writes last (after the weights, optimizer, scheduler and RNG states): the save was killed"
    model_only = s.save_only_model is True or s.pruned  # pruned: prune-interrupted / optimizer-pruned say it
    peers = [p for p in every if p is not s and p.written and p.state]
    lacks = []
    if not s.weights:
        lacks.append("the model weights")
    if not model_only and not s.optimizer and (s.save_only_model is False or any(p.optimizer for p in peers)):
        lacks.append("the optimizer state (optimizer.pt)")
    if not model_only and not s.scheduler and any(p.scheduler for p in peers):
        lacks.append("scheduler.pt")
    if lacks:
        return (
            f"it lacks {' and '.join(lacks)}, which the Trainer writes before trainer_state.json: files were deleted "
            "after the save (a checkpoint rotation killed mid-delete, or a copy that stopped)"
        )
    return None


def _user(inv: Inventory, s: TrainerSave) -> str:
    """Where ``s`` is, as the user can name it (unquoted): a node of the tree, or a sibling of the inspected root."""
    given = inv.given or str(inv.root.abspath)
    if s.path:
        return user_path(given, s.path)
    parent = os.path.dirname(user_path(given).rstrip("/"))
    return os.path.join(parent, s.name) if parent else s.name


def py(path: str) -> str:
    """``path`` as a Python string literal (escapes, quotes and control characters written as escapes)."""
    return json.dumps(path)


def _incomplete_finding(
    inv: Inventory,
    n: Node,
    s: TrainerSave,
    why: str,
    every: list[TrainerSave],
    verdicts: dict[TrainerSave, Optional[str]],
) -> Finding:
    me = inv.shown(n.path)
    mine = _user(inv, s)
    whole = sorted(
        (
            p
            for p in every
            if p is not s
            and not verdicts[p]
            and p.written
            and not (p.path and has_breakage(cast(Node, inv.node(p.path))))
        ),
        key=lambda p: p.step,
        reverse=True,
    )
    msg = f"`{me}/` is not a complete HF Trainer checkpoint: {why}."
    highest = not any(p.step > s.step for p in every if p is not s)  # what resume_from_checkpoint=True picks
    if whole:
        good = py(_user(inv, whole[0]))
        msg += f" Resume from the newest complete one: `trainer.train(resume_from_checkpoint={good})`" + (
            f"; resume_from_checkpoint=True would pick `{me}/` (the highest number) and fail, so move it aside "
            f"first: `mv {me} {shlex.quote(mine + '.incomplete')}`."
            if highest
            else "."
        )
    else:
        msg += " No complete checkpoint is beside it: restart the run, or train from its weights without resuming."
    if s.weights and not s.state:
        msg += f" Its weights can still be exported: `ckpt-tui export {me} --out DIR`."
    return Finding("checkpoint-incomplete", "error", n.path, msg)


def _resume_findings(inv: Inventory, s: TrainerSave, every: list[TrainerSave]) -> list[Finding]:
    me = inv.shown(s.path)
    lit = py(_user(inv, s))
    out = []
    if s.save_only_model:
        if s.deepspeed:
            out.append(
                Finding(
                    "resume-model-only",
                    "warning",
                    s.path,
                    f"`{me}/` was saved with save_only_model=True under DeepSpeed: it holds no DeepSpeed tag, so "
                    f'`trainer.train(resume_from_checkpoint={lit})` stops with "Can\'t find a valid checkpoint". '
                    f"Start a new run from its weights instead: {_load_weights(inv, s, lit)}.",
                )
            )
        else:
            out.append(
                Finding(
                    "resume-model-only",
                    "info",
                    s.path,
                    f"`{me}/` was saved with save_only_model=True: it holds no optimizer, scheduler or RNG state. "
                    f"`trainer.train(resume_from_checkpoint={lit})` resumes without a word, with a fresh optimizer "
                    "and the learning-rate schedule restarted from its warm-up.",
                )
            )
        return out
    expected = _rng_expected(set().union(*(p.rng for p in every if p.state)) if every else set())
    if s.rng:  # a sibling saved by another number of processes writes the other kind of names
        indexed = any(RNG_RANK_RE.fullmatch(n) for n in s.rng)
        expected = {n for n in expected if bool(RNG_RANK_RE.fullmatch(n)) == indexed}
    missing = (
        sorted(expected - s.rng, key=_rng_order) if s.rng else sorted(expected, key=_rng_order) or ["rng_state.pth"]
    )
    if s.state and (not s.rng or missing):
        out.append(
            Finding(
                "rng-state-missing",
                "info",
                s.path,
                f"`{me}/` has no {', '.join(missing[:4])}: it resumes, but the random streams (dropout, data "
                "order) start afresh, so the resumed run is not bit-for-bit the one that was interrupted.",
            )
        )
    return out


def _load_weights(inv: Inventory, s: TrainerSave, lit: str) -> str:
    """How to load the weights of ``s`` (whose path is the literal ``lit``), as code that runs as printed: the class
    its config.json names (transformers' ``from_pretrained``), PEFT's for an adapter, else its model file."""
    n = inv.node(s.path) or inv.root
    if n.child("adapter_config.json") is not None:
        return (
            f"`from peft import PeftModel; model = PeftModel.from_pretrained(base_model, {lit})` "
            "(base_model: the base model, loaded)"
        )
    config = n.child("config.json")
    if config is not None:
        archs = cast(JsonFacts, config.facts).get("architectures") or []
        one = len(archs) == 1 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,99}", archs[0])
        arch = archs[0] if one else "AutoModel"
        return f"`from transformers import {arch}; model = {arch}.from_pretrained({lit})`"
    for name, code in (
        ("model.safetensors", "from safetensors.torch import load_file; model.load_state_dict(load_file({}))"),
        ("pytorch_model.bin", "import torch; model.load_state_dict(torch.load({}, weights_only=True))"),
    ):
        f = n.child(name)
        if f is not None:
            where = py(user_path(inv.given or str(inv.root.abspath), f.path))
            return f"`{code.format(where)}` (model: yours, built as in the run)"
    return "load its model file's state dict into your model (`model.load_state_dict(...)`)"


def _rng_expected(names: set[str]) -> set[str]:
    """The RNG files a save of these ranks writes: the Trainer writes ``rng_state.pth`` in one process, else
    ``rng_state_<process index>.pth`` on every rank, so a ``rng_state_R.pth`` means ranks 0 to at least max(R, 1)."""
    ranks = [int(m.group(1)) for n in names if (m := RNG_RANK_RE.fullmatch(n))]
    if not ranks:
        return names
    return names | {f"rng_state_{r}.pth" for r in range(max(max(ranks), 1) + 1)}


def _rng_order(name: str) -> tuple[int, str]:
    m = RNG_RANK_RE.fullmatch(name)
    return (int(m.group(1)) if m else -1, name)
