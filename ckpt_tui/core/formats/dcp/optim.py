"""The optimizer state of a torch.distributed.checkpoint folder (``--component optimizer``).

HF Trainer / Accelerate FSDP (``checkpoint-N/optimizer_0/``) and FSDP2 ``get_state_dict`` saves write
the optimizer state dict FQN-keyed (``get_optimizer_state_dict`` / FSDP's ``optim_state_dict``): DCP
flattens it to ``<top>.state.<fqn>.<key>`` tensors (``exp_avg``, ``exp_avg_sq``, a 0-d ``step``) and
``<top>.param_groups.<g>.<hyper>`` objects (torch.save blobs: lr, betas, eps, weight_decay, params as
FQNs), with ``planner_data`` giving each key's path, so no name is cut by text. The tensors are byte
ranges of the ``.distcp`` files (:func:`.source.dcp_tensors`); the few small objects are read
through the restricted unpickler. Output as the DeepSpeed source has it (:mod:`..deepspeed.optim`):
``<fqn>.exp_avg``, ``<fqn>.exp_avg_sq`` in ``optimizer.safetensors``, step and param groups in
``optimizer_config.json``. FSDP trains the fp32 parameters themselves: there is no separate master.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any, Callable, Iterator, Optional, cast

from ...export.sources import Source, SourceTensor, read_bytes
from ...names import OPTIMIZER_KEYS
from ...storage import Location, LocationLike, as_path, open_read
from .. import FormatError, screen
from ..deepspeed.optim import CONFIG_FILE, STATES, jsonable
from ..torch_save.torchfile import FileWindow
from ..unpickle import Record, Stub, safe_loads
from . import reader as dcpfmt
from .extensions import MAX_OBJECT, decompress

KIND = "dcp-optimizer"
_SCALAR = {"float32": "<f", "float64": "<d", "int64": "<q", "int32": "<i"}


def _d(o: object) -> dict[str, Any]:
    return o.__dict__ if isinstance(o, (Stub, Record)) else {}


def _paths(info: dcpfmt.DcpInfo) -> dict[str, tuple[str, ...]]:
    """Every key's path (planner_data; else the dotted key, whose fqn part is rejoined below). A
    flattened optimizer state dict (torchtitan: ``("optimizer", "state.<fqn>.exp_avg")``,
    ``("optimizer", "param_groups.<fqn>.lr")``) is unfolded to ``(…, "state", <fqn>, "exp_avg")`` and
    ``(…, "param_groups", <fqn>, "lr")``: state leaves and hyper-parameter names have no dot."""
    out = {}
    for k in info.keys:
        path = info.planner_data.get(k) or tuple(k.split("."))
        last = path[-1] if path else ""
        for what in ("state", "param_groups"):
            if last.startswith(what + ".") and last.count(".") >= 2:
                fqn, leaf = last[len(what) + 1 :].rsplit(".", 1)
                path = path[:-1] + (what, fqn, leaf)
        out[k] = path
    return out


def _optimizer_top(t: str) -> bool:
    """A container of optimizer state: ``optimizer``, ``optim`` …, Lightning's ``optimizer_0``."""
    return t in OPTIMIZER_KEYS or (t.startswith("optimizer_") and t[len("optimizer_") :].isdigit())


def _split(path: tuple[str, ...], what: str) -> Optional[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(container, rest) where ``path`` is ``container + (what,) + rest`` and the container is empty or
    optimizer keys only (``optimizer``, ``optim``)."""
    for i, p in enumerate(path):
        if p == what:
            top = path[:i]
            if all(_optimizer_top(t) for t in top) and len(path) > i + 1:
                return top, path[i + 1 :]
            return None
    return None


def has_optimizer_state(info: dcpfmt.DcpInfo) -> bool:
    """Does this DCP hold an FQN-keyed optimizer state (``…state.<fqn>.exp_avg``)?"""
    for path in _paths(info).values():
        sp = _split(path, "state")
        if sp and sp[1][-1] in STATES:
            return True
    return False


def params_without_state(where: LocationLike, info: dcpfmt.DcpInfo) -> list[str]:
    """The parameters the optimizer's param_groups list that its state has no entry for: never given a gradient
    (torch's optimizers create a parameter's state at its first step). Reads the groups' ``params`` lists only (a
    flattened state dict lists each parameter's hyper-parameters by name: nothing to read). [] when it holds no
    FQN-keyed state, or its lists cannot be read safely."""
    state: set[str] = set()
    listed: list[str] = []
    params_keys: list[str] = []
    for key, path in _paths(info).items():
        sp = _split(path, "state")
        if sp and len(sp[1]) >= 2:
            state.add(".".join(sp[1][:-1]))
            continue
        sp = _split(path, "param_groups")
        if sp and len(sp[1]) == 2:
            if str(sp[1][0]).isdigit():
                if sp[1][1] == "params":
                    params_keys.append(key)
            else:
                listed.append(str(sp[1][0]))
    if not state:
        return []
    if params_keys:
        try:
            objects = read_objects(as_path(where), set(params_keys))
        except (FormatError, OSError, zipfile.BadZipFile):
            return []
        for k in params_keys:
            v = objects.get(k)
            if isinstance(v, (list, tuple)):
                listed.extend(str(p) for p in v)
    return [p for p in dict.fromkeys(listed) if p not in state]


class UnsafeObject(FormatError):
    """A non-tensor entry whose pickle names code outside the allowlist (``globals``): read, nothing run."""

    def __init__(self, key: str, names: list[str]) -> None:
        super().__init__(f"{key} names code outside the allowlist: {', '.join(names)}")
        self.globals = names


def read_objects(folder: Location, keys: set[str]) -> dict[str, Any]:
    """The non-tensor objects ``keys`` (torch.save blobs in the .distcp files), read through the
    restricted unpickler: nothing is executed."""
    glob_meta, rank_metas = dcpfmt.metadata_files(folder)
    where: dict[str, dict[str, Any]] = {}
    for m in [glob_meta] if glob_meta else rank_metas:
        meta, _, _ = dcpfmt.read_metadata_file(m)
        for idx, st in (_d(meta).get("storage_data") or {}).items():
            fqn = _d(idx).get("fqn")
            if fqn in keys:
                where.setdefault(fqn, _d(st))
    out = {}
    for key, st in where.items():
        length = int(st.get("length") or 0)
        if length > MAX_OBJECT:
            raise FormatError(f"{key}: {length:,} bytes, too large to be a hyper-parameter")
        path = folder / str(st["relative_path"])
        descriptors = tuple(str(d) for d in st.get("transform_descriptors") or ())
        with open_read(path) as f:
            if descriptors:  # torch's ZStandard extension: the torch.save bytes, compressed (bounded inflation)
                f.seek(int(st["offset"]))
                raw = f.read(length)
                if len(raw) < length:
                    raise FormatError(f"{key}: {path.name} ends inside it (truncated)")
                window: Any = io.BytesIO(decompress(raw, descriptors, MAX_OBJECT, key))
            else:
                window = FileWindow(f, int(st["offset"]), length)
            with zipfile.ZipFile(window) as zf:
                pkl = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
                if not pkl or pkl[0].file_size > MAX_OBJECT:
                    raise FormatError(f"{key}: not a torch.save object")
                up = safe_loads(zf.read(pkl[0]), persistent=True)
        if up.unsafe:
            raise UnsafeObject(key, sorted(up.unsafe))
        out[key] = up.obj
    return out


def _number(t: SourceTensor, what: str) -> Any:
    """The value of a 0-d (or one-element) tensor, from its few bytes."""
    import struct

    if t.numel != 1 or t.dtype not in _SCALAR:
        raise FormatError(f"{what}: a {t.dtype} tensor of shape {t.shape}, not a scalar")
    if t.ranges is None:
        # no ranges: a load, the general path (a chunked 0-d tensor: never seen, but torch reads it)
        x = cast(Callable[[], Any], t.load)().item()
    else:
        (x,) = struct.unpack(_SCALAR[t.dtype], read_bytes(t))
    return int(x) if isinstance(x, float) and x.is_integer() else x


def dcp_optimizer_source(where: LocationLike, model_names: Optional[list[str]] = None) -> tuple[Source, dict[str, Any]]:
    """The optimizer state of DCP ``folder``: the source (``<fqn>.<state>`` per parameter with state) and
    the content of ``optimizer_config.json`` (names not yet prefix-stripped). ``model_names``: the model
    export's names of the same checkpoint (which of them have no optimizer state is said in the
    config). Raises FormatError with the reason."""
    from .source import dcp_tensors, refuse_extensions

    folder = as_path(where)
    info = dcpfmt.read(folder)
    if info.unsafe:
        raise FormatError(f".metadata names code outside the allowlist: {', '.join(sorted(info.unsafe))}")
    refuse_extensions(info)
    paths = _paths(info)
    tensor_keys = {t.name for t in info.tensors}
    state: dict[str, dict[str, str]] = {}  # fqn -> state key -> DCP key
    groups: dict[int, dict[str, str]] = {}  # group index -> hyper-parameter -> DCP key
    per_param: dict[str, dict[str, str]] = {}  # flattened: fqn -> hyper-parameter -> DCP key
    tops: set[tuple[str, ...]] = set()
    for key, path in paths.items():
        sp = _split(path, "state")
        if sp and len(sp[1]) >= 2:
            tops.add(sp[0])
            fqn, leaf = ".".join(sp[1][:-1]), sp[1][-1]
            state.setdefault(fqn, {})[leaf] = key
            continue
        sp = _split(path, "param_groups")
        if sp and len(sp[1]) == 2 and str(sp[1][0]).isdigit():
            tops.add(sp[0])
            groups.setdefault(int(sp[1][0]), {})[sp[1][1]] = key
        elif sp and len(sp[1]) == 2:
            tops.add(sp[0])
            per_param.setdefault(sp[1][0], {})[sp[1][1]] = key
    if not state:
        raise FormatError("this DCP folder holds no FQN-keyed optimizer state (no `state.<param>.exp_avg`)")
    if len(tops) > 1:
        raise FormatError(
            f"several optimizers in one DCP ({', '.join('.'.join(t) or '(top)' for t in sorted(tops))}); "
            "ckpt-tui exports one"
        )
    # tensors: per parameter, exp_avg, exp_avg_sq, then any other tensor state (not the step)
    names: dict[str, str] = {}
    steps: dict[str, str] = {}
    kinds: list[str] = []
    for fqn, keys in state.items():
        for leaf, key in sorted(
            keys.items(), key=lambda kv: (kv[0] not in STATES, STATES.index(kv[0]) if kv[0] in STATES else 0, kv[0])
        ):
            if key not in tensor_keys:
                continue
            if leaf == "step":
                steps[key] = fqn
                continue
            names[key] = f"{fqn}.{leaf}"
            if leaf not in kinds:
                kinds.append(leaf)
    if not names:
        raise FormatError("the optimizer state holds no tensors (exp_avg, exp_avg_sq)")
    tensors = dcp_tensors(folder, info, names)
    step_values: dict[str, Any] = {}
    for t in dcp_tensors(folder, info, {k: f"{fqn}.step" for k, fqn in steps.items()}):
        step_values[t.name[: -len(".step")]] = _number(t, t.name)
    # scalar steps stored as objects (older torch: a Python number)
    obj_keys = {key for keys in state.values() for leaf, key in keys.items() if key not in tensor_keys}
    obj_keys |= {key for hyper in (*groups.values(), *per_param.values()) for key in hyper.values()}
    objects = read_objects(folder, obj_keys)
    for fqn, keys in state.items():
        if "step" in keys and keys["step"] in objects:
            v = objects[keys["step"]]
            step_values[fqn] = v.value if isinstance(v, Stub) else v
    # tensor hyper-parameters (a tensor lr): their value
    group_tensors = {
        key: key for hyper in (*groups.values(), *per_param.values()) for key in hyper.values() if key in tensor_keys
    }
    for t in dcp_tensors(folder, info, group_tensors):
        objects[t.name] = _number(t, t.name)

    param_groups: list[dict[str, Any]] = []
    for gi in sorted(groups):
        hyper = {h: jsonable(objects.get(k)) for h, k in groups[gi].items() if h != "params"}
        params = objects.get(groups[gi].get("params", ""), [])
        params = [str(p) for p in params] if isinstance(params, (list, tuple)) else []
        gsteps = {step_values.get(p) for p in params if p in step_values}
        param_groups.append(hyper | {"step": gsteps.pop() if len(gsteps) == 1 else None, "params": params})
    if per_param and not groups:  # flattened: the parameters whose hyper-parameters are equal share a group
        import json

        by_hyper: dict[str, dict[str, Any]] = {}
        for fqn, hyper_keys in per_param.items():
            hyper = {h: jsonable(objects.get(k)) for h, k in hyper_keys.items()}
            g = by_hyper.setdefault(json.dumps(hyper, sort_keys=True), hyper | {"step": None, "params": []})
            g["params"].append(fqn)
        for g in by_hyper.values():
            gsteps = {step_values.get(p) for p in g["params"] if p in step_values}
            g["step"] = gsteps.pop() if len(gsteps) == 1 else None
            param_groups.append(g)
    if not param_groups:
        param_groups = [{"step": None, "params": list(state)}]
    distinct = set(step_values.values())
    with_state = set(state)
    no_state = [n for n in (model_names or []) if n not in with_state]
    # state under a name the model does not have: a fused parameter (torchtitan's `….qkv_linear.wqkv.weight`)
    # whose model state dict splits it (`….qkv_linear.wq.weight`, wk, wv). The model's tensors under the same
    # parent module are covered by it, not frozen.
    fused = sorted(with_state - set(model_names or [])) if model_names else []
    fused_parents = {_parent_module(n) for n in fused}
    covered = [n for n in no_state if _parent_module(n) in fused_parents]
    no_state = [n for n in no_state if n not in set(covered)]
    config: dict[str, Any] = {
        "source": "torch-dcp",
        "optimizer": None,  # a DCP does not record the optimizer's class
        "step": distinct.pop() if len(distinct) == 1 else None,
        "states": kinds,
        "param_groups": param_groups,
        "frozen_params": no_state,
        "tied_params": {},
    }
    notes = [
        f"FQN-keyed optimizer state of {len(state)} parameter(s) (<name>.{', <name>.'.join(kinds)}); "
        "FSDP trains the fp32 parameters themselves: no separate master (the weights are --component model)"
    ]
    if covered:
        notes.append(
            f"{len(fused)} parameter(s) of the optimizer are not tensors of the model's state dict (e.g. "
            f"{fused[0]}): fused parameters the model saves split; they hold the state of {len(covered)} "
            "model tensor(s) under the same module, which are not frozen"
        )
    if no_state:
        notes.append(
            f"{len(no_state)} tensor(s) of the model have no optimizer state (buffers, frozen or never "
            f"stepped parameters; listed as frozen_params in {CONFIG_FILE})"
        )
    return Source(KIND, folder, tensors, notes=notes), config


def _parent_module(fqn: str) -> str:
    """`a.b.wqkv.weight` -> `a.b`: the module holding the parameter's module."""
    return fqn.rsplit(".", 2)[0] if fqn.count(".") >= 2 else ""


def state_tensor_keys(info: dcpfmt.DcpInfo) -> dict[str, str]:
    """DCP key -> ``<fqn>.<state>`` of every optimizer state tensor but the step."""
    tensor_keys = {t.name for t in info.tensors}
    out = {}
    for key, path in _paths(info).items():
        sp = _split(path, "state")
        if sp and len(sp[1]) >= 2 and key in tensor_keys and sp[1][-1] != "step":
            out[key] = f"{'.'.join(sp[1][:-1])}.{sp[1][-1]}"
    return out


def reference_tensors(folder: LocationLike, batch_bytes: int = 256 << 20) -> Iterator[tuple[str, Any]]:
    """(``<fqn>.<state>``, tensor) of the optimizer state of DCP ``folder``, read by torch's own DCP
    loader a batch of at most ``batch_bytes`` at a time (``ckpt-tui verify``)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    info = dcpfmt.read(as_path(folder))
    names = state_tensor_keys(info)
    size = {t.name: t.nbytes for t in info.tensors}
    batch: list[str] = []

    def load(keys: list[str]) -> Iterator[tuple[str, Any]]:
        sd: dict[str, Any] = {}
        _load_state_dict(
            sd,
            storage_reader=screen.dcp_reader(folder),  # metadata screened, unpickled by us
            planner=_EmptyStateDictLoadPlanner(keys=set(keys)),
            no_dist=True,
        )
        flat, _ = flatten_state_dict(sd)
        for k in keys:
            yield names[k], flat[k]

    total = 0
    for key in names:
        if batch and total + size[key] > batch_bytes:
            yield from load(batch)
            batch, total = [], 0
        batch.append(key)
        total += size[key]
    if batch:
        yield from load(batch)
