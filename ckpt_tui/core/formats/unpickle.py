"""A restricted unpickler that never executes code from a file.

Every global a pickle names is looked up in an explicit allowlist. Allowed torch
rebuild functions become :class:`TensorRef` records (shape, dtype, storage key) and
framework classes become inert :class:`Stub` objects, so a torch checkpoint's
structure can be read without torch, without reading tensor data and without
running anything the file asks for. A global outside the allowlist is recorded
(``Unpickled.unsafe``) and replaced by an inert stub, so the scan still finishes.
"""

from __future__ import annotations

import _compat_pickle
import gc
import hashlib
import io
import os
import pickle
import threading
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol

from ..dtypes import ITEMSIZE
from ..types import numel
from . import FormatError

MAX_PICKLE_BYTES = 512 * 1024 * 1024  # a data.pkl / .metadata larger than this is refused

# Bounded cost. An allowlisted callable builds at most this much from its arguments in one call, and all of them
# together at most MAX_BUILT in one file; a pickle asking for more is refused before anything is allocated (a
# FormatError: the file gets an error finding naming the call and the cap). Real checkpoints stay far below.
MAX_ITEMS = 1 << 20  # items of a set / frozenset / OrderedDict / bytearray an allowlisted call builds (1,048,576)
MAX_BYTES = 1 << 24  # bytes of a bytearray or an encoded string one call builds (16 MiB)
MAX_DIMS = 1024  # entries of a torch.Size, a tensor's shape or stride, a DTensor's mesh or placements
MAX_BUILT = 1 << 28  # what one file's allowlisted calls build in all, counted as bytes, 64 per item (256 MiB)
BUILT_PER_BYTE = 16  # and this much more for each byte of the pickle (a 200 MB .metadata of 10^6 records)
MAX_NAME_CHARS = 1 << 26  # characters of the tensor names one walk of an object graph yields (64 M)

# aliases torch accepts as attribute names
_DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cfloat": "complex64",
    "cdouble": "complex128",
}
_STORAGE_DTYPE = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "UntypedStorage": "uint8",
}


class Stub:
    """Inert stand-in for a framework object: keeps constructor args and state, does nothing."""

    _qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.setdefault("_args", args)
        _charge(len(kwargs), MAX_ITEMS, "a stand-in's keyword arguments")
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
            for part in state:
                if isinstance(part, dict):
                    _charge(len(part), MAX_ITEMS, "a stand-in's state")
                    self.__dict__.update(part)
        elif isinstance(state, dict):
            _charge(len(state), MAX_ITEMS, "a stand-in's state")
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state

    def __getitem__(self, k: Any) -> Any:  # for (unusual) subscripting during unpickle
        return self.__dict__.get(k)

    __iter__ = None  # not iterable: set(stub) or torch.Size(stub) would otherwise call __getitem__ forever

    def __setitem__(self, k: Any, v: Any) -> None:
        self.__dict__[k] = v

    def __call__(self, *a: Any, **k: Any) -> Stub:
        return self

    def __repr__(self) -> str:
        return f"<{self._qualname}>"

    @property
    def value(self) -> Any:
        args = self.__dict__.get("_args") or ()
        return args[0] if args else None


def _stub_class(qualname: str) -> type:
    return type(qualname.rsplit(".", 1)[-1], (Stub,), {"_qualname": qualname})


class Record:
    """Stand-in for plain dataclasses pickled as NEWOBJ + BUILD(dict): no Python-level hooks, so
    the C unpickler fills ``__dict__`` directly (DCP metadata has one per chunk: ~10^5 objects)."""

    _qualname = "?"

    def __repr__(self) -> str:
        return f"<{self._qualname}>"


def _record_class(qualname: str) -> type:
    return type(qualname.rsplit(".", 1)[-1], (Record,), {"_qualname": qualname})


RECORD_GLOBALS = {
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    # a DTensor's spec (FSDP2 and FSDP1-with-a-mesh sharded state dicts): NEWOBJ + BUILD(dict), data only
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed._tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types._StridedShard",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed._tensor.placement_types.Shard",
    "torch.distributed._tensor.placement_types.Replicate",
    # Megatron-Core's torch_dist writer keeps every rank's save plan in .metadata (``all_local_plans``):
    # frozen dataclasses of plain data (SavePlan(items=[WriteItem(index, type, tensor_data)]))
    "torch.distributed.checkpoint.planner.SavePlan",
    "torch.distributed.checkpoint.planner.WriteItem",
    "torch.distributed.checkpoint.planner.TensorWriteData",
}

# NamedTuples pickled as NEWOBJ(cls, args): a tuple of the args, nothing run
TUPLE_GLOBALS = {
    "torch.distributed.tensor._dtensor_spec.TensorMeta",  # (shape, stride, dtype)
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",  # (tensor_dim, mesh_dims)
}


class TupleRecord(tuple[Any, ...]):
    """Stand-in for a NamedTuple: ``NEWOBJ`` passes its fields, kept as a plain tuple."""

    _qualname = "?"

    def __new__(cls, *args: Any) -> TupleRecord:
        return tuple.__new__(cls, args)

    def __repr__(self) -> str:
        return f"<{self._qualname}({', '.join(_short(x) for x in self[:8])}{', ...' if len(self) > 8 else ''})>"


def _tuple_record_class(qualname: str) -> type:
    return type(qualname.rsplit(".", 1)[-1], (TupleRecord,), {"_qualname": qualname})


@dataclass
class StorageRef:
    dtype: str
    key: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE.get(self.dtype, 1)


class ShapedRef:
    """What every tensor reference derives from its ``shape`` and ``dtype``."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE.get(self.dtype, 1)


@dataclass
class TensorRef(ShapedRef):
    storage: StorageRef | None
    offset: int  # in elements of the storage
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    stride: tuple[int, ...] | None = None

    @property
    def contiguous(self) -> bool:
        if self.stride is None:
            return True
        expect = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride)):
            if d != 1 and s != expect:
                return False
            expect *= d
        return True


@dataclass
class DTensorRef(ShapedRef):
    """A pickled ``torch.distributed.tensor.DTensor``: this rank's local tensor and where it sits in the
    global tensor (placements on the mesh), read from the pickled spec; no process group needed."""

    local: Optional[TensorRef]
    shape: tuple[int, ...]  # the global shape
    dtype: str
    placements: tuple[tuple[str, Optional[int]], ...]  # ("shard", dim) | ("replicate", None) | ("partial", None) ...
    mesh_shape: tuple[int, ...] = ()
    mesh_dim_names: Optional[tuple[str, ...]] = None
    coordinate: Optional[tuple[int, ...]] = None  # this rank's coordinate on the mesh


@dataclass
class ShardRef:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    rank: Optional[int]
    tensor: Optional[TensorRef] = None  # the bytes, for a shard this file holds


@dataclass
class ShardedTensorRef(ShapedRef):
    """A pickled ``ShardedTensor`` (FSDP1 sharded/local state dicts): the shards this rank holds and the
    metadata of every shard (offsets, sizes, owning rank) of the global tensor."""

    local_shards: list[ShardRef]
    shards: list[ShardRef]  # every shard of the global tensor, from ShardedTensorMetadata
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Unpickled:
    obj: Any
    unsafe: set[str] = field(default_factory=set)  # "module.name" of globals outside the allowlist
    storages: dict[str, StorageRef] = field(default_factory=dict)


class Readable(Protocol):
    """What an unpickler reads from: a binary file, or the DCP summary reader's ChainReader."""

    def read(self, n: int, /) -> bytes: ...
    def readline(self) -> bytes: ...


_LOCAL = threading.local()  # the budget of the read running in this thread


class BudgetExceeded(FormatError):
    """A pickle asked an allowlisted callable for more than its cap (see MAX_ITEMS and friends)."""


def _charge(n: int, cap: int, what: str, unit: str = "items", weight: int = 64) -> None:
    """Refuse a call that would build ``n`` ``unit`` (over ``cap``, or over what is left of the file's MAX_BUILT)."""
    if n > cap:
        raise BudgetExceeded(
            f"the pickle asks {what} for {n:,} {unit}: over ckpt-tui's cap of {cap:,} (refused without allocating it)"
        )
    budget = getattr(_LOCAL, "budget", None)
    if budget is not None:
        budget[0] -= n * weight
        if budget[0] < 0:
            raise BudgetExceeded(
                f"the pickle's allowlisted calls build more than {MAX_BUILT:,} bytes in all (at {what}): refused"
            )


def _length(x: object, what: str) -> int:
    """The number of items an argument yields, for the concrete containers an allowlisted call may take; any
    other argument (an iterator, a stand-in) is refused."""
    if isinstance(x, (list, tuple, set, frozenset, dict, str, bytes, bytearray, range)):
        try:
            return len(x)
        except OverflowError:
            raise BudgetExceeded(f"the pickle asks {what} for a range of more than 2**63 items: refused") from None
    raise FormatError(f"the pickle calls {what} with a {type(x).__name__}: refused")


def _short(x: object) -> str:
    """A value of the pickle as a short string, in time bounded whatever it is (a graph of shared tuples, a huge
    int, a long string)."""
    if isinstance(x, str):
        return x if len(x) <= 256 else x[:256] + "..."
    if isinstance(x, bool) or x is None or isinstance(x, float):
        return repr(x)
    if isinstance(x, int):
        return str(x) if x.bit_length() <= 64 else "<int>"
    if isinstance(x, (Stub, Record, type)):
        return f"<{getattr(x, '_qualname', getattr(x, '__name__', '?'))}>"
    return f"<{type(x).__name__}>"


def _dims(v: object, what: str) -> tuple[int, ...]:
    """A shape, stride or offsets argument: a tuple or list of at most MAX_DIMS ints."""
    if not isinstance(v, (list, tuple)):
        raise FormatError(f"the pickle gives {what} a {type(v).__name__}, not a tuple of ints: refused")
    _charge(len(v), MAX_DIMS, what, weight=8)
    return tuple(int(x) for x in v)


def _torch_size(items: Any = ()) -> tuple[Any, ...]:
    """torch.Size(items): a tuple of at most MAX_DIMS ints."""
    _charge(_length(items, "torch.Size"), MAX_DIMS, "torch.Size", weight=8)
    return tuple(items)


def _capped(kind: Callable[[Any], object], name: str) -> Callable[..., object]:
    def build(items: Any = ()) -> object:
        _charge(_length(items, name), MAX_ITEMS, name)
        return kind(items)

    build.__name__ = build.__qualname__ = name.rsplit(".", 1)[-1]
    return build


def _bytearray(source: Any = b"", encoding: object = None, errors: object = None) -> bytearray:
    """bytearray(source[, encoding]): from bytes or a string (copied), an int (zeros) or a list of ints, each at most
    MAX_BYTES; nothing else."""
    what = "bytearray"
    if isinstance(source, int) and not isinstance(source, bool):
        if source < 0:
            raise FormatError("the pickle calls bytearray with a negative size")
        _charge(source, MAX_BYTES, what, "bytes", 1)
    else:
        _charge(
            _length(source, what),
            MAX_BYTES if isinstance(source, (str, bytes, bytearray)) else MAX_ITEMS,
            what,
            "items",
            1 if isinstance(source, (str, bytes, bytearray)) else 64,
        )
    if encoding is None:
        return bytearray(source)
    return bytearray(source, str(encoding), str(errors) if errors is not None else "strict")


def _dtype_name(x: object) -> str:
    if isinstance(x, str):
        return _DTYPE_ALIASES.get(x, x)
    return _short(x)


def _rebuild_tensor(
    storage: object,
    storage_offset: Any,
    size: object,
    stride: object = None,
    requires_grad: object = False,
    backward_hooks: object = None,
    metadata: object = None,
) -> TensorRef:
    size = _dims(size, "a tensor's shape")
    dtype = storage.dtype if isinstance(storage, StorageRef) else "uint8"
    st = _dims(stride, "a tensor's stride") if stride is not None else None
    return TensorRef(
        storage if isinstance(storage, StorageRef) else None, int(storage_offset), size, dtype, bool(requires_grad), st
    )


def _rebuild_tensor_v3(
    storage: object,
    storage_offset: Any,
    size: object,
    stride: object,
    requires_grad: object,
    backward_hooks: object,
    dtype: object,
    metadata: object = None,
) -> TensorRef:
    t = _rebuild_tensor(storage, storage_offset, size, stride, requires_grad)
    t.dtype = _dtype_name(dtype)
    return t


def _rebuild_parameter(data: Any, requires_grad: object = False, backward_hooks: object = None, *rest: object) -> Any:
    if isinstance(data, TensorRef):
        data.requires_grad = bool(requires_grad)
    return data


def _rebuild_from_type_v2(func: Any, new_type: object, args: Any, state: object) -> Any:
    q = getattr(new_type, "_qualname", "")
    if isinstance(new_type, type) and issubclass(new_type, Stub):
        if q in _DTENSOR:
            return _dtensor(func(*args), state)
        if q == _SHARDED_TENSOR:
            return _sharded_tensor(func(*args), state)
    return func(*args)


_DTENSOR = {
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor._api.DTensor",
    "torch.distributed._tensor.api.DTensor",
}
_SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor.api.ShardedTensor"


def _attrs(obj: object) -> dict[str, Any]:
    """The attributes BUILD set on a stand-in (Record/Stub), or a plain dict's items."""
    if isinstance(obj, dict):
        return obj
    return getattr(obj, "__dict__", {}) or {}


def _ints(v: object) -> tuple[int, ...]:
    return _dims(v, "a shape or offsets") if isinstance(v, (list, tuple)) else ()


def _items(v: object, what: str) -> list[Any]:
    """A list argument walked by a stand-in (a mesh's axes, a tensor's shards): charged against the budget."""
    if not isinstance(v, (list, tuple)):
        return []
    _charge(len(v), MAX_ITEMS, what)
    return list(v)


def _placement(p: object) -> tuple[str, Optional[int]]:
    q = getattr(p, "_qualname", "")
    kind = q.rsplit(".", 1)[-1].lstrip("_").lower()  # shard, replicate, stridedshard, partial
    dim = _attrs(p).get("dim")
    return kind, (int(dim) if isinstance(dim, int) else None)


def _dtensor(shell: object, state: object) -> Any:
    """DTensor.__reduce_ex__ pickles (wrapper-subclass args, state): state is ``(None, {"_local_tensor": ..,
    "_spec": DTensorSpec})`` (or the dict alone); the spec holds the mesh, the placements and TensorMeta."""
    if not isinstance(shell, TensorRef):
        return shell
    d: dict[str, Any] = {}
    for part in state if isinstance(state, tuple) else (state,):
        if isinstance(part, dict):
            d.update(part)
    local = d.get("_local_tensor")
    spec = _attrs(d.get("_spec"))
    mesh = _attrs(spec.get("mesh"))
    layout = _attrs(mesh.get("_layout"))
    mesh_shape: tuple[int, ...] = ()
    for ax in _items(layout.get("axes"), "a device mesh's axes"):
        mesh_shape += _ints(_attrs(ax).get("shape"))
    if not mesh_shape and isinstance(mesh.get("mesh"), TensorRef):  # older torch: the rank tensor itself
        mesh_shape = mesh["mesh"].shape
    names = mesh.get("_mesh_dim_names")
    meta = spec.get("tensor_meta")
    shape = _ints(meta[0]) if isinstance(meta, tuple) and meta else shell.shape
    coord = mesh.get("_coordinate_on_dim")
    return DTensorRef(
        local if isinstance(local, TensorRef) else None,
        shape or shell.shape,
        shell.dtype,
        tuple(_placement(p) for p in _items(spec.get("placements"), "a DTensor's placements")),
        mesh_shape,
        tuple(str(n) for n in names) if isinstance(names, (list, tuple)) else None,
        _ints(coord) if isinstance(coord, (list, tuple)) else None,
    )


def _shard_meta(m: object, tensor: Optional[TensorRef] = None) -> ShardRef:
    a = _attrs(m)
    rank = _attrs(a.get("placement")).get("_rank")
    return ShardRef(
        _ints(a.get("shard_offsets")), _ints(a.get("shard_sizes")), int(rank) if isinstance(rank, int) else None, tensor
    )


def _sharded_tensor(shell: object, state: object) -> Any:
    """ShardedTensor.__getstate__ is ``(local_shards, metadata, pg_state, sharding_spec, init_rrefs)``."""
    if not isinstance(shell, TensorRef) or not isinstance(state, tuple) or len(state) < 2:
        return shell
    local = []
    for sh in _items(state[0], "a ShardedTensor's local shards"):
        a = _attrs(sh)
        t = a.get("tensor")
        local.append(_shard_meta(a.get("metadata"), t if isinstance(t, TensorRef) else None))
    meta = _attrs(state[1])
    shards = [_shard_meta(m) for m in _items(meta.get("shards_metadata"), "a ShardedTensor's shards")]
    return ShardedTensorRef(local, shards, _ints(meta.get("size")) or shell.shape, shell.dtype)


def _get_layout(name: object) -> str:
    return _short(name)


def _device(*args: object) -> str:
    return "device(" + ",".join(_short(a) for a in args[:4]) + ")"


class _ODict(dict[Any, Any]):
    """OrderedDict stand-in: torch state dicts carry a ``_metadata`` attribute set by BUILD."""


def _codecs_encode(text: object, encoding: object = "utf-8") -> bytes:
    # protocol-2 pickles spell bytes as _codecs.encode(str, "latin1"); nothing else is allowed
    if (
        not isinstance(text, str)
        or not isinstance(encoding, str)
        or encoding.lower().replace("-", "") not in ("latin1", "utf8")
    ):
        raise pickle.UnpicklingError("_codecs.encode with unexpected arguments")
    _charge(len(text) * (1 if encoding.lower().startswith("l") else 4), MAX_BYTES, "_codecs.encode", "bytes", 1)
    return text.encode(encoding)


def _safe_getattr(obj: object, name: str) -> type:
    # only on our own inert stand-ins (enum members such as MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT)
    if (isinstance(obj, type) and issubclass(obj, Stub)) or isinstance(obj, Stub):
        return _stub_class(f"{getattr(obj, '_qualname', '?')}.{name}")
    raise pickle.UnpicklingError("getattr on a real object is not allowed")


def _rebuild_wrapper_subclass(
    cls: object, dtype: object, size: object, stride: object = None, storage_offset: Any = 0, *rest: object
) -> TensorRef:
    return TensorRef(None, int(storage_offset or 0), _dims(size, "a tensor's shape"), _dtype_name(dtype))


def _reconstructor(cls: Any, base: Any, state: object = None) -> Any:
    """``copyreg._reconstructor``, how protocols 0 and 1 build an object: one of our stand-ins (a Stub, a Record, or
    a shared record of the DCP summary reader: they have a ``_qualname``) is made empty, to be filled by BUILD."""
    if isinstance(cls, type) and (issubclass(cls, (Stub, Record)) or hasattr(cls, "_qualname")):
        return cls()
    return base() if base in (dict, list, tuple, object) else None


_DTYPES = set(ITEMSIZE) | set(_DTYPE_ALIASES)

# torch.distributed.checkpoint's metadata classes: stand-ins for the allowlist reader, torch's own for DCP's reader
DCP_METADATA_GLOBALS = (
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
)

# Framework classes read through inert stand-ins. Everything here is data only in real checkpoints.
STUB_GLOBALS = {
    # DeepSpeed
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.checkpoint.constants.UNIVERSAL_CHECKPOINT_INFO",
    "deepspeed.runtime.zero.stage3.ZeroParamStatus",
    # argparse / pathlib / numpy (rng states) / python
    "argparse.Namespace",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.Path",
    "pathlib._local.PosixPath",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.dtypes.UInt32DType",
    "numpy.dtypes.Float64DType",
    "numpy.dtypes.Int64DType",
    # torch.distributed.checkpoint metadata
    *DCP_METADATA_GLOBALS,
    "torch.distributed.checkpoint._extension.ExtensionRegistry",
    "torch.distributed.checkpoint.planner.WriteItemType",
    # FSDP LOCAL_STATE_DICT files hold ShardedTensors
    "torch.distributed._shard.metadata.ShardMetadata",
    "torch.distributed._shard.sharded_tensor.api.ShardedTensor",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    "torch.distributed._shard.sharded_tensor.metadata.ShardedTensorMetadata",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.shard.Shard",
    "torch.distributed.remote_device._remote_device",
    "torch.distributed._shard.sharding_spec.chunk_sharding_spec.ChunkShardingSpec",
    "torch.distributed.tensor.DTensor",
    "torch.distributed.tensor._api.DTensor",
    # transformers' TrainingArguments and the enums it holds
    "transformers.training_args.TrainingArguments",
    "transformers.training_args.OptimizerNames",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    "transformers.trainer_utils.IntervalStrategy",
    "transformers.trainer_utils.SaveStrategy",
    "transformers.trainer_utils.HubStrategy",
    "transformers.trainer_utils.SchedulerType",
    "transformers.trainer_utils.FSDPOption",
    "transformers.debug_utils.DebugOption",
    "accelerate.utils.dataclasses.DistributedType",
    "accelerate.state.PartialState",
    "accelerate.utils.dataclasses.DeepSpeedPlugin",
    "accelerate.utils.dataclasses.FullyShardedDataParallelPlugin",
    "accelerate.utils.dataclasses.TorchDynamoPlugin",
    "accelerate.utils.dataclasses.DynamoBackend",
    "transformers.integrations.deepspeed.HfDeepSpeedConfig",
    "transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig",
    "transformers.trainer_pt_utils.AcceleratorConfig",
    "trl.trainer.sft_config.SFTConfig",
    # torch.optim.lr_scheduler state is plain data; schedulers sometimes pickle these
    "torch.optim.lr_scheduler.LambdaLR",
    "lightning.fabric.utilities.data.AttributeDict",
    "pytorch_lightning.utilities.parsing.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict",
    # Megatron-LM's args (its common state): the enums its argument parser stores
    "megatron.core.transformer.enums.AttnBackend",
    "megatron.core.transformer.enums.AttnMaskType",
    "megatron.core.enums.ModelType",
    # composer's state: the Timestamp's wall-clock times, the torch version in its metadata (a str subclass)
    "datetime.timedelta",
    "torch.torch_version.TorchVersion",
}

# what find_class hands the unpickler for an allowlisted global: a callable of ours (or an inert builtin), or a name
FUNCTIONS: dict[str, object] = {
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch.nn.parameter.Parameter": _rebuild_parameter,
    "torch.Size": _torch_size,
    "torch.serialization._get_layout": _get_layout,
    "torch.device": _device,
    "collections.OrderedDict": _ODict,  # each read gets its own subclass (_fresh, at its first use in a read)
    "_codecs.encode": _codecs_encode,
    "torch.Tensor": "torch.Tensor",
    "builtins.getattr": _safe_getattr,
    "__builtin__.getattr": _safe_getattr,
    "torch._utils._rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
    "collections.defaultdict": lambda *a: {},
    "builtins.set": _capped(set, "builtins.set"),
    "builtins.frozenset": _capped(frozenset, "builtins.frozenset"),
    "builtins.slice": slice,
    "builtins.complex": complex,
    "builtins.bytearray": _bytearray,
    "builtins.range": range,
    "copyreg._reconstructor": _reconstructor,
    "builtins.object": object,  # _reconstructor's base in protocols 0 and 1: inert
}
_TORCH_CONSTANTS = {
    "strided",
    "sparse_coo",
    "contiguous_format",
    "channels_last",
    "preserve_format",
    "channels_last_3d",
}


_PY2_MODULES = {"copy_reg": "copyreg", "__builtin__": "builtins"}


def _fresh(f: object) -> object:
    """A copy of an allowlisted callable for one read: a BUILD opcode can set attributes on what find_class returns
    (``__defaults__`` of a function, any attribute of a class): on a copy, that stays in the file that did it."""
    if isinstance(f, types.FunctionType):
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        g.__kwdefaults__ = dict(f.__kwdefaults__) if f.__kwdefaults__ else None
        g.__qualname__ = f.__qualname__
        return g
    if isinstance(f, type) and f.__module__ == __name__:  # our own stand-in classes (builtin types are immutable)
        return type(f.__name__, (f,), {})
    return f


class RestrictedUnpickler(pickle.Unpickler):
    """The allowlist unpickler. Each instance reads one file with its own copies of the allowlisted callables and
    stand-in classes (nothing a file does to them reaches another file's read) and its own allocation budget."""

    size_hint: int = 0  # the stream's length, where the caller knows it (the budget grows with it)

    def __init__(self, f: Readable, result: Unpickled, persistent: bool) -> None:
        super().__init__(f)
        self._result = result
        self._persistent = persistent
        self._functions: dict[str, object] = {}  # a fresh copy of each allowlisted callable, made at its first use
        self._stand_ins: dict[str, type] = {}

    def load(self) -> Any:
        outer = getattr(_LOCAL, "budget", None)
        # MAX_BUILT, plus BUILT_PER_BYTE for each byte of the stream (a large file of many small records may build
        # more in all, in proportion to its size, never more per byte)
        _LOCAL.budget = [MAX_BUILT + BUILT_PER_BYTE * max(0, int(getattr(self, "size_hint", 0) or 0))]
        try:
            return super().load()
        finally:
            _LOCAL.budget = outer

    def find_class(self, module: str, name: str) -> Any:
        if module in _PY2_MODULES:  # protocols 0-2 name copyreg and builtins the Python 2 way
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (_PY2_MODULES[module], name))
        q = f"{module}.{name}"
        f = self._functions.get(q)
        if f is not None:
            return f
        f = FUNCTIONS.get(q)
        if f is not None:
            f = self._functions[q] = _fresh(f)
            return f
        if module == "torch":
            if name in _DTYPES:
                return _dtype_name(name)
            if name in _TORCH_CONSTANTS:
                return name
            if name in _STORAGE_DTYPE:
                return ("storage-type", _STORAGE_DTYPE[name])
        if module == "torch.storage" and name in ("UntypedStorage", "TypedStorage"):
            return ("storage-type", "uint8")
        if q in RECORD_GLOBALS:
            return _record_class(q)
        if q in TUPLE_GLOBALS:
            return _tuple_record_class(q)
        if q in STUB_GLOBALS:
            return _stub_class(q)
        self._result.unsafe.add(q)
        return _stub_class(q)

    def persistent_load(self, pid: Any) -> StorageRef:
        if not self._persistent:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            _, stype, key, _location, numel = pid[:5]
            if not isinstance(key, (str, int)) or isinstance(key, bool) or len(str(key)) > 256:
                raise pickle.UnpicklingError("a storage key that is not a short string")
            dtype = stype[1] if isinstance(stype, tuple) and len(stype) == 2 and isinstance(stype[1], str) else "uint8"
            ref = self._result.storages.get(str(key))
            if ref is None:
                ref = StorageRef(dtype, str(key), int(numel))
                self._result.storages[str(key)] = ref
            return ref
        raise pickle.UnpicklingError(f"unsupported persistent id {type(pid).__name__}")


# DCP metadata classes torch's DCP reader needs as themselves (it reads their fields and methods): data-only
# dataclasses and enums of torch's own, built by the C unpickler as NEWOBJ/REDUCE + BUILD.
TORCH_METADATA_CLASSES = (
    *DCP_METADATA_GLOBALS,
    "torch.distributed.checkpoint.planner.SavePlan",
    "torch.distributed.checkpoint.planner.WriteItem",
    "torch.distributed.checkpoint.planner.WriteItemType",
    "torch.distributed.checkpoint.planner.TensorWriteData",
)


class TorchMetadataUnpickler(RestrictedUnpickler):
    """The allowlist unpickler, producing torch's own DCP metadata classes, dtypes, layouts and ``torch.Size``
    (what torch's DCP reader needs) where the allowlist names them; everything else as for
    :class:`RestrictedUnpickler`. For a file that passed the screen; it is the metadata ckpt-tui hands torch's
    DCP reader instead of letting it ``pickle.load`` the file."""

    def find_class(self, module: str, name: str) -> Any:
        import importlib

        import torch

        q = f"{module}.{name}"
        if q in TORCH_METADATA_CLASSES:
            return getattr(importlib.import_module(module), name)
        if q == "torch.Size":
            return lambda items=(): torch.Size(_torch_size(items))
        if q == "torch.serialization._get_layout":
            return lambda layout: _torch_layout(layout)
        if module == "torch" and name in _DTYPES | _TORCH_CONSTANTS:
            return getattr(torch, name)
        return super().find_class(module, name)


def _torch_layout(name: object) -> Any:
    import torch

    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    if name not in layouts:
        raise pickle.UnpicklingError(f"unknown layout {_short(name)}")
    return layouts[name]


def torch_metadata(data: bytes) -> Any:
    """torch's DCP ``Metadata`` of a screened ``.metadata``'s bytes, through :class:`TorchMetadataUnpickler`.
    Raises FormatError where a global is outside the allowlist or the stream is unreadable."""
    result = Unpickled(None)
    up = TorchMetadataUnpickler(io.BytesIO(data), result, False)
    up.size_hint = len(data)
    try:
        with gc_paused():  # millions of acyclic records: the cyclic GC would walk them again and again
            result.obj = up.load()
    except FormatError:
        raise
    except Exception as e:
        raise FormatError(f"not a readable DCP metadata pickle: {type(e).__name__}: {e}") from None
    if result.unsafe:
        raise FormatError(f"the metadata names code outside the allowlist ({', '.join(sorted(result.unsafe)[:6])})")
    return result.obj


_CLEAN: set[bytes] = set()  # digests of pickles read in full by the restricted unpickler and found clean


def _allowlist_key() -> str:
    """What a clean verdict depends on: the allowlist and the caps (a change makes earlier verdicts void)."""
    h = hashlib.sha256()
    for names in (
        sorted(FUNCTIONS),
        sorted(STUB_GLOBALS),
        sorted(RECORD_GLOBALS),
        sorted(TUPLE_GLOBALS),
        sorted(_TORCH_CONSTANTS),
        [str(x) for x in (MAX_ITEMS, MAX_BYTES, MAX_DIMS, MAX_BUILT, 2)],
    ):
        h.update("\n".join(names).encode() + b"\0")
    return h.hexdigest()[:16]


def _verdict_file(digest: bytes) -> Path:
    from ..userdirs import cache_home

    return cache_home() / "screened" / _allowlist_key() / digest.hex()


def screened_clean(data: bytes) -> bool:
    """Were these exact bytes (by SHA-256) read in full by the restricted unpickler and found to name nothing outside
    the allowlist, in this process or an earlier run (``$XDG_CACHE_HOME/ckpt-tui/screened/``)? Only then may a
    faster, partial view of them (the DCP summary reader) stand in for the full read."""
    digest = hashlib.sha256(data).digest()
    if digest in _CLEAN:
        return True
    try:
        known = _verdict_file(digest).is_file()
    except OSError:
        known = False
    if known:
        _CLEAN.add(digest)
    return known


def mark_screened_clean(data: bytes) -> None:
    """Record that ``data`` was read in full by the restricted unpickler and named nothing outside the allowlist."""
    digest = hashlib.sha256(data).digest()
    _CLEAN.add(digest)
    try:
        path = _verdict_file(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.close(fd)
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache folder: the verdict is kept for this process only
        pass


def safe_loads(data: bytes, persistent: bool = False) -> Unpickled:
    """Unpickle ``data`` with the allowlist above. Never runs code; raises FormatError on bad bytes."""
    if len(data) > MAX_PICKLE_BYTES:
        raise FormatError(f"pickle of {len(data)} bytes exceeds the {MAX_PICKLE_BYTES} byte limit")
    result = Unpickled(None)
    # A DCP .metadata of 1,024 ranks builds ~500,000 small objects and no cycles: the cyclic GC,
    # triggered every 700 allocations, would take three quarters of the time. Pause it.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        up = RestrictedUnpickler(io.BytesIO(data), result, persistent)
        up.size_hint = len(data)
        result.obj = up.load()
    except FormatError:
        raise
    except EOFError as e:
        raise FormatError(f"pickle ends early: {e}", "truncated") from None
    except RecursionError:
        raise FormatError("pickle nests too deeply") from None
    except MemoryError:
        raise FormatError("pickle asks for more memory than allowed") from None
    except Exception as e:  # any malformed stream: UnpicklingError, ValueError, TypeError, KeyError...
        if result.unsafe:
            # the stream needs code we refused to run: that is the finding, not corruption
            result.obj = None
            return result
        raise FormatError(f"not a readable pickle: {type(e).__name__}: {e}") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    return result


def name_part(k: object) -> str:
    """A dict key as a part of a tensor's dotted name (bounded, whatever the key is)."""
    return k if isinstance(k, str) else _short(k)


def iter_tensors(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, TensorRef]]:
    """Yield (dotted name, TensorRef) for every tensor reachable through dicts/lists/tuples.

    Each container is walked once, under the first name that reaches it (a container reached again, through a
    shared reference or a cycle, is not walked again), so the cost is linear in the number of objects, never in
    the number of paths (a pickle of dicts sharing their children has 2^depth paths). A tensor reached from two
    containers (tied weights) is yielded under both names. Raises FormatError past MAX_NAME_CHARS of names."""
    seen: set[int] = set()
    chars = [MAX_NAME_CHARS]
    yield from _walk(obj, prefix, depth, seen, chars)


def _walk(obj: Any, prefix: str, depth: int, seen: set[int], chars: list[int]) -> Iterator[tuple[str, TensorRef]]:
    if depth > 64:
        return
    if isinstance(obj, (TensorRef, DTensorRef, ShardedTensorRef)):
        chars[0] -= len(prefix) + 1
        if chars[0] < 0:
            raise FormatError(
                f"the object graph names more than {MAX_NAME_CHARS:,} characters of tensor names: refused"
            )
    if isinstance(obj, TensorRef):
        yield prefix, obj
    elif isinstance(obj, DTensorRef):  # the bytes this file holds: the rank's local tensor
        if obj.local is not None:
            yield prefix, obj.local
    elif isinstance(obj, ShardedTensorRef):
        held = [s.tensor for s in obj.local_shards if s.tensor is not None]
        for i, t in enumerate(held):
            yield (prefix if len(held) == 1 else f"{prefix}.{i}"), t
    elif isinstance(obj, (dict, list, tuple)):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        pairs = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in pairs:
            if isinstance(v, (dict, list, tuple, TensorRef, DTensorRef, ShardedTensorRef)):
                part = name_part(k)
                yield from _walk(v, f"{prefix}.{part}" if prefix else part, depth + 1, seen, chars)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off while millions of acyclic objects are built and folded (its collections, every 700
    allocations, would otherwise walk them all again and again)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def release_in_slices(lists: list[list[Any]], step: int = 50_000) -> None:
    """Empty each list ``step`` items from its end at a time, with Python between the slices (a thread switch
    point), instead of freeing millions of objects in one C call."""
    for lst in lists:
        while lst:
            del lst[-step:]
