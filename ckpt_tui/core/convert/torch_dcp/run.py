"""Write a planned conversion: torch's own ``dcp.save`` (single process, no process group) over a
state dict of ``meta`` tensors whose data a planner reads from the source only when the writer asks
for it, into files of at most ``FILE_BYTES`` each — so memory stays bounded by the larger of
``FILE_BYTES`` and the largest tensor (DCP's file writer holds a file's tensors until the file is
closed; one file per rank, its default, would hold them all). Then every tensor is read back with
torch's own ``dcp.load`` and compared bit-exact with the source, the files kept as they are
(``scheduler.pt``, ``rng_state_*.pth``) are copied, ``conversion.json`` says what carried over, and
the folder is installed as the staged output (``core/staging.py``). Cancel or failure removes the
staging folder."""

from __future__ import annotations

import json
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ...export.sources import SourceTensor
from ...formats import screen
from ...fsutil import copy_new
from ...jsondoc import JsonFields, as_json
from ...progress import Cancelled, CancelToken, OnProgress, report
from ...staging import Sources, staged_output
from .instructions import instructions
from .plan import NOTE_FILE, TorchDcpError, TorchDcpPlan

FILE_BYTES = 256 << 20  # tensors per .distcp file: the memory bound of the write


@dataclass
class TorchDcpResult(JsonFields):
    json_keys = (
        "out",
        "seconds",
        "tensors",
        "bytes=nbytes",
        "files",
        "carried",
        "not_carried",
        "instructions",
        "warnings",
    )

    out: Path
    seconds: float
    tensors: int
    nbytes: int
    files: int
    carried: list[str]
    not_carried: list[str]
    instructions: str
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return as_json(self, self.json_keys) | {"seconds": round(self.seconds, 3)}


# torch is not followed by mypy (pyproject.toml): its tensors, planners, writers and plans are Any here
def read_tensor(t: SourceTensor) -> Any:
    """``t`` as a torch tensor, its bytes read straight into the tensor's memory (one copy)."""
    import torch

    if t.load is not None:
        return t.load()
    buf = torch.empty(t.nbytes, dtype=torch.uint8)
    mv = memoryview(buf.numpy())
    pos = 0
    for r in t.ranges or ():
        with open(r.path, "rb") as f:
            f.seek(r.offset)
            n = f.readinto(mv[pos : pos + r.length])
        if n != r.length:
            raise OSError(f"{r.path}: expected {r.length} bytes at {r.offset}, got {n}")
        pos += r.length
    return buf.view(getattr(torch, t.dtype)).reshape(t.shape)


def _state(plan: TorchDcpPlan) -> tuple[dict[str, Any], dict[int, SourceTensor]]:
    """The state dict to save (meta tensors standing for the source's) and, by id of each meta
    tensor, how to read it."""
    import torch

    loaders: dict[int, SourceTensor] = {}

    def meta(t: SourceTensor) -> Any:
        m = torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta")
        loaders[id(m)] = t
        return m

    by_name = {t.name: t for t in plan.model}
    model: dict[str, Any] = {}
    for t in plan.model:
        target = by_name[t.tied_to] if t.tied_to else t
        model[t.name] = meta(target)
    opt_state: dict[str, dict[str, Any]] = {}
    for o in plan.optim:
        s = opt_state.setdefault(o.fqn, {"step": torch.tensor(float(plan.steps[o.fqn]), dtype=torch.float32)})
        s[o.key] = meta(o.source)
    state: dict[str, Any] = {
        "model": model,
        "optimizer": {"state": opt_state, "param_groups": [dict(g) for g in plan.param_groups]},
        "step": plan.global_step if plan.global_step is not None else 0,
    }
    return state, loaders


def _save(
    plan: TorchDcpPlan, folder: Path, on_progress: Optional[OnProgress], cancel: Optional[CancelToken]
) -> tuple[int, int]:
    """dcp.save of the plan's state into ``folder``, bounded; (tensors, bytes) written."""
    import queue

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import filesystem as fsmod
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    state, loaders = _state(plan)
    total = sum(t.nbytes for t in loaders.values())
    done = [0, 0]

    class LazyPlanner(DefaultSavePlanner):  # type: ignore[misc]  # torch's class: Any to mypy (not followed)
        def resolve_data(self, write_item: Any) -> Any:
            obj = self.lookup_object(write_item.index)
            src = loaders.get(id(obj))
            if src is None:
                return self.transform_object(write_item, obj)
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled")
            t = read_tensor(src)
            done[0] += 1
            done[1] += src.nbytes
            report(on_progress, done[1], total, "bytes", "writing")
            return t

    class BoundedWriter(fsmod.FileSystemWriter):  # type: ignore[misc]  # torch's class: Any to mypy (not followed)
        def write_data(self, plan_: Any, planner: Any) -> Any:
            prefix = plan_.storage_data.prefix
            q: queue.Queue[tuple[Any, str, list[Any]]] = queue.Queue()  # (path, file name, write items)
            bucket: list[Any] = []
            size, n = 0, 0

            def flush() -> None:
                nonlocal bucket, size, n
                name = f"{prefix}{n}{fsmod.DEFAULT_SUFFIX}"
                q.put((self.fs.concat_path(self.path, name), name, bucket))
                bucket, size, n = [], 0, n + 1

            for item in plan_.items:
                s = fsmod._item_size(item) if item.type != WriteItemType.BYTE_IO else 0
                if bucket and size + s > FILE_BYTES:
                    flush()
                bucket.append(item)
                size += s
            if bucket:
                flush()
            return self._write_data(planner, q)

    writer = BoundedWriter(str(folder), single_file_per_rank=True, sync_files=True, thread_count=1)
    try:
        with _quiet():
            dcp.save(state, storage_writer=writer, planner=LazyPlanner(), no_dist=True)
    except (KeyboardInterrupt, SystemExit, Cancelled):
        raise
    except BaseException as e:  # dcp wraps what the planner raised in a CheckpointException (a BaseException)
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled") from None
        raise TorchDcpError(f"torch.distributed.checkpoint could not write the output: {e}") from None
    return done[0], done[1]


@contextmanager
def _quiet() -> Iterator[None]:
    """No "assuming the intent is to save in a single process" warning: that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        yield


def _verify(plan: TorchDcpPlan, folder: Path, on_progress: Optional[OnProgress], cancel: Optional[CancelToken]) -> int:
    """Read every tensor back with torch's own dcp.load, a bounded batch at a time, and compare it
    bit-exact with the source; the step and param groups too. Returns the number of tensors checked."""
    import torch
    import torch.distributed.checkpoint as dcp

    items: list[tuple[tuple[str, ...], SourceTensor]] = []
    by_name = {t.name: t for t in plan.model}
    for t in plan.model:
        items.append((("model", t.name), by_name[t.tied_to] if t.tied_to else t))
    for o in plan.optim:
        items.append((("optimizer", "state", o.fqn, o.key), o.source))
    total = sum(s.nbytes for _, s in items)
    done = 0
    reader = screen.dcp_reader(folder)  # our own output, still screened: the metadata unpickled by ckpt-tui
    i = 0
    while i < len(items):
        batch: list[tuple[tuple[str, ...], SourceTensor]] = []
        size = 0
        while i < len(items) and (not batch or size + items[i][1].nbytes <= FILE_BYTES):
            batch.append(items[i])
            size += items[i][1].nbytes
            i += 1
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled")
        want: dict[str, Any] = {}
        for path, s in batch:
            d = want
            for k in path[:-1]:
                d = d.setdefault(k, {})
            d[path[-1]] = torch.empty(s.shape, dtype=getattr(torch, s.dtype))
        with _quiet():
            dcp.load(want, storage_reader=reader, no_dist=True)
        for path, s in batch:
            got = want
            for k in path:
                got = got[k]
            if not torch.equal(got, read_tensor(s)):
                raise TorchDcpError(
                    f"verification failed: {'.'.join(path)} read back from the output differs from the source"
                )
            done += s.nbytes
        report(on_progress, done, total, "bytes", "verifying")
    back: dict[str, Any] = {
        "optimizer": {
            "state": {fqn: {"step": torch.tensor(0.0)} for fqn in plan.steps},
            "param_groups": [{k: None for k in g} for g in plan.param_groups],
        },
        "step": -1,
    }
    with _quiet():
        dcp.load(back, storage_reader=reader, no_dist=True)
    for fqn, st in plan.steps.items():
        if float(back["optimizer"]["state"][fqn]["step"]) != float(st):
            raise TorchDcpError(
                f"verification failed: the step of {fqn} reads back as "
                f"{back['optimizer']['state'][fqn]['step']}, not {st}"
            )
    if back["optimizer"]["param_groups"] != plan.param_groups or back["step"] != (plan.global_step or 0):
        raise TorchDcpError("verification failed: the param groups or the step read back differ from what was written")
    return len(items)


def note(plan: TorchDcpPlan) -> dict[str, Any]:
    """The content of conversion.json."""
    return {
        "converted_by": "ckpt-tui convert --to torch-dcp",
        "source": str(plan.tag_dir),
        "source_framework": plan.framework,
        "zero_stage": plan.stage,
        "source_world_size": plan.world_size,
        "step": plan.global_step,
        "optimizer": {
            "class": f"torch.optim.{plan.optimizer_class}",
            "hyper_parameters": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.hyper.items()},
        },
        "parameters": "fp32 masters"
        + (f" (the run trained in {plan.train_dtype})" if plan.train_dtype in ("bfloat16", "float16") else ""),
        "strip_prefix": plan.strip_prefix,
        "carried_files": [f.name for f in plan.carried],
        "not_carried": plan.not_carried,
        "warnings": plan.warnings,
    }


def convert_to_torch_dcp(
    plan: TorchDcpPlan, *, on_progress: Optional[OnProgress] = None, cancel: Optional[CancelToken] = None
) -> TorchDcpResult:
    """Write ``plan``'s output (see the module). Raises :class:`TorchDcpError` on failure and
    :class:`Cancelled` on cancel; either way nothing is left under the final name."""
    t0 = time.monotonic()
    out = plan.out
    sources = sorted(
        {r.path for t in plan.model for r in (t.ranges or ())}
        | {r.path for o in plan.optim for r in (o.source.ranges or ())}
    )
    with staged_output(  # preflight again (time has passed since the plan), lock, the sources stamped
        out,
        writer="torch-dcp",
        error=TorchDcpError,
        sources=[Sources(folders=[plan.tag_dir.parent])],
        watch=sources,
        need_bytes=2 * plan.estimated_bytes,
        scratch=True,
    ) as stage:
        inner = stage.path
        n, nbytes = _save(plan, inner, on_progress, cancel)
        for f in plan.carried:
            copy_new(os.path.realpath(f), inner / f.name)  # a regular file of the checkpoint (checked by the plan)
        (inner / NOTE_FILE).write_text(json.dumps(note(plan), indent=2) + "\n")
        stage.check_unchanged()
        _verify(plan, inner, on_progress, cancel)
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled")
        files = sum(1 for _ in inner.iterdir())
        stage.commit()  # every file fsynced, then installed
    return TorchDcpResult(
        out=out,
        seconds=time.monotonic() - t0,
        tensors=n,
        nbytes=nbytes,
        files=files,
        carried=[f.name for f in plan.carried],
        not_carried=list(plan.not_carried),
        instructions=instructions(plan),
        warnings=list(plan.warnings),
    )
