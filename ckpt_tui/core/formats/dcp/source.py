"""Weights of a torch.distributed.checkpoint folder as export sources.

Fast path (checked per tensor): every chunk is a torch.save blob (TORCH_SAVE format, no
extensions) holding one contiguous tensor, and chunks split the tensor only along dim 0 — then
the full tensor is the concatenation of the chunks' raw storage bytes, located from each blob's
zip headers. Anything else (tensor-parallel/2-D splits, safetensors-format DCP, compressed
extensions) takes the general path: torch's own DCP loader, one tensor at a time, into a
pre-allocated tensor.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator, Optional, Union

from ...dtypes import ITEMSIZE
from ...export.sources import ByteRange, Source, SourceTensor
from ...names import OPTIMIZER_KEYS, OPTIMIZER_STATE_KEYS, STATE_DICT_WRAPPERS, TRAINING_STATE_KEYS
from ...storage import Location, LocationLike, as_path, open_read
from ...types import TensorInfo
from .. import FormatError, screen
from ..torch_save.torchfile import storage_offsets
from ..unpickle import Record, Stub, TensorRef, safe_loads
from . import reader as dcpfmt

if TYPE_CHECKING:
    from ..safetensors.header import SafetensorsHeader

# the top-level keys that are not the model: optimizer and training state, a flat optimizer state dict
NON_MODEL_TOP = OPTIMIZER_KEYS | TRAINING_STATE_KEYS | OPTIMIZER_STATE_KEYS


def _d(o: object) -> dict[str, Any]:
    return o.__dict__ if isinstance(o, (Stub, Record)) else {}


def model_names(info: dcpfmt.DcpInfo, strip_prefix: Optional[str] = None) -> dict[str, str]:
    """Flattened DCP key -> output name, for the model's tensors only.

    Unwraps a single top-level container by structure (planner_data), the way accelerate
    merge-weights does, never by cutting text: FSDP2's own ``model.embed_tokens.weight`` stays.
    """
    paths = {t.name: info.planner_data.get(t.name) or tuple(t.name.split(".")) for t in info.tensors}
    tops = {p[0] for p in paths.values()}
    out: dict[str, str] = {}
    if len(tops) == 1 and all(len(p) > 1 for p in paths.values()):
        out = {k: ".".join(p[1:]) for k, p in paths.items()}
    else:
        cont = [c for c in STATE_DICT_WRAPPERS if c in tops and all(len(p) > 1 for p in paths.values() if p[0] == c)]
        if cont:
            c = cont[0]
            out = {k: ".".join(p[1:]) for k, p in paths.items() if p[0] == c}
        else:  # model keys at top level beside optimizer/scheduler/... (torchtitan)
            out = {k: ".".join(p) for k, p in paths.items() if p[0] not in NON_MODEL_TOP}
    if strip_prefix:
        out = {k: (v[len(strip_prefix) :] if v.startswith(strip_prefix) else v) for k, v in out.items()}
    return out


def output_tensors(
    folder: Location, info: dcpfmt.DcpInfo, strip_prefix: Optional[str] = None
) -> list[tuple[str, str, Optional[int]]]:
    """(DCP key, output name, layer) for every model tensor an export writes. ``layer`` is None for a tensor
    written whole; for the stacked layer tensors of a Megatron-Core torch_dist checkpoint (``decoder.layers.X``
    with a leading layer dimension) each layer is its own output tensor ``decoder.layers.{i}.X``."""
    names = model_names(info, strip_prefix)
    stacked = dcpfmt.megatron_stacked(info) if dcpfmt.is_megatron_dist(folder) else {}
    out: list[tuple[str, str, Optional[int]]] = []
    for key, name in names.items():
        if key in stacked:
            prefix, rest, n = stacked[key]
            head = name[: len(name) - len(key) + len(prefix)] if name.endswith(key) else prefix
            out += [(key, f"{head}{i}.{rest}", i) for i in range(n)]
        else:
            out.append((key, name, None))
    return out


def dcp_source(where: LocationLike, *, strip_prefix: Optional[str] = None, force_general: bool = False) -> Source:
    folder = as_path(where)
    info = dcpfmt.read(folder)
    if info.unsafe:
        raise FormatError(f".metadata names code outside the allowlist: {', '.join(sorted(info.unsafe))}")
    refuse_extensions(info)
    outputs = output_tensors(folder, info, strip_prefix)
    if not outputs:
        raise FormatError("this DCP folder holds no model tensors (only optimizer or other state)")
    refuse_gaps(info, {k for k, _, _ in outputs})
    notes = []
    stacked = {k for k, _, layer in outputs if layer is not None}
    if stacked:
        notes.append(
            f"Megatron-Core torch_dist: {len(stacked)} tensors stacked over the layers (decoder.layers.X) "
            "written one per layer as decoder.layers.{i}.X, tensor-parallel shards whole; the names are the "
            "checkpoint's keys (megatron's local layer spec loads its input_layernorm/pre_mlp_layernorm from "
            "self_attention.linear_qkv.layer_norm_*/mlp.linear_fc1.layer_norm_*)"
        )
    return Source("dcp", folder, dcp_tensors(folder, info, outputs, force_general=force_general), notes=notes)


def refuse_extensions(info: dcpfmt.DcpInfo) -> None:
    """FormatError, one line, where the folder's items are encoded by extensions that cannot be read here (zstd
    without `zstandard`): said before anything is loaded, not from deep in torch's reader."""
    from .extensions import problem

    reason = problem(info.transforms)
    if reason is not None:
        raise FormatError(reason)


def refuse_gaps(info: dcpfmt.DcpInfo, keys: Collection[str]) -> None:
    """FormatError where a tensor of ``keys`` has chunks that leave part of it unwritten: torch's loader would fill
    that part from ``torch.empty``, so no export or reference read of it is ever right."""
    gaps = [k for k in info.chunk_gaps if k in keys]
    if gaps:
        raise FormatError(
            f".metadata gives {len(gaps)} tensor(s) chunks that leave part of them unwritten "
            f"({', '.join(gaps[:8])}): no file holds those values (dcp-chunk-gap)"
        )


def _checked_storage(key: str, st: dict[str, Any]) -> dict[str, Any]:
    """A storage entry whose offset and length are non-negative integers (torch's reader would seek or read a
    negative length: a traceback, not a message)."""
    off, length = st.get("offset"), st.get("length")
    if type(off) is not int or type(length) is not int or off < 0 or length < 0:
        raise FormatError(
            f".metadata places a chunk of {key!r} at a negative or non-integer offset or length "
            f"({off!r}, {length!r}) in {st.get('relative_path')!r}: the metadata is corrupt"
        )
    return st


def dcp_tensors(
    folder: Location,
    info: dcpfmt.DcpInfo,
    names: Union[list[tuple[str, str, Optional[int]]], dict[str, str]],
    *,
    force_general: bool = False,
) -> list[SourceTensor]:
    """The DCP tensors ``names`` of ``folder`` as source tensors: byte ranges where the chunks allow, else torch's
    DCP loader one tensor at a time. ``names``: flattened key -> output name, or (key, output name, layer) triples
    (:func:`output_tensors`: one layer of a Megatron-Core stacked tensor when ``layer`` is not None)."""
    outputs = list(names) if isinstance(names, list) else [(k, v, None) for k, v in names.items()]
    keys = {k for k, _, _ in outputs}
    glob_meta, rank_metas = dcpfmt.metadata_files(folder)
    metas = [glob_meta] if glob_meta else rank_metas
    chunks: dict[str, list[Any]] = {}
    storage: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
    for m in metas:
        meta, _, _ = dcpfmt.read_metadata_file(m)
        sdm = _d(meta).get("state_dict_metadata") or {}
        for key, md in sdm.items():
            if key in keys:
                chunks.setdefault(key, []).extend(_d(md).get("chunks") or [])
        for idx, st in (_d(meta).get("storage_data") or {}).items():
            di = _d(idx)
            if di.get("fqn") in keys:
                storage[(di["fqn"], tuple(di.get("offset") or ()))] = _checked_storage(di["fqn"], _d(st))
    tensors = []
    by_name = {t.name: t for t in info.tensors}
    for key in keys:  # what torch will read: the general reader's records, checked again
        offs = [tuple(_d(c).get("offsets") or ()) for c in chunks.get(key, [])]
        sizes = [tuple(_d(c).get("sizes") or ()) for c in chunks.get(key, [])]
        try:
            gap, _ = dcpfmt.chunk_cover(by_name[key].shape, offs, sizes)
        except FormatError as e:
            raise FormatError(f".metadata: tensor {key!r}: {e}") from None
        if gap:
            raise FormatError(
                f".metadata gives tensor {key!r} chunks that leave part of it unwritten: no file holds "
                "those values (dcp-chunk-gap)"
            )
    stacks: dict[str, Any] = {}  # the one stacked tensor loaded whole by the general path, for its layers in turn
    for key, out_name, layer in outputs:
        ti = by_name[key]
        shape = ti.shape if layer is None else ti.shape[1:]
        st = None if force_general else _fast_ranges(folder, ti, chunks.get(key, []), storage, layer)
        if st is not None:
            tensors.append(SourceTensor(out_name, shape, ti.dtype, ranges=tuple(st)))
        else:
            load = _general_loader(folder, key, ti, bool(info.planner_data))
            if layer is not None:
                load = _layer_loader(load, key, layer, stacks)
            tensors.append(
                SourceTensor(
                    out_name,
                    shape,
                    ti.dtype,
                    load=load,
                    note="read with torch DCP (chunks are not contiguous byte ranges)",
                )
            )
    return tensors


def _layer_loader(load_stack: Callable[[], Any], key: str, layer: int, cache: dict[str, Any]) -> Callable[[], object]:
    def load() -> object:
        if cache.get("key") != key:
            cache.clear()
            cache.update(key=key, tensor=load_stack())
        return cache["tensor"][layer].contiguous()

    return load


def _fast_ranges(
    folder: Location,
    ti: TensorInfo,
    chunk_list: list[Any],
    storage: dict[tuple[str, tuple[int, ...]], dict[str, Any]],
    layer: Optional[int] = None,
) -> Optional[list[ByteRange]]:
    """Byte ranges of the tensor (or of one ``layer`` along its leading dimension: a chunk of that layer alone
    is a tensor of the layer's shape behind a leading 1), or None when it takes the general path."""
    if ti.dtype not in ITEMSIZE or not chunk_list:
        return None
    shape = ti.shape
    item = ITEMSIZE[ti.dtype]
    parts = []
    keys: dict[
        tuple[int, ...], tuple[int, ...]
    ] = {}  # chunk offsets in the layer's own dims -> offsets of the stored chunk (its storage key)
    for ch in chunk_list:
        c = _d(ch)
        offs, sizes = tuple(c.get("offsets") or ()), tuple(c.get("sizes") or ())
        if len(offs) != len(shape):
            return None
        if layer is not None:
            if not offs or offs[0] + sizes[0] <= layer or offs[0] > layer:
                continue  # another layer's chunk
            if sizes[0] != 1:
                return None  # several layers in one chunk: general path
            keys[offs[1:]] = offs
            offs, sizes = offs[1:], sizes[1:]
        else:
            keys[offs] = offs
        if len(offs) != len(shape) - (layer is not None):
            return None
    if layer is not None:
        shape = shape[1:]
    for ch in chunk_list:
        c = _d(ch)
        offs, sizes = tuple(c.get("offsets") or ()), tuple(c.get("sizes") or ())
        if layer is not None:
            if offs[0] != layer:
                continue
            offs, sizes = offs[1:], sizes[1:]
        for d in range(1, len(shape)):
            if offs[d] != 0 or sizes[d] != shape[d]:
                return None  # split along another dim: general path
        parts.append((offs, sizes))
    # rank-local metadata lists a replicated tensor once per rank: one copy is enough
    parts = list({p[0]: p for p in parts}.values())
    parts.sort(key=lambda p: p[0][0] if p[0] else 0)
    if len(shape) == 0:
        if len(parts) != 1:
            return None
    else:
        pos = 0
        for offs, sizes in parts:
            if offs[0] != pos:
                return None
            pos += sizes[0]
        if pos != shape[0]:
            return None
    ranges = []
    for offs, sizes in parts:
        st = storage.get((ti.name, keys.get(offs, offs)))
        if st is None or st.get("transform_descriptors"):
            return None
        path = folder / str(st["relative_path"])
        if _is_safetensors(path):
            r = _safetensors_chunk(path, ti, offs, sizes)
            if r is None:
                return None
            if r.length:
                ranges.append(r)
            continue
        base, length = int(st["offset"]), int(st["length"])
        numel = 1
        for s in sizes:
            numel *= s
        if numel == 0:
            continue
        r = _blob_range(path, base, length, numel, ti.dtype, item)
        if r is None:
            return None
        ranges.append(r)
    return ranges


_ST_CACHE: dict[tuple[str, int], tuple[SafetensorsHeader, Any]] = {}  # (path, mtime) -> header, sharding info


def _is_safetensors(path: Location) -> bool:
    """DCP's SAFETENSORS serialization format: each .distcp file is a safetensors file."""
    try:
        with open_read(path) as f:
            head = f.read(9)
        return len(head) == 9 and head[8:9] == b"{"
    except OSError:
        return False


def _safetensors_chunk(
    path: Location, ti: TensorInfo, offs: tuple[int, ...], sizes: tuple[int, ...]
) -> Optional[ByteRange]:
    import json

    from ..safetensors import header as stfmt

    key = (str(path), path.stat().st_mtime_ns)
    if key not in _ST_CACHE:
        h = stfmt.read_header(path)
        try:
            info = json.loads(h.metadata.get("DCP_SHARDING_INFO", "{}"))
        except ValueError:
            info = {}
        _ST_CACHE.clear()
        _ST_CACHE[key] = (h, info)
    h, info = _ST_CACHE[key]
    saved = (info.get(ti.name) or {}).get("saved_offsets")
    if saved is None or tuple(saved) != tuple(offs) or ti.name not in h.offsets:
        return None
    t = next(x for x in h.tensors if x.name == ti.name)
    if t.shape != tuple(sizes) or t.dtype != ti.dtype:
        return None
    b, e = h.offsets[ti.name]
    return ByteRange(str(path), h.data_start + b, e - b)


def _blob_range(path: Location, base: int, length: int, numel: int, dtype: str, item: int) -> Optional[ByteRange]:
    """The raw bytes of the one tensor a torch.save blob holds, or None if it is not that simple."""
    try:
        with open_read(path) as f:
            f.seek(base)
            if f.read(2) != b"PK":
                return None  # safetensors-format DCP or an extension's encoding
        offsets = storage_offsets(path, base, length)
        import zipfile

        from ..torch_save.torchfile import FileWindow

        with open_read(path) as f, zipfile.ZipFile(FileWindow(f, base, length)) as zf:
            pkl = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
            if not pkl or pkl[0].file_size > (1 << 20):
                return None
            up = safe_loads(zf.read(pkl[0]), persistent=True)
    except (FormatError, OSError, ValueError, Exception):
        return None
    t = up.obj
    if up.unsafe or not isinstance(t, TensorRef) or t.storage is None or not t.contiguous:
        return None
    if t.numel != numel or t.dtype != dtype or t.storage.key not in offsets:
        return None
    start, size = offsets[t.storage.key]
    if (t.offset + numel) * item > size:
        return None
    return ByteRange(str(path), start + t.offset * item, numel * item)


def _general_loader(
    folder: Location, key: str, ti: TensorInfo, planner_data: Optional[bool] = None
) -> Callable[[], object]:
    return lambda: load_one(folder, key, ti, planner_data).contiguous()


def _torch_failed(key: str, e: BaseException) -> FormatError:
    """torch's DCP loader failed on ``key``: one line (its CheckpointException carries every rank's traceback)."""
    first = str(e).strip().splitlines()
    last = [ln for ln in first if ln and not ln.startswith((" ", "Traceback"))][-1:] or first[:1]
    return FormatError(f"torch's DCP loader could not read {key!r}: {type(e).__name__}: {' '.join(last)[:300]}")


@contextmanager
def _quiet_torch_dcp() -> Iterator[None]:
    """torch's DCP loader logs a warning with a traceback when a folder has only rank-local metadata ("Global
    metadata is not found. Falling back…"): not for the user's terminal while ckpt-tui asks it."""
    log = logging.getLogger("torch.distributed.checkpoint")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def load_one(
    folder: Location,
    key: str,
    ti: TensorInfo,
    planner_data: Optional[bool] = None,
    *,
    rank: Optional[int] = None,
    into: Any = None,
) -> Any:
    """One whole tensor of a DCP folder, read by torch's own DCP loader.

    Megatron-Core's writer leaves ``planner_data`` out of ``.metadata`` (torch's key-filtering planner then
    fails): there the tensor is loaded into a pre-allocated tensor of its full shape by the default planner.
    ``rank``: read with that rank's own ``__{rank}.metadata`` (a folder with rank-local metadata only, where
    torch in one process reads rank 0's alone), into the full-shape tensor ``into``: the chunks that rank
    saved land in place, so loading every rank's into one tensor gives the whole of it."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    if planner_data is None:
        planner_data = bool(dcpfmt.read(folder).planner_data)
    reader = screen.dcp_reader(folder, rank=rank)  # the metadata screened, and unpickled by ckpt-tui, not by torch
    try:
        with _quiet_torch_dcp():
            if rank is not None:
                sd = {key: into}
                _load_state_dict(
                    sd, storage_reader=reader, planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True
                )
                return into
            if not planner_data:
                sd = {key: torch.empty(ti.shape, dtype=getattr(torch, ti.dtype))}
                _load_state_dict(sd, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
                return sd[key]
            sd = {}
            _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(keys={key}), no_dist=True)
    except (KeyboardInterrupt, MemoryError, SystemExit):
        raise
    except BaseException as e:  # CheckpointException (a BaseException), OSError, ValueError…: a message
        raise _torch_failed(key, e) from None
    # the loaded dict is nested again: walk it by the key's structure
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(sd)
    return flat[key]
