"""The optimizer state inside a torch.save file (``--component optimizer``): a Lightning ``.ckpt``
(``optimizer_states[0]``), a plain ``torch.save({"model": …, "optimizer": opt.state_dict()})``, an
Accelerate ``optimizer.bin`` (a bare ``optimizer.state_dict()``).

``optimizer.state_dict()`` keys its state by index: ``state[i]`` is the i-th parameter of the
concatenated param groups' ``params``. An index has a name only where the model's parameters, in
order, line up with those indices: :func:`align`. The model's state dict also holds buffers (and
frozen parameters, which have no state), so the trainable parameters are found as the one
order-preserving match of the optimizer's state shapes into the model's tensors; where there is no
such match, or more than one, or the model beside it keeps no order (a safetensors file, sorted by
name), the tensors are ``param_<i>.exp_avg`` … and the plan says why. A file whose state is keyed by
FQN (``get_optimizer_state_dict``) is named as it is.

An HF Trainer checkpoint's ``optimizer.pt`` (``config.json`` or ``adapter_config.json`` beside it) is named
first in the Trainer's own order (:mod:`.trainer_order`: the architecture built from the config, PEFT's
wrapping emulated for an adapter, the base's config.json found by :func:`..adapters.base.find_base`), which
names what :func:`align` cannot (a safetensors model beside it, equal shapes); accepted only where every group's
size and weight_decay and every state's shape agree, and said why not otherwise.

Read through the restricted unpickler; tensor bytes are byte ranges of the zip (:mod:`.source`).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ...dtypes import ITEMSIZE
from ...export.sources import Source, SourceTensor
from ...safetext import visible
from ...storage import Location, LocationLike, as_path, open_read
from .. import FormatError
from ..deepspeed.optim import CONFIG_FILE, STATES, jsonable
from ..unpickle import Stub, TensorRef
from . import torchfile

if TYPE_CHECKING:
    from .trainer_order import TrainerOrder

KIND = "torch-file-optimizer"
_SCALAR = {"float32": "<f", "float64": "<d", "int64": "<q", "int32": "<i"}
_MAX_PAIRS = 20_000_000  # alignment table size beyond which names are not attempted
TRAINER_OPTIMIZER = "optimizer.pt"  # what Trainer._save_optimizer_and_scheduler writes
MODEL_CONFIG = "config.json"


def find_optimizer_state(obj: Any) -> tuple[Optional[dict[Any, Any]], str, int]:
    """(the optimizer state dict, where it is in the file, how many optimizers the file holds)."""

    def is_sd(x: Any) -> bool:
        return (
            isinstance(x, dict)
            and isinstance(x.get("state"), dict)
            and isinstance(x.get("param_groups"), (list, tuple))
        )

    if is_sd(obj):
        return obj, "the file itself", 1
    if isinstance(obj, dict):
        states = obj.get("optimizer_states")
        if isinstance(states, (list, tuple)) and states and is_sd(states[0]):
            return states[0], "optimizer_states[0]", len(states)
        for k in ("optimizer", "optim", "optimizer_state_dict"):
            if is_sd(obj.get(k)):
                return obj[k], k, 1
        opts = obj.get("state", {}).get("optimizers") if isinstance(obj.get("state"), dict) else None
        if isinstance(opts, dict) and opts:  # composer: {"state": {"optimizers": {"AdamW": state_dict}}}
            name, first = next(iter(opts.items()))
            if is_sd(first):
                return first, f"state.optimizers.{name}", len(opts)
    return None, "", 0


def has_optimizer_state(path: LocationLike) -> bool:
    try:
        tf = torchfile.read(path)
    except (FormatError, OSError):
        return False
    return find_optimizer_state(tf.obj)[0] is not None


def align(
    opt_shapes: list[Optional[tuple[int, ...]]], model: list[tuple[str, tuple[int, ...]]]
) -> tuple[Optional[list[str]], str]:
    """The model names of the optimizer's parameters, in order: the one order-preserving match of
    ``opt_shapes`` (None: a parameter without state, matching any shape) into the ``model``'s (name,
    shape) list, which may hold more (buffers, frozen parameters). None and why where there is no
    single such match."""
    n, m = len(opt_shapes), len(model)
    if n == 0:
        return [], ""
    if n > m:
        return None, f"the optimizer has {n} parameters, the model {m} tensors"
    if n * m > _MAX_PAIRS:
        return None, f"too many parameters to match ({n} x {m})"
    shapes = [s for _, s in model]
    # ways[j] for row i: embeddings of opt[i:] into model[j:], capped at 2
    nxt = [1] * (m + 1)
    table = [nxt]
    for i in range(n - 1, -1, -1):
        row = [0] * (m + 1)
        want = opt_shapes[i]
        for j in range(m - 1, -1, -1):
            w = row[j + 1]
            if want is None or shapes[j] == want:
                w += nxt[j + 1]
            row[j] = min(w, 2)
        table.append(row)
        nxt = row
    table.reverse()  # table[i] = row for opt[i:]
    if table[0][0] == 0:
        return None, "no in-order match of the optimizer's state shapes with the model's parameters"
    if table[0][0] > 1:
        return None, "the optimizer's state shapes match the model's parameters in more than one way"
    names, j = [], 0
    for i in range(n):
        while not ((opt_shapes[i] is None or shapes[j] == opt_shapes[i]) and table[i + 1][j + 1] >= 1):
            j += 1
        names.append(model[j][0])
        j += 1
    return names, ""


def trainer_run_order(path: Location, weight_decay: Any) -> Optional[TrainerOrder]:
    """The HF Trainer's order of ``path``'s parameters, None where ``path`` is not the ``optimizer.pt`` of a
    Trainer checkpoint folder (``config.json`` or ``adapter_config.json`` beside it); ``why_not`` set where the
    folder is one but no order can be derived. ``weight_decay``: param group 0's (the run's args.weight_decay)."""
    from .trainer_order import TrainerOrder, trainer_param_order

    if not isinstance(path, Path) or path.name != TRAINER_OPTIMIZER:
        return None
    folder = path.parent
    config = folder / MODEL_CONFIG
    from ...adapters.config import CONFIG_NAME, AdapterConfigError, LoraConfig, read_lora_config

    adapter = folder / CONFIG_NAME
    has_config, has_adapter = os.path.lexists(config), os.path.lexists(adapter)
    if not has_config and not has_adapter:
        return None
    if isinstance(weight_decay, Stub):
        weight_decay = weight_decay.value
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)):
        return TrainerOrder([], [], "param group 0 has no numeric weight_decay")
    lora: Optional[LoraConfig] = None
    link_root: Optional[Path] = None
    if has_adapter:
        try:
            lora = read_lora_config(adapter)
        except AdapterConfigError as e:
            return TrainerOrder([], [], visible(str(e).replace(str(adapter), CONFIG_NAME)))
        if not has_config:
            from ...adapters.base import find_base

            lookup = find_base(lora.base_model_name_or_path, checkpoint=folder, revision=lora.revision)
            if lookup.found is None:
                return TrainerOrder([], [], f"the base model's {MODEL_CONFIG} is needed: {lookup.message()}")
            config = lookup.found / MODEL_CONFIG
            if lookup.found.parent.name == "snapshots":  # a Hugging Face cache snapshot: links into ../../blobs
                link_root = lookup.found.parent.parent
    vocab = _saved_vocab(folder) if lora is not None else None
    order = trainer_param_order(
        config, adapter_config=lora, weight_decay=float(weight_decay), link_root=link_root, vocab_size=vocab
    )
    where = f"the {MODEL_CONFIG} beside it" if has_config else f"the base's {MODEL_CONFIG} ({visible(config)})"
    order.what = f"{order.what}, built on the meta device from {where}"
    if vocab is not None:
        order.what += f" with the {vocab}-row embedding the run saved (it added tokens)"
    return order


def _saved_vocab(folder: Path) -> Optional[int]:
    """The rows of the input embedding a PEFT run saved whole in ``adapter_model.safetensors`` (modules_to_save,
    or PEFT's save_embedding_layers where the run resized it): the vocabulary the run trained, which is the base
    config's unless it added tokens. None where it saved none."""
    saved, _ = saved_weights(folder, adapter=True)
    rows = {
        s[0]
        for n, s in (saved or {}).items()
        if len(s) == 2 and n.endswith(".weight") and n.rsplit(".", 2)[-2] in ("embed_tokens", "wte", "word_embeddings")
    }
    return rows.pop() if len(rows) == 1 else None


def saved_weights(folder: Path, adapter: bool) -> tuple[Optional[dict[str, tuple[int, ...]]], str]:
    """(name -> shape, which file) of the weights a Trainer checkpoint saved: ``adapter_model.safetensors`` of a
    PEFT run, ``model.safetensors`` (or the shards its index names) of a full one; None where there are none
    to read (a torch-pickle ``pytorch_model.bin``: not read here)."""
    from ..safetensors.header import read_header, read_index

    stem = "adapter_model" if adapter else "model"
    single, index = folder / f"{stem}.safetensors", folder / f"{stem}.safetensors.index.json"
    out: dict[str, tuple[int, ...]] = {}
    try:
        if single.is_file() and not single.is_symlink():
            files = [single]
        elif not adapter and index.is_file() and not index.is_symlink():
            shards = {v for v in read_index(index)["weight_map"].values() if isinstance(v, str)}
            files = [folder / v for v in sorted(shards) if "/" not in v and v not in ("", ".", "..")]
        else:
            return None, ""
        for f in files:
            h = read_header(f)
            out.update((n, tuple(s)) for n, s in zip(h.names, h.shapes))
    except (FormatError, OSError):
        return None, ""
    return out, f"{stem}.safetensors"


def _trainer_names(
    path: Location, groups: list[dict[Any, Any]], order: list[Any], shapes: list[Optional[tuple[int, ...]]]
) -> tuple[Optional[list[str]], Optional[str]]:
    """(the export's names of ``order``, the note) where ``path`` is a Trainer checkpoint's optimizer.pt:
    names None where the Trainer's order is refused or disagrees (the note says which check failed);
    (None, None) where ``path`` is not a Trainer's."""
    from .trainer_order import check_against

    torder = trainer_run_order(path, groups[0].get("weight_decay") if groups else None)
    if torder is None:
        return None, None
    sizes = [len(g.get("params") or []) for g in groups]
    wds: list[float] = []
    for g in groups:
        w = g.get("weight_decay")
        w = w.value if isinstance(w, Stub) else w
        wds.append(float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else float("nan"))
    why: Optional[str]
    saved: Optional[dict[str, tuple[int, ...]]] = None
    saved_what = ""
    if order != list(range(len(order))):
        why = "the param groups do not number their parameters 0, 1, … in order"
    else:
        state_shapes = {i: s for i, s in enumerate(shapes) if s is not None}
        saved, saved_what = saved_weights(path.parent, torder.adapter) if isinstance(path, Path) else (None, "")
        why = check_against(torder, sizes, wds, state_shapes, torder.shapes, saved=saved, saved_what=saved_what)
    if why is not None:
        return None, f"the HF Trainer's parameter order was not used: {why}"
    return torder.export_names(), (
        f"the optimizer's {len(order)} parameters, keyed by index, are named in the HF Trainer's order "
        f"(create_optimizer: the weight-decay group, then the no-decay group, each in named_parameters() order) "
        f"of {torder.what}: the groups' sizes and weight_decay and every state's shape agree"
        + (f", and {saved_what} holds every name in that shape" if saved is not None else "")
    )


def _tensor(path: Location, t: TensorRef, offsets: dict[str, tuple[int, int]], name: str) -> SourceTensor:
    from .source import file_tensor

    return file_tensor(path, t, offsets, name)


def _number(path: Location, v: Any, offsets: dict[str, tuple[int, int]], what: str) -> Any:
    if isinstance(v, Stub):
        v = v.value
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, TensorRef):
        if v.numel != 1 or v.dtype not in _SCALAR or v.storage is None:
            raise FormatError(f"{what}: a {v.dtype} tensor of shape {tuple(v.shape)}, not a scalar step")
        start, _ = offsets[v.storage.key]
        with open_read(path) as f:
            f.seek(start + v.offset * ITEMSIZE[v.dtype])
            (x,) = struct.unpack(_SCALAR[v.dtype], f.read(ITEMSIZE[v.dtype]))
        return int(x) if isinstance(x, float) and x.is_integer() else x
    raise FormatError(f"{what}: unreadable step {type(v).__name__}")


def torch_optimizer_source(
    where: LocationLike,
    model: Optional[list[tuple[str, tuple[int, ...]]]],
    *,
    model_what: str = "",
    trust_pickles: bool = False,
) -> tuple[Source, dict[str, Any]]:
    """The optimizer state in torch file ``path``: the source (``<name>.exp_avg`` … per parameter with
    state, ``param_<i>.…`` where the index has no name) and the content of ``optimizer_config.json``
    (names not yet prefix-stripped). ``model``: the model's (name, shape) in module order, or None
    where that order is unknown (``model_what`` says why, for the plan). Raises FormatError."""
    from .source import read_screened

    path = as_path(where)
    tf = read_screened(path, trust_pickles)
    sd, where, count = find_optimizer_state(tf.obj)
    if sd is None:
        raise FormatError(f"{path.name} holds no optimizer state dict (`optimizer`, `optimizer_states`)")
    offsets = torchfile.storage_offsets(path)
    state: dict[Any, Any] = sd["state"]
    groups = [g for g in sd["param_groups"] if isinstance(g, dict)]
    notes = [
        f"optimizer state taken from the file's {where}"
        if where != "the file itself"
        else f"{path.name} is an optimizer state_dict()"
    ]
    if count > 1:
        notes.append(f"the file holds {count} optimizers: only the first is exported")
    fqn_keyed = bool(state) and all(isinstance(k, str) and not k.isdigit() for k in state)
    if fqn_keyed:
        order = list(state)
        names = {k: str(k) for k in order}
        gparams = [[str(p) for p in (g.get("params") or [])] for g in groups]
        notes.append("the state is keyed by parameter name")
    else:
        order = [p for g in groups for p in (g.get("params") or [])]
        extra = [k for k in state if k not in order]
        order += extra

        def shape_of(i: Any) -> Optional[tuple[int, ...]]:
            s = state.get(i)
            if not isinstance(s, dict):
                return None
            for k in STATES + tuple(sorted(s)):
                t = s.get(k)
                if isinstance(t, TensorRef) and k != "step":
                    return tuple(t.shape)
            return None

        shapes = [shape_of(i) for i in order]
        by_trainer, trainer_note = (None, None) if extra else _trainer_names(path, groups, order, shapes)
        if trainer_note is not None:
            notes.append(trainer_note)
        if by_trainer is not None:
            names = dict(zip(order, by_trainer))
        else:
            found, why = (None, model_what or "no model beside it") if model is None else align(shapes, model)
            if found is not None and not extra:
                names = dict(zip(order, found))
                notes.append(
                    f"the optimizer's {len(order)} parameters, keyed by index, line up in order and shape with "
                    "the model's parameters: named by them"
                )
            else:
                names = {i: f"param_{i}" for i in order}
                notes.append(
                    f"the optimizer state is keyed by index and could not be named ({why or 'unmatched indices'}): "
                    "its tensors are param_<i>.exp_avg …, i the index in the param groups' params"
                )
        gparams = [[names[p] for p in (g.get("params") or [])] for g in groups]

    tensors: list[SourceTensor] = []
    kinds: list[str] = []
    steps: dict[str, Any] = {}
    for key in order:
        s = state.get(key)
        if not isinstance(s, dict):
            continue
        name = names[key]
        leaves = sorted(s, key=lambda k: (k not in STATES, STATES.index(k) if k in STATES else 0, str(k)))
        for leaf in leaves:
            v = s[leaf]
            if leaf == "step":
                steps[name] = _number(path, v, offsets, f"{name} step")
            elif isinstance(v, TensorRef):
                tensors.append(_tensor(path, v, offsets, f"{name}.{leaf}"))
                if leaf not in kinds:
                    kinds.append(leaf)
    if not tensors:
        raise FormatError(f"the optimizer state in {path.name} holds no tensors (never stepped?)")
    param_groups = []
    for g, params in zip(groups, gparams):
        hyper = {str(k): jsonable(v) for k, v in g.items() if k != "params"}
        gsteps = {steps[p] for p in params if p in steps}
        param_groups.append(hyper | {"step": gsteps.pop() if len(gsteps) == 1 else None, "params": params})
    distinct = {v for v in steps.values() if v is not None}
    with_state = set(names.values())
    no_state = [n for n, _ in (model or []) if n not in with_state] if not fqn_keyed and model is not None else []
    config: dict[str, Any] = {
        "source": "torch-file",
        "optimizer": None,  # state_dict() does not record the optimizer's class
        "step": distinct.pop() if len(distinct) == 1 else None,
        "states": kinds,
        "param_groups": param_groups,
        "frozen_params": no_state if any(not n.startswith("param_") for n in with_state) else [],
        "tied_params": {},
    }
    if config["frozen_params"]:
        notes.append(
            f"{len(no_state)} tensor(s) of the model have no optimizer state (buffers, frozen or never "
            f"stepped parameters; listed as frozen_params in {CONFIG_FILE})"
        )
    notes.append(
        "the optimizer trained the model's own parameters: no separate master (the weights are --component model)"
    )
    return Source(KIND, path, tensors, notes=notes), config
