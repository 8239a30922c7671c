"""verify OUT --against SRC: every exported tensor against the source read by an independent
reference path (torch's DCP loader, DeepSpeed's zero_to_fp32, torch.load, safetensors).

The reference tools unpickle without restriction, so they run only on a checkpoint whose pickles
our restricted reader screened (no ``unsafe-pickle`` finding), or with ``trust_pickles``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .export.api import ExportError, screened_model, source_for
from .export.dcp_source import model_names
from .jsondoc import JsonFields
from .progress import OnProgress, Progress, check_cancel


@dataclass
class VerifyResult(JsonFields):
    json_keys = ("ok", "compared", "mismatches", "missing_in_output", "not_in_reference", "reference")

    compared: int = 0
    mismatches: list[str] = field(default_factory=list)
    missing_in_output: list[str] = field(default_factory=list)
    not_in_reference: list[str] = field(default_factory=list)
    reference: str = ""

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.missing_in_output


def _output_tensors(out: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, safetensors dtype) of an export folder or file."""
    from .formats import safetensors_header as stfmt

    out = Path(out)
    files = [out] if out.is_file() else sorted(out.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{out}: no .safetensors files")
    res = {}
    for f in files:
        for t in stfmt.read_header(f).tensors:
            res[t.name] = (f, t.dtype)
    return res


def _reference(node, strip_prefix: Optional[str]):
    """Yields (name, tensor) from the reference loader, a tensor (or a batch) at a time."""
    import torch

    if node.format == "dcp":
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        from .formats import dcp as dcpfmt

        info = dcpfmt.read(node.abspath)
        names = model_names(info, strip_prefix)
        for key, name in names.items():
            sd: dict = {}
            _load_state_dict(sd, storage_reader=FileSystemReader(str(node.abspath)),
                             planner=_EmptyStateDictLoadPlanner(keys={key}), no_dist=True)
            flat, _ = flatten_state_dict(sd)
            yield name, flat[key]
        return "torch.distributed.checkpoint (FileSystemReader)"
    if node.format == "deepspeed-zero":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # it prints progress on stdout, our contract's channel
            sd = get_fp32_state_dict_from_zero_checkpoint(str(node.abspath.parent), tag=node.abspath.name)
        for k, v in sd.items():
            yield k, v
        return
    if node.format in ("torch-zip", "deepspeed-model-states"):
        from .export.file_sources import pick_state_dict

        obj = torch.load(node.abspath, map_location="cpu", mmap=True, weights_only=False)
        sd, _ = pick_state_dict(obj)
        stack = [("", sd)]
        while stack:
            prefix, d = stack.pop()
            for k, v in d.items():
                name = f"{prefix}{k}"
                if isinstance(v, dict):
                    stack.append((name + ".", v))
                elif isinstance(v, torch.Tensor):
                    yield (name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name), v
        return
    if node.format in ("safetensors", "safetensors-sharded-index"):
        from safetensors import safe_open

        from .export.file_sources import safetensors_source

        files = sorted({r.path for t in safetensors_source(node.abspath).tensors for r in (t.ranges or ())})
        for f in files:
            with safe_open(f, framework="pt") as st:
                for k in st.keys():
                    yield k, st.get_tensor(k)
        return
    if node.format == "deepspeed-universal":
        for d in sorted((node.abspath / "zero").iterdir()):
            p = d / "fp32.pt"
            if p.is_file():
                obj = torch.load(p, weights_only=False)
                yield d.name, (obj["param"] if isinstance(obj, dict) else obj)
        return
    raise ExportError(f"no reference loader for {node.format}")


REFERENCE_NAMES = {"dcp": "torch.distributed.checkpoint", "deepspeed-zero": "DeepSpeed zero_to_fp32",
                   "torch-zip": "torch.load", "safetensors": "safetensors", "deepspeed-universal": "torch.load (fp32.pt)",
                   "safetensors-sharded-index": "safetensors"}


def verify(out, against, *, trust_pickles: bool = False, strip_prefix: Optional[str] = None,
           on_progress: Optional[OnProgress] = None, cancel=None) -> VerifyResult:
    import torch
    from safetensors import safe_open

    _, node, _ = screened_model(against, trust_pickles=trust_pickles,
                                why="refusing to hand this checkpoint to the reference loaders")
    outs = _output_tensors(Path(out))
    res = VerifyResult(reference=REFERENCE_NAMES.get(node.format, node.format))
    # tied aliases the reference returns under both names are written once, as save_pretrained does
    aliases = {t.name for t in source_for(node, strip_prefix=strip_prefix, trust_pickles=trust_pickles).tensors
               if t.tied_to}
    seen = set()
    total = len(outs)
    handles: dict[Path, object] = {}
    try:
        for name, ref in _reference(node, strip_prefix):
            check_cancel(cancel)
            if name not in outs:
                if name not in aliases:
                    res.missing_in_output.append(name)
                continue
            seen.add(name)
            path, _ = outs[name]
            if path not in handles:
                handles[path] = safe_open(str(path), framework="pt").__enter__()
            got = handles[path].get_tensor(name)
            want = ref.to(got.dtype) if ref.is_floating_point() and got.is_floating_point() else ref
            res.compared += 1
            if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype or not torch.equal(
                    got.reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8)):
                res.mismatches.append(name)
            if on_progress:
                on_progress(Progress(len(seen), total, "files", name))
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    res.not_in_reference = sorted(set(outs) - seen)
    # tied aliases the reference returns twice are written once: not a miss
    return res
