"""Streamed per-tensor statistics and differences, read with the export sources (bounded memory)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .export.api import screened_model, source_for
from .export.sources import Source, SourceTensor, to_torch
from .jsondoc import JsonFields
from .progress import OnProgress, Progress, check_cancel
from .storage import LocationLike, open_read

if TYPE_CHECKING:
    import torch

CHUNK_ELEMS = 4 * 1024 * 1024


def open_source(path: LocationLike, *, trust_pickles: bool = False, strip_prefix: Optional[str] = None) -> Source:
    """The model weights at ``path`` as a Source (what export would read), after the safety screen."""
    _, node, _ = screened_model(path, trust_pickles=trust_pickles)
    return source_for(node, strip_prefix=strip_prefix, trust_pickles=trust_pickles)


@dataclass
class TensorStats(JsonFields):
    json_keys = ("name", "dtype", "numel", "min", "max", "mean", "std", "nan", "inf", "shape")  # not listed_as

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    min: Optional[float] = None
    max: Optional[float] = None
    mean: Optional[float] = None
    std: Optional[float] = None
    nan: int = 0
    inf: int = 0
    # the tensor's name in ``list_tensors`` of the same path (a torch file lists `module.X` where the
    # weights, and so these statistics, are named `X`): what a listing matches its rows on
    listed_as: str = ""

    def __post_init__(self) -> None:
        self.listed_as = self.listed_as or self.name


def _chunks(t: SourceTensor) -> Iterator[torch.Tensor]:
    """The tensor as float64 chunks (flat), at most CHUNK_ELEMS elements each."""
    import torch

    if t.ranges is None:
        flat = to_torch(t).reshape(-1)
        for i in range(0, flat.numel(), CHUNK_ELEMS):
            yield flat[i : i + CHUNK_ELEMS].to(torch.float64)
        return
    from .dtypes import ITEMSIZE

    item = ITEMSIZE[t.dtype]
    dt = getattr(torch, t.dtype)
    for r in t.ranges:
        with open_read(r.path) as f:
            f.seek(r.offset)
            left = r.length
            while left > 0:
                n = min(left, CHUNK_ELEMS * item)
                raw = bytearray(f.read(n))
                if len(raw) != n:
                    raise OSError(f"{r.path}: file ended early")
                left -= n
                yield torch.frombuffer(raw, dtype=dt).to(torch.float64)


def _fixed_chunks(t: SourceTensor, n: int = CHUNK_ELEMS) -> Iterator[torch.Tensor]:
    """Like _chunks but every chunk (except the last) has exactly n elements, so two tensors whose
    bytes are split differently (partitions, shards) can be walked side by side."""
    import torch

    buf: list[torch.Tensor] = []
    have = 0
    for c in _chunks(t):
        buf.append(c)
        have += c.numel()
        while have >= n:
            cat = torch.cat(buf) if len(buf) > 1 else buf[0]
            yield cat[:n]
            rest = cat[n:]
            buf = [rest] if rest.numel() else []
            have = rest.numel()
    if have:
        yield torch.cat(buf) if len(buf) > 1 else buf[0]


def tensor_stats(t: SourceTensor, cancel: Optional[threading.Event] = None) -> TensorStats:
    import torch

    st = TensorStats(t.name, t.shape, t.dtype, t.numel, listed_as=t.listed_as or t.name)
    if t.numel == 0:
        return st
    n = 0
    s = 0.0
    ss = 0.0
    lo, hi = math.inf, -math.inf
    for c in _chunks(t):
        check_cancel(cancel)
        nan = torch.isnan(c)
        inf = torch.isinf(c)
        st.nan += int(nan.sum())
        st.inf += int(inf.sum())
        fin = c[~(nan | inf)]
        if fin.numel():
            n += fin.numel()
            s += float(fin.sum())
            ss += float((fin * fin).sum())
            lo = min(lo, float(fin.min()))
            hi = max(hi, float(fin.max()))
    if n:
        st.min, st.max = lo, hi
        st.mean = s / n
        var = max(0.0, ss / n - st.mean * st.mean)
        st.std = math.sqrt(var * n / (n - 1)) if n > 1 else 0.0
    return st


def stats(
    path: LocationLike,
    *,
    trust_pickles: bool = False,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
) -> list[TensorStats]:
    src = open_source(path, trust_pickles=trust_pickles)
    total = sum(t.nbytes for t in src.tensors if t.tied_to is None)
    done = 0
    out = []
    for t in src.tensors:
        if t.tied_to is not None:
            continue
        out.append(tensor_stats(t, cancel))
        done += t.nbytes
        if on_progress:
            on_progress(Progress(done, total, "bytes", t.name))
    return out


@dataclass
class DiffResult(JsonFields):
    json_keys = ("only_a", "only_b", "changed", "max_abs_diff=max_abs", "identical")

    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)  # shape/dtype changes
    max_abs: dict[str, float] = field(default_factory=dict)  # common tensors: max |a-b| (nan if any NaN differs)

    @property
    def identical(self) -> bool:
        return not (self.only_a or self.only_b or self.changed or any(v != 0 for v in self.max_abs.values()))


def diff(
    a: LocationLike,
    b: LocationLike,
    *,
    trust_pickles: bool = False,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
) -> DiffResult:
    import torch

    sa = open_source(a, trust_pickles=trust_pickles)
    sb = open_source(b, trust_pickles=trust_pickles)
    ta = {t.name: t for t in sa.tensors if t.tied_to is None}
    tb = {t.name: t for t in sb.tensors if t.tied_to is None}
    res = DiffResult(sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta)))
    common = [n for n in ta if n in tb]
    total = sum(ta[n].nbytes for n in common)
    done = 0
    for n in common:
        check_cancel(cancel)
        x, y = ta[n], tb[n]
        if x.shape != y.shape:
            res.changed.append(
                {
                    "name": n,
                    "a": {"shape": list(x.shape), "dtype": x.dtype},
                    "b": {"shape": list(y.shape), "dtype": y.dtype},
                }
            )
            continue
        if x.dtype != y.dtype:
            res.changed.append(
                {
                    "name": n,
                    "a": {"shape": list(x.shape), "dtype": x.dtype},
                    "b": {"shape": list(y.shape), "dtype": y.dtype},
                }
            )
        m = 0.0
        for ca, cb in zip(_fixed_chunks(x), _fixed_chunks(y)):
            d = (ca - cb).abs()
            both_nan = torch.isnan(ca) & torch.isnan(cb)
            d = torch.where(both_nan, torch.zeros_like(d), d)
            if torch.isnan(d).any():
                m = math.nan
                break
            if d.numel():
                m = max(m, float(d.max()))
        res.max_abs[n] = m
        done += x.nbytes
        if on_progress:
            on_progress(Progress(done, total, "bytes", n))
    return res
