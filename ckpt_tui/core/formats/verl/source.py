"""A verl FSDP actor folder (``model_world_size_W_rank_R.pt``, ``optim_…``, ``extra_state_…``) as export sources.

verl's ``FSDPCheckpointManager`` saves each rank's sharded state dict with ``torch.save``: FSDP2 (and FSDP1 given a
device mesh) as DTensors, FSDP1 on a process group as ShardedTensors. torch loads neither outside a process group
of the saving size; here the restricted unpickler reads them as inert refs (``unpickle.DTensorRef``,
``ShardedTensorRef``): each rank's local bytes and where they sit in the global tensor. A full tensor is the rank
pieces in order: a dim-0 split is the concatenation of the pieces' byte ranges (streamed, never materialised);
any other split is placed piece by piece with torch (the general path).

The optimizer files are ``optimizer.state_dict()`` of each rank: FSDP2 keeps DTensor ``exp_avg``/``exp_avg_sq``
(assembled like the weights); FSDP1 (``use_orig_params``) keeps each rank's flat 1-D piece of every parameter it
owns, whose concatenation in rank order is the flattened parameter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

from ...dtypes import ITEMSIZE
from ...export.sources import ByteRange, Source, SourceTensor
from ...storage import Location, LocationLike, as_path
from ...types import numel
from .. import FormatError
from ..torch_save import torchfile
from ..unpickle import DTensorRef, ShardedTensorRef, TensorRef

if TYPE_CHECKING:
    from ..deepspeed.optim import Number

RANK_FILE_RE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
KINDS = ("model", "optim", "extra_state")
STATES = ("exp_avg", "exp_avg_sq")
CONFIG_FILE = "optimizer_config.json"


def rank_files(folder: LocationLike) -> dict[str, dict[int, tuple[int, str]]]:
    """kind -> rank -> (world size in the name, file name), from a folder's file names."""
    out: dict[str, dict[int, tuple[int, str]]] = {}
    for p in as_path(folder).iterdir():
        m = RANK_FILE_RE.match(p.name)
        if m:
            out.setdefault(m.group(1), {})[int(m.group(3))] = (int(m.group(2)), p.name)
    return out


@dataclass
class RankFile:
    path: Location
    obj: Any
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)

    def ranges(self, t: TensorRef, what: str) -> tuple[ByteRange, ...]:
        item = ITEMSIZE.get(t.dtype)
        if item is None:
            raise FormatError(f"{what} has unsupported dtype {t.dtype}")
        if t.storage is None or t.storage.key not in self.offsets:
            raise FormatError(f"{self.path.name}: {what} has no storage in the archive", "corrupt")
        if not t.contiguous:
            raise FormatError(f"{self.path.name}: {what} is a non-contiguous view")
        start, size = self.offsets[t.storage.key]
        if (t.offset + t.numel) * item > size:
            raise FormatError(f"{self.path.name}: {what} runs past its storage: the file is corrupt", "corrupt")
        return (ByteRange(str(self.path), start + t.offset * item, t.numel * item),) if t.numel else ()


def _open(folder: Location, kind: str, world: int, trust_pickles: bool) -> list[RankFile]:
    out = []
    for r in range(world):
        p = folder / f"{kind}_world_size_{world}_rank_{r}.pt"
        if not p.is_file():
            raise FormatError(
                f"{p.name} is missing: every rank's {kind} file is needed to rebuild the full tensors", "missing"
            )
        tf = torchfile.read(p)
        if tf.unsafe and not trust_pickles:
            raise FormatError(
                f"{p.name} names code outside the allowlist ({', '.join(sorted(tf.unsafe)[:4])}); "
                "pass --trust-pickles if you trust its origin"
            )
        out.append(RankFile(p, tf.obj, torchfile.storage_offsets(p)))
    return out


def world_of(folder: Location) -> int:
    files = rank_files(folder).get("model") or {}
    worlds = {w for w, _ in files.values()}
    if not worlds:
        raise FormatError(f"{folder.name}: no model_world_size_W_rank_R.pt files")
    if len(worlds) > 1:
        raise FormatError(
            f"{folder.name}: model files of several world sizes ({sorted(worlds)}): remove the stale ones"
        )
    return worlds.pop()


def _full(name: str, pieces: list[tuple[RankFile, Any]]) -> SourceTensor:
    """One full tensor from every rank's entry ``name`` (a DTensorRef, ShardedTensorRef or plain TensorRef)."""
    first = pieces[0][1]
    if isinstance(first, DTensorRef):
        return _from_dtensors(name, pieces)
    if isinstance(first, ShardedTensorRef):
        return _from_sharded(name, pieces)
    if isinstance(first, TensorRef):  # a plain tensor: replicated on every rank (buffers)
        rf, t = pieces[0]
        return SourceTensor(name, t.shape, t.dtype, ranges=rf.ranges(t, name))
    raise FormatError(f"{name}: not a tensor ({type(first).__name__})")


def _from_dtensors(name: str, pieces: list[tuple[RankFile, Any]]) -> SourceTensor:
    d0: DTensorRef = pieces[0][1]
    if len(d0.placements) != 1:
        raise FormatError(
            f"{name}: a DTensor on a {len(d0.placements)}-D mesh ({d0.placements}); only a 1-D FSDP mesh is supported"
        )
    kind, dim = d0.placements[0]
    for rf, d in pieces:
        if not isinstance(d, DTensorRef) or d.local is None or d.shape != d0.shape or d.placements != d0.placements:
            raise FormatError(f"{rf.path.name}: {name} does not match rank 0's DTensor (shape or placement)", "corrupt")
    if kind == "replicate":
        rf, d = pieces[0]
        return SourceTensor(name, d0.shape, d0.dtype, ranges=rf.ranges(d.local, name))
    if kind != "shard" or dim is None:
        raise FormatError(f"{name}: DTensor placement {kind} is not supported (only Shard and Replicate)")
    order = sorted(pieces, key=lambda p: (p[1].coordinate or (0,))[0])
    offsets, at = [], 0
    for rf, d in order:
        off = [0] * len(d0.shape)
        off[dim] = at
        offsets.append(tuple(off))
        at += d.local.shape[dim] if d.local.shape else 0
    if at != d0.shape[dim]:
        raise FormatError(f"{name}: the ranks' shards cover {at} of {d0.shape[dim]} rows along dim {dim}", "corrupt")
    return _assemble(name, d0.shape, d0.dtype, [(off, rf, d.local) for off, (rf, d) in zip(offsets, order)])


def _from_sharded(name: str, pieces: list[tuple[RankFile, Any]]) -> SourceTensor:
    s0: ShardedTensorRef = pieces[0][1]
    held = []
    for rf, s in pieces:
        if not isinstance(s, ShardedTensorRef) or s.shape != s0.shape:
            raise FormatError(f"{rf.path.name}: {name} does not match rank 0's ShardedTensor (shape)", "corrupt")
        for sh in s.local_shards:
            if sh.tensor is None or tuple(sh.tensor.shape) != sh.sizes:
                raise FormatError(
                    f"{rf.path.name}: {name} has a shard whose bytes do not match its metadata", "corrupt"
                )
            held.append((sh.offsets, rf, sh.tensor))
    covered = sum(numel(t.shape) for _, _, t in held)
    if covered != numel(s0.shape):
        raise FormatError(f"{name}: the ranks' shards hold {covered} of {numel(s0.shape)} elements", "corrupt")
    return _assemble(name, s0.shape, s0.dtype, sorted(held, key=lambda h: h[0]))


def _assemble(
    name: str, shape: tuple[int, ...], dtype: str, parts: list[tuple[tuple[int, ...], RankFile, TensorRef]]
) -> SourceTensor:
    """Parts (offsets, file, local tensor) of a tensor: byte ranges when they split it along dim 0 only, in order."""
    rest = tuple(shape[1:])
    row = 0
    dim0 = True
    for off, _, t in parts:
        if any(off[1:]) or tuple(t.shape[1:]) != rest or off[0] != row or not t.contiguous:
            dim0 = False
            break
        row += t.shape[0] if t.shape else 0
    if dim0 and row == (shape[0] if shape else 0):
        rng: tuple[ByteRange, ...] = ()
        for _, rf, t in parts:
            rng += rf.ranges(t, name)
        return SourceTensor(name, tuple(shape), dtype, ranges=rng)

    def load() -> object:
        import torch

        from ...export.sources import read_ranges

        full = torch.empty(tuple(shape), dtype=getattr(torch, dtype))
        for off, rf, t in parts:
            data = bytearray(read_ranges(rf.ranges(t, name)))
            piece = torch.frombuffer(data, dtype=full.dtype).reshape(t.shape) if data else torch.empty(t.shape)
            full[tuple(slice(o, o + n) for o, n in zip(off, t.shape))] = piece
        return full

    return SourceTensor(name, tuple(shape), dtype, load=load, note="shards split off dim 0: placed with torch")


def _model_files(folder: Location, trust_pickles: bool) -> tuple[int, list[RankFile]]:
    world = world_of(folder)
    files = _open(folder, "model", world, trust_pickles)
    for rf in files:
        if not isinstance(rf.obj, dict):
            raise FormatError(f"{rf.path.name} does not hold a state dict")
    return world, files


def fsdp_kind(obj: Any) -> Optional[str]:
    """ "DTensor" | "ShardedTensor" | None: what a rank's state dict holds."""
    for v in obj.values() if isinstance(obj, dict) else ():
        if isinstance(v, DTensorRef):
            return "DTensor"
        if isinstance(v, ShardedTensorRef):
            return "ShardedTensor"
    return None


def verl_source(where: LocationLike, *, strip_prefix: Optional[str] = None, trust_pickles: bool = False) -> Source:
    """The full model weights of a verl actor folder, from every rank's model file."""
    folder = as_path(where)
    world, files = _model_files(folder, trust_pickles)
    keys = list(files[0].obj)
    tensors = []
    for k in keys:
        missing = [rf.path.name for rf in files if k not in rf.obj]
        if missing:
            raise FormatError(f"{missing[0]} lacks {k}, which rank 0 holds", "corrupt")
        t = _full(str(k), [(rf, rf.obj[k]) for rf in files])
        if strip_prefix and t.name.startswith(strip_prefix):
            t.name = t.name[len(strip_prefix) :]
        tensors.append(t)
    src = Source("verl", folder, tensors)
    kind = fsdp_kind(files[0].obj)
    src.notes.append(f"assembled from {world} ranks' {kind or 'tensor'} shards (verl FSDP rank files)")
    return src


# ---------------------------------------------------------------- optimizer


def _scalar(rf: RankFile, v: Any, what: str) -> Number:
    from ...export.sources import read_ranges
    from ..deepspeed.optim import step_value

    return step_value(v, what, lambda ref: read_ranges(rf.ranges(ref, what)))


def verl_optimizer_source(where: LocationLike, trust_pickles: bool = False) -> tuple[Source, dict[str, Any], list[str]]:
    """``p.exp_avg`` and ``p.exp_avg_sq`` of every parameter ``p`` (names as the model export has them), the
    content of ``optimizer_config.json``, and the model export's names. Raises ValueError/FormatError."""
    from ..deepspeed.optim import jsonable

    folder = as_path(where)
    world, models = _model_files(folder, trust_pickles)
    optims = _open(folder, "optim", world, trust_pickles)
    names = [str(k) for k in models[0].obj]
    per_rank = []
    for rf in optims:
        sd = rf.obj
        if (
            not isinstance(sd, dict)
            or not isinstance(sd.get("state"), dict)
            or not isinstance(sd.get("param_groups"), list)
        ):
            raise ValueError(f"{rf.path.name}: not an optimizer state_dict (no state / param_groups)")
        per_rank.append(sd["state"])
    groups = optims[0].obj["param_groups"]
    ids = [i for g in groups if isinstance(g, dict) for i in (g.get("params") or [])]
    # optimizer.state_dict() numbers the parameters in model.parameters() order: the model state dict's order
    # (verl's actor models hold no persistent buffers, so every entry is a parameter)
    if sorted(ids) != list(range(len(names))):
        raise ValueError(
            f"the optimizer numbers {len(ids)} parameters but the model files hold {len(names)} tensors: "
            "cannot tell which state belongs to which parameter"
        )
    model_src = verl_source(folder, trust_pickles=trust_pickles)
    shape_of = {t.name: (t.shape, t.dtype) for t in model_src.tensors}
    out: list[SourceTensor] = []
    steps: dict[int, Optional[Number]] = {}
    for i, name in enumerate(names):
        entries = [(rf, st.get(i, st.get(str(i)))) for rf, st in zip(optims, per_rank)]
        held = [(rf, e) for rf, e in entries if isinstance(e, dict)]
        if not held:
            continue  # no state: the parameter never stepped (frozen)
        seen = {_scalar(rf, e["step"], f"{rf.path.name} param {i} step") for rf, e in held if "step" in e}
        if len(seen) > 1:
            raise ValueError(f"the ranks disagree on the step of {name}: {sorted(seen)}")
        steps[i] = seen.pop() if seen else None
        for key in STATES:
            vals = [(rf, e.get(key)) for rf, e in held]
            if any(v is None for _, v in vals):
                raise ValueError(
                    f"the optimizer state of {name} has no {key} on every rank that holds it: only "
                    "Adam-style optimizers (exp_avg, exp_avg_sq) are exported"
                )
            if isinstance(vals[0][1], DTensorRef):
                if len(vals) != world:
                    raise ValueError(f"{name}.{key}: a DTensor missing on some ranks")
                out.append(_full(f"{name}.{key}", vals))
                continue
            # FSDP1 use_orig_params: each rank's flat piece, in rank order, is the flattened parameter
            shape, _dtype = shape_of[name]
            rng: tuple[ByteRange, ...] = ()
            total = 0
            for rf, v in vals:
                if not isinstance(v, TensorRef) or len(v.shape) > 1:
                    raise ValueError(f"{rf.path.name}: {name}.{key} is not a flat tensor piece ({type(v).__name__})")
                rng += rf.ranges(v, f"{name}.{key}")
                total += v.numel
            if total != numel(shape):
                raise ValueError(f"{name}.{key}: the ranks' pieces hold {total} of {numel(shape)} elements")
            # every piece is a TensorRef (checked above)
            out.append(SourceTensor(f"{name}.{key}", tuple(shape), cast(TensorRef, vals[0][1]).dtype, ranges=rng))
    pgroups = []
    for g in groups:
        if not isinstance(g, dict):
            continue
        idx = [i for i in (g.get("params") or []) if isinstance(i, int)]
        gs = {steps.get(i) for i in idx if i in steps}
        pgroups.append(
            {str(k): jsonable(v) for k, v in g.items() if k != "params"}
            | {"step": gs.pop() if len(gs) == 1 else None, "params": [names[i] for i in idx]}
        )
    distinct = {s for s in steps.values() if s is not None}
    frozen = [names[i] for i in range(len(names)) if i not in steps]
    config: dict[str, Any] = {
        "source": "verl",
        "fsdp": fsdp_kind(models[0].obj),
        "dp_world_size": world,
        "optimizer": None,
        "step": distinct.pop() if len(distinct) == 1 else None,
        "states": list(STATES),
        "param_groups": pgroups,
        "frozen_params": frozen,
        "tied_params": {},
    }
    notes = [
        "verl keeps no fp32 masters apart from its fp32 FSDP weights: no <name>.master (the weights are "
        "--component model)"
    ]
    if frozen:
        notes.append(f"{len(frozen)} param(s) have no optimizer state (listed in {CONFIG_FILE})")
    return Source("verl-optimizer", folder, out, notes=notes), config, [t.name for t in model_src.tensors]


def optimizer_reference_tensors(
    where: LocationLike, cfg: dict[str, Any], shapes: dict[str, tuple[int, ...]]
) -> Iterator[tuple[str, Any]]:
    """(exported name, tensor) of a verl actor folder's optimizer state read by torch (``verify``; only after the
    safety screen): ``torch.load`` of every rank's optim file; DTensor states joined as verl's merger joins the
    weights (``torch.cat`` of the local tensors along the Shard dim), FSDP1's flat pieces ``torch.cat`` in rank
    order and reshaped to ``shapes`` (the exported tensor's). Parameters are named as ``cfg``'s param groups
    (the export's optimizer_config.json) name them, index for index."""
    import logging

    import torch
    from torch.distributed.tensor import DTensor

    folder = as_path(where)
    world = world_of(folder)
    mesh_log = logging.getLogger("torch.distributed.device_mesh")  # unpickled before any process group: harmless
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    files = [folder / f"optim_world_size_{world}_rank_{r}.pt" for r in range(world)]
    from .. import screen

    screen.require(files, loader="torch.load")  # each exact file, as torch.load reads it, before it unpickles
    try:
        sds = [screen.torch_load(f, map_location="cpu") for f in files]
    finally:
        mesh_log.setLevel(level)
    for g_ref, g_cfg in zip(sds[0]["param_groups"], cfg["param_groups"]):
        for idx, name in zip(g_ref["params"], g_cfg["params"]):
            held = [sd["state"][idx] for sd in sds if idx in sd["state"]]
            for key in STATES:
                parts = [s[key] for s in held if key in s]
                if not parts:
                    continue
                if isinstance(parts[0], DTensor):
                    (pl,) = parts[0].placements
                    t = (
                        torch.cat([p._local_tensor for p in parts], dim=pl.dim)
                        if pl.is_shard()
                        else parts[0]._local_tensor
                    )
                else:
                    t = torch.cat([p.reshape(-1) for p in parts]).reshape(shapes[f"{name}.{key}"])
                yield f"{name}.{key}", t
