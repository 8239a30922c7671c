"""Verify a universal checkpoint against the ZeRO tag folder it was converted from: every
parameter's state files present, fp32 bit-exact equal to the master we reconstruct ourselves."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ...jsondoc import JsonFields
from .plan import STATE_FILES_Z3, STATE_FILES_Z12, UniversalError

if TYPE_CHECKING:
    import torch


@dataclass
class UniversalVerification(JsonFields):
    ok: bool
    checked: int
    problems: list[str] = field(default_factory=list)
    frozen_ok: list[str] = field(default_factory=list)
    frozen_absent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _load_state(path: Path) -> Any:  # what torch.load gives: a tensor here, or whatever the file holds
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "param" in obj:
        obj = obj["param"]
    return obj


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    if a.dtype != b.dtype or a.numel() != b.numel():
        return False
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    if a.dtype.is_floating_point:
        iv = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(torch.equal(a.view(iv), b.view(iv)))
    return bool(torch.equal(a, b))


def verify_universal(
    universal_dir: Union[str, os.PathLike[str]],
    tag_dir: Union[str, os.PathLike[str]],
    *,
    cancel: Optional[threading.Event] = None,
) -> UniversalVerification:
    """Check a universal checkpoint against the ZeRO tag folder it was converted from.

    Trainable parameters: ``fp32``/``exp_avg``/``exp_avg_sq`` (+ ``step`` for ZeRO-1/2) present and
    fp32 bit-exact equal to the master reconstructed from the source. Frozen parameters and buffers
    (ZeRO-1/2): ``fp32`` equal to the upcast model weight; absent (ZeRO-3): reported.
    """
    from ...export.sources import to_torch
    from ...formats.deepspeed.zero import deepspeed_source
    from ...progress import check_cancel

    universal_dir, tag_dir = Path(universal_dir), Path(tag_dir)
    try:
        source = deepspeed_source(tag_dir)
    except ValueError as e:
        raise UniversalError(f"{tag_dir}: {e}") from None
    from ...formats.torch_save import torchfile

    stage = (
        3
        if any(p.name.startswith("zero_pp_rank_") and p.name.endswith("_model_states.pt") for p in tag_dir.iterdir())
        else 2
    )
    buffer_names: set[str] = set()
    ms = tag_dir / ("mp_rank_00_model_states.pt" if stage <= 2 else "zero_pp_rank_0_mp_rank_00_model_states.pt")
    obj = torchfile.read(ms).obj
    if isinstance(obj, dict):
        buffer_names = {str(b) for b in (obj.get("buffer_names") or [])}
    zdir = universal_dir / "zero"
    res = UniversalVerification(ok=False, checked=0)
    if not zdir.is_dir():
        res.problems.append(f"{universal_dir} has no zero/ folder")
        return res
    for name in ("optimizer_state.pt",):
        if not (zdir / name).is_file():
            res.problems.append(f"zero/{name} missing")
    states = STATE_FILES_Z12 if stage <= 2 else STATE_FILES_Z3
    for t in source.tensors:
        check_cancel(cancel)
        if t.tied_to:
            continue
        pdir = zdir / t.name
        is_buf = t.name in buffer_names
        if t.frozen or is_buf:
            fp = pdir / "fp32.pt"
            if not fp.is_file():
                if stage == 3 and is_buf:
                    res.notes.append(
                        f"buffer {t.name} is not in the universal checkpoint (ZeRO-3); "
                        "load_universal does not restore buffers"
                    )
                elif stage == 3:
                    res.frozen_absent.append(t.name)
                else:
                    res.problems.append(
                        f"{'buffer' if is_buf else 'frozen param'} {t.name}: zero/{t.name}/fp32.pt missing"
                    )
                continue
            got = _load_state(fp)
            if not _bits_equal(got, to_torch(t).to(got.dtype)):
                res.problems.append(f"{t.name}: fp32.pt differs from the upcast model weight")
            elif not is_buf:
                res.frozen_ok.append(t.name)
            res.checked += 1
            continue
        missing = [s for s in states if not (pdir / f"{s}.pt").is_file()]
        if missing:
            res.problems.append(f"{t.name}: missing {', '.join(s + '.pt' for s in missing)}")
            continue
        got = _load_state(pdir / "fp32.pt")
        want = to_torch(t)
        if tuple(got.shape) not in (tuple(want.shape), (want.numel(),)):
            res.problems.append(f"{t.name}: fp32 shape {tuple(got.shape)}, source {tuple(want.shape)}")
        elif not _bits_equal(got, want):
            res.problems.append(f"{t.name}: fp32 differs from the master reconstructed from the source")
        for s in ("exp_avg", "exp_avg_sq"):
            st = _load_state(pdir / f"{s}.pt")
            if getattr(st, "numel", lambda: -1)() != want.numel():
                res.problems.append(
                    f"{t.name}: {s}.pt holds {getattr(st, 'shape', '?')}, expected {want.numel()} elements"
                )
        res.checked += 1
    if res.frozen_absent:
        res.notes.append(
            f"{len(res.frozen_absent)} frozen param(s) absent from the universal checkpoint (ZeRO-3 "
            f"leaves them out): {', '.join(res.frozen_absent[:5])}"
        )
    res.ok = not res.problems
    return res
