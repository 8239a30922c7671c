"""A per-tensor listing of any component (name, shape, dtype, bytes), lazily, from headers only."""

from __future__ import annotations

from typing import Iterator

from .formats import FormatError
from .formats import dcp as dcpfmt
from .formats import deepspeed as dsfmt
from .formats import safetensors_header as stfmt
from .formats import torchfile
from .formats.pickles import iter_tensors
from .model import Node, TensorInfo


def list_tensors(node: Node) -> Iterator[TensorInfo]:
    """Yield the tensors a node holds, as its headers describe them. Raises FormatError on a broken file."""
    p = node.abspath
    if node.format == "dcp":
        info = getattr(node, "_dcp", None) or dcpfmt.read(p)
        yield from info.tensors
    elif node.format == "deepspeed-zero":
        tf = getattr(node, "_ds", None)
        if tf is None:
            raise FormatError("folder was not analysed as a DeepSpeed tag")
        yield from dsfmt.tensors(tf)
    elif node.format == "deepspeed-universal":
        zero = p / "zero"
        for d in sorted(zero.iterdir()):
            f = d / "fp32.pt"
            if not f.is_file():
                continue
            obj = torchfile.read(f).obj
            t = obj.get("param") if isinstance(obj, dict) else obj
            if hasattr(t, "shape"):
                yield TensorInfo(d.name, t.shape, t.dtype, t.nbytes)
    elif node.format == "safetensors":
        yield from stfmt.read_header(p).tensors
    elif node.format == "safetensors-sharded-index":
        doc = stfmt.read_index(p)
        files = sorted({str(v) for v in doc["weight_map"].values()})
        for fn in files:
            fp = (p.parent / fn)
            if fp.resolve().parent != p.parent.resolve():
                raise FormatError(f"index points outside its folder: {fn}")
            yield from stfmt.read_header(fp).tensors
    elif node.format in ("torch-zip", "deepspeed-model-states"):
        obj = torchfile.read(p).obj
        for name, t in iter_tensors(obj):
            yield TensorInfo(name, t.shape, t.dtype, t.nbytes)
    elif node.is_dir:
        for c in node.children:
            if c.role in ("model", "model+optimizer") and c.format != "dir":
                yield from list_tensors(c)
