"""Execute an export plan: stream bytes into safetensors files in the staged output beside OUT
(``core/staging.py``: preflight, lock, fsync, install).

Memory is bounded by one I/O buffer (plus one tensor where a dtype conversion of a general-path
tensor needs it): same-dtype byte ranges move kernel-side with ``os.copy_file_range``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from ..dtypes import ITEMSIZE as DTYPE_ITEMSIZE
from ..fsutil import OutputError, check_sources, copy_new, create_new, free_bytes, write_synced
from ..jsondoc import JsonFields, as_json
from ..progress import CancelToken, OnProgress, Progress, check_cancel
from ..staging import Sources, Stage, staged_output
from ..staging import refusal as staged_refusal
from ..storage import Location, as_path, is_url, read_chunks
from .errors import ExportError as ExportError  # write.ExportError, as before
from .plan import ExportPlan, OutFile, OutTensor, header_bytes, index_text
from .snippet import load_snippet

BUF = 16 * 1024 * 1024


@dataclass
class ExportResult(JsonFields):
    out: Path
    files: list[str]
    bytes: int
    tensors: int
    params: int
    seconds: float
    verified: Optional[bool] = None
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stripped_prefix: Optional[str] = None  # the wrapper prefix removed from every name (Lightning's "model.")
    load_code: str = ""  # Python that loads the output (export/snippet.py), OUT spelt as the user gave it

    def to_json(self) -> dict[str, Any]:
        return as_json(self) | {"seconds": round(self.seconds, 3)}


class ByteCounter:
    """Bytes done of one step, reported to ``on_progress`` at most every 50 ms (thread-safe)."""

    def __init__(self, total: int, on_progress: Optional[OnProgress], label: str) -> None:
        self.done, self.total, self.cb, self.label = 0, total, on_progress, label
        self.lock = threading.Lock()
        self.last = 0.0

    def add(self, n: int, force: bool = False) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.cb and (force or now - self.last > 0.05 or self.done >= self.total):
                self.last = now
                self.cb(Progress(self.done, self.total, "bytes", self.label))


def _copy_range(
    src_fd: int,
    dst_fd: int,
    src_off: int,
    dst_off: int,
    length: int,
    counter: ByteCounter,
    cancel: Optional[CancelToken],
) -> None:
    use_cfr = hasattr(os, "copy_file_range")
    while length > 0:
        check_cancel(cancel)
        n = min(length, BUF * 4)
        done = 0
        if use_cfr:
            try:
                done = os.copy_file_range(src_fd, dst_fd, n, src_off, dst_off)
            except OSError as e:
                if e.errno in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    use_cfr = False
                else:
                    raise
        if not use_cfr:
            data = os.pread(src_fd, min(n, BUF), src_off)
            done = os.pwrite(dst_fd, data, dst_off) if data else 0
        if done <= 0:
            raise ExportError("source ended early while copying: it changed or is truncated")
        src_off += done
        dst_off += done
        length -= done
        counter.add(done)


def _pwrite_all(dst_fd: int, data: Union[bytes, memoryview], dst_off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(dst_fd, view, dst_off)
        view, dst_off = view[n:], dst_off + n


def _write_tensor(
    t: OutTensor,
    dst_fd: int,
    dst_off: int,
    counter: ByteCounter,
    cancel: Optional[CancelToken],
    fds: dict[str, int],
    with_digest: bool = True,
) -> None:
    s = t.src
    if s.ranges is not None and any(is_url(r.path) for r in s.ranges):
        _write_remote(t, dst_fd, dst_off, counter, cancel)
        return
    if s.ranges is not None and s.dtype == t.dtype:
        for r in s.ranges:
            fd = fds.get(r.path)
            if fd is None:
                fd = fds[r.path] = os.open(r.path, os.O_RDONLY)
            _copy_range(fd, dst_fd, r.offset, dst_off, r.length, counter, cancel)
            dst_off += r.length
        return
    if s.ranges is None and s.chunks is not None:  # a computed tensor (a LoRA merge): piece by piece
        # the digest only where the file is verified against it afterwards; each piece written before the next is
        # asked for (a merge hands out views of a buffer it reuses)
        digest = hashlib.blake2b(digest_size=32) if with_digest else None
        for piece in _computed_chunks(t, cancel):
            _pwrite_all(dst_fd, piece, dst_off)
            if digest is not None:
                digest.update(piece)
            dst_off += len(piece)
            counter.add(len(piece))
        t.written_digest = digest.digest() if digest is not None else None
        return
    import torch

    dt = getattr(torch, t.dtype)
    if s.ranges is not None:  # convert dtype chunk by chunk: bounded memory
        item = DTYPE_ITEMSIZE[s.dtype]
        sdt = getattr(torch, s.dtype)
        for r in s.ranges:
            fd = fds.get(r.path)
            if fd is None:
                fd = fds[r.path] = os.open(r.path, os.O_RDONLY)
            pos, left = r.offset, r.length
            while left > 0:
                check_cancel(cancel)
                n = min(left, (BUF // item) * item)
                raw = bytearray(os.pread(fd, n, pos))
                if len(raw) != n:
                    raise ExportError("source ended early while copying: it changed or is truncated")
                out = torch.frombuffer(raw, dtype=sdt).to(dt).view(torch.uint8).numpy()
                os.pwrite(dst_fd, memoryview(out), dst_off)
                dst_off += out.nbytes
                pos += n
                left -= n
                counter.add(out.nbytes)
        return
    assert s.load is not None  # no byte ranges: the source loads the tensor itself
    tensor: Any = s.load()
    tensor = tensor.to(dt).contiguous()  # general path: one tensor in memory
    check_cancel(cancel)
    if tuple(tensor.shape) != tuple(t.shape):
        raise ExportError(f"{t.name}: loaded shape {tuple(tensor.shape)} differs from the plan {t.shape}")
    if tensor.numel():
        data = memoryview(tensor.view(torch.uint8).reshape(-1).numpy())
        written = 0
        while written < len(data):
            written += os.pwrite(dst_fd, data[written : written + BUF], dst_off + written)
    counter.add(t.nbytes)


def _computed_chunks(t: OutTensor, cancel: Optional[CancelToken]) -> Iterator[Union[bytes, memoryview]]:
    """The bytes of a computed source (``src.chunks``), cast as planned piece by piece, in pieces of at most BUF
    (memory: one generated piece and its cast). A generator that gives more or fewer bytes than the tensor's
    shape and dtype hold is an ExportError, raised as soon as it overflows: never a short or long tensor."""
    s = t.src
    assert s.chunks is not None
    item = DTYPE_ITEMSIZE[s.dtype]
    cast: Optional[Callable[[bytes], bytes]] = None
    if s.dtype != t.dtype:
        import torch

        sdt, dt = getattr(torch, s.dtype), getattr(torch, t.dtype)

        def cast(raw: bytes) -> bytes:
            return bytes(torch.frombuffer(bytearray(raw), dtype=sdt).to(dt).view(torch.uint8).numpy().tobytes())

    total, carry = 0, b""  # carry: the bytes of an element split between two pieces (cast whole elements only)
    for piece in s.chunks():  # bytes, or a view of a buffer the generator reuses once asked for the next
        check_cancel(cancel)
        total += len(piece)
        if total > s.nbytes:
            raise ExportError(f"{t.name}: computed more than its {s.nbytes} bytes")
        data = carry + bytes(piece) if carry else piece
        whole = len(data) - len(data) % item if cast is not None else len(data)
        carry = bytes(data[whole:])  # kept past the next piece: a copy (at most one element)
        view = memoryview(data)
        for i in range(0, whole, BUF):
            part = view[i : min(whole, i + BUF)]  # a view: the piece is not copied again
            yield cast(bytes(part)) if cast is not None else part
    if total != s.nbytes:
        raise ExportError(f"{t.name}: computed {total} bytes, its shape and dtype hold {s.nbytes}")


def _write_remote(t: OutTensor, dst_fd: int, dst_off: int, counter: ByteCounter, cancel: Optional[CancelToken]) -> None:
    """A tensor whose byte ranges are objects in object storage: concurrent ranged GETs, in order, bounded
    memory (storage.read_chunks); cast chunk by chunk where the plan changes the dtype."""
    for data in _source_chunks(t, cancel):
        _pwrite_all(dst_fd, data, dst_off)
        dst_off += len(data)
        counter.add(len(data))


def write_file(
    f: OutFile, path: Path, counter: ByteCounter, cancel: Optional[CancelToken], *, with_digest: bool = True
) -> None:
    """Write one output file (header, then every tensor's bytes) at ``path`` (must not exist), fsynced.
    ``with_digest``: record each computed tensor's digest, for the verification after it."""
    hdr = header_bytes(f)
    fds: dict[str, int] = {}
    fd = create_new(path)
    try:
        os.write(fd, hdr)
        off = len(hdr)
        for t in f.tensors:
            check_cancel(cancel)
            _write_tensor(t, fd, off, counter, cancel, fds, with_digest)
            off += t.nbytes
        os.ftruncate(fd, off)
        os.fsync(fd)
    finally:
        os.close(fd)
        for x in fds.values():
            os.close(x)


def source_folders(plan: ExportPlan) -> list[Path]:
    """The folders an export reads from, which OUT may not be, hold or lie inside: SRC as given, the
    component and every folder between them (a run's checkpoint). The folder above SRC (a tag's checkpoint,
    the run) only may not be OUT or lie inside it: its files are read or copied (:func:`check_out_vs_sources`),
    but a new folder beside SRC is where the TUI's and the advice's default outputs go."""
    comp = Path(str(plan.source.path)) if not is_url(plan.source.path) else None  # a local Location: a Path
    if comp is None:
        return []
    comp = comp.absolute()
    folders = [comp] if comp.is_dir() else []
    if plan.src_given and not is_url(plan.src_given):
        src = Path(plan.src_given).absolute()
        if src.is_dir():
            folders.append(src)
        if src in comp.parents:
            folders += [p for p in comp.parents if src in p.parents]
    return list(dict.fromkeys(folders))


def check_out_vs_sources(plan: ExportPlan, out: Optional[Path] = None) -> None:
    """OutputError("inside-source") where OUT (``out``, default the plan's) is, holds or lies inside what
    the export reads (:func:`source_folders`, every file read or copied)."""
    s = export_sources(plan)
    check_sources(plan.out if out is None else out, folders=s.folders, files=s.files)


def refusal(e: OutputError, plan: ExportPlan) -> str:
    """What the output preflight found, said for an export (the table in ``core/staging.py``)."""
    return staged_refusal(e, "export", out=plan.out_given or plan.out, shown=plan.shown)


def export_sources(plan: ExportPlan) -> Sources:
    """What OUT may not be, hold or lie inside for ``plan`` (as :func:`check_out_vs_sources` checks it)."""
    folders = list(dict.fromkeys([*source_folders(plan), *plan.also_folders]))  # a merge: the adapter's too
    above = [f.parent for f in folders]  # a tag's checkpoint, a checkpoint's run: OUT may not be or hold them
    return Sources(folders, [*source_files(plan), *(p for p, _ in plan.copies), *above], plan.shown)


def stage_export(
    plans: list[ExportPlan], *, overwrite: bool = False, need_bytes: Optional[int] = None
) -> AbstractContextManager[Stage]:
    """The staged output of ``plans`` (one, or the model and optimizer plans of one OUT): preflight (OUT is
    none of their sources; ``need_bytes``, default their output plus 1 MB), lock, the sources stamped."""
    first = plans[0]
    need = sum(p.output_bytes for p in plans) + (1 << 20) if need_bytes is None else need_bytes
    return staged_output(
        first.out,
        writer="export",
        error=ExportError,
        sources=[export_sources(p) for p in plans],
        watch=list(dict.fromkeys(f for p in plans for f in source_files(p))),
        overwrite=overwrite,
        need_bytes=need,
        shown_out=first.out_given or first.out,
    )


def source_files(plan: ExportPlan) -> list[Location]:
    """Every file the export reads (byte ranges; whole folder for tensors read by torch)."""
    paths = {
        r.path for f in plan.files for t in f.tensors for r in (t.src.ranges or ())
    }  # a Path per file, not per range
    files: set[Any] = set(map(as_path, paths))  # Paths or RemotePaths: each kind orders itself
    if any(t.src.ranges is None and t.src.chunks is None for f in plan.files for t in f.tensors):
        root = plan.source.path if plan.source.path.is_dir() else plan.source.path.parent
        files |= {p for p in root.iterdir() if p.is_file()}
    files |= set(plan.also_read)  # a merge reads the adapter's files too
    return sorted(files)


def write_side_files(plan: ExportPlan, tmp: Path, cancel: Optional[CancelToken] = None) -> None:
    """The index, the extra files (config) and the copied files of ``plan``, fsynced, into ``tmp``."""
    if plan.index:
        write_synced(tmp / plan.index_name, index_text(plan))
    for name, text in plan.extra_files:
        write_synced(tmp / name, text)
    for src, name in plan.copies:
        check_cancel(cancel)
        if "/" in name:  # a tokenizer's named chat templates: additional_chat_templates/X.jinja
            (tmp / name).parent.mkdir(exist_ok=True)
        if is_url(src):
            write_synced(tmp / name, as_path(src).read_bytes())
        else:
            copy_new(os.path.realpath(str(src)), tmp / name)  # checked by the plan: a regular file of the checkpoint


def raise_no_space(e: OSError, plan: ExportPlan) -> None:
    """Turn a full disk into the ExportError that says so (returns for any other OSError)."""
    if e.errno == errno.ENOSPC:
        from ..units import naturalsize

        out = plan.out
        raise ExportError(
            f"no space left on {out.parent}: needed {naturalsize(plan.total_bytes)}, had "
            f"{naturalsize(free_bytes(out.parent) + plan.total_bytes)} before "
            "starting; the partial output was removed"
        ) from None


def write_plan(
    plan: ExportPlan,
    stage: Stage,
    *,
    jobs: int = 1,
    verify: bool = True,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
) -> ExportResult:
    """Write ``plan``'s files into ``stage.path`` (an existing folder), the sources still as stamped, and
    verify them: everything but the install. Returns the result, timed by the caller."""
    folder = stage.path
    counter = ByteCounter(plan.tensor_bytes, on_progress, "writing")
    if jobs > 1 and len(plan.files) > 1:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = [
                pool.submit(write_file, f, folder / f.name, counter, cancel, with_digest=verify) for f in plan.files
            ]
            for fu in futs:
                fu.result()
    else:
        for f in plan.files:
            write_file(f, folder / f.name, counter, cancel, with_digest=verify)
    counter.add(0, force=True)
    write_side_files(plan, folder, cancel)
    result = ExportResult(
        plan.out,
        [f.name for f in plan.files],
        plan.tensor_bytes,
        sum(len(f.tensors) for f in plan.files),
        plan.params,
        0.0,
    )
    stage.check_unchanged()
    if verify:
        result.mismatches = verify_files(plan, folder, on_progress, cancel)
        result.verified = not result.mismatches
        if result.mismatches:
            raise ExportError("verification failed: " + ", ".join(result.mismatches[:5]))
    result.notes = list(plan.to_plan().notes)
    result.stripped_prefix = plan.prefix.strip if plan.prefix is not None else None
    result.load_code = load_snippet(plan)
    return result


def execute(
    plan: ExportPlan,
    *,
    jobs: int = 1,
    overwrite: bool = False,
    verify: bool = True,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
) -> ExportResult:
    t0 = time.monotonic()
    try:
        with stage_export([plan], overwrite=overwrite) as stage:
            result = write_plan(plan, stage, jobs=jobs, verify=verify, on_progress=on_progress, cancel=cancel)
            stage.commit()
    except OSError as e:
        raise_no_space(e, plan)
        raise
    result.seconds = time.monotonic() - t0
    return result


def _opened(path: str, fds: Optional[dict[str, int]]) -> tuple[int, bool]:
    """(a read fd for ``path``, whether the caller closes it): one kept in ``fds`` per file (its owner closes them
    all), or a new one where ``fds`` is None."""
    if fds is None:
        return os.open(path, os.O_RDONLY), True
    fd = fds.get(path)
    if fd is None:
        fd = fds[path] = os.open(path, os.O_RDONLY)
    return fd, False


def _source_chunks(
    t: OutTensor, cancel: Optional[CancelToken] = None, fds: Optional[dict[str, int]] = None
) -> Iterator[Union[bytes, memoryview]]:
    """The tensor's bytes as the output should hold them (cast as planned), in pieces of at most BUF. ``fds``: the
    source files' fds, opened once per file (a header of 10^6 tensors: not an open per tensor)."""
    s = t.src
    if s.ranges is not None and s.dtype == t.dtype:
        for r in s.ranges:
            if is_url(r.path):
                yield from read_chunks(r.path, r.offset, r.length, BUF, cancel)
                continue
            fd, own = _opened(r.path, fds)
            try:
                pos, left = r.offset, r.length
                while left > 0:
                    check_cancel(cancel)
                    data = os.pread(fd, min(left, BUF), pos)
                    if not data:
                        raise ExportError(f"{r.path} ended early while verifying")
                    pos += len(data)
                    left -= len(data)
                    yield data
            finally:
                if own:
                    os.close(fd)
        return
    import torch

    dt = getattr(torch, t.dtype)
    if s.ranges is not None:
        item = DTYPE_ITEMSIZE[s.dtype]
        sdt = getattr(torch, s.dtype)
        for r in s.ranges:
            if is_url(r.path):
                for raw in read_chunks(r.path, r.offset, r.length, (BUF // item) * item, cancel):
                    yield torch.frombuffer(bytearray(raw), dtype=sdt).to(dt).view(torch.uint8).numpy().tobytes()
                continue
            with open(r.path, "rb") as f:
                pos, left = r.offset, r.length
                while left > 0:
                    check_cancel(cancel)
                    n = min(left, (BUF // item) * item)
                    buf = bytearray(os.pread(f.fileno(), n, pos))
                    pos += n
                    left -= n
                    yield torch.frombuffer(buf, dtype=sdt).to(dt).view(torch.uint8).numpy().tobytes()
        return
    if s.chunks is not None:
        yield from _computed_chunks(t, cancel)
        return
    assert s.load is not None
    loaded: Any = s.load()
    tensor = loaded.to(dt).contiguous()
    data = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else b""
    for i in range(0, len(data), BUF):
        yield bytes(data[i : i + BUF])


def verify_files(
    plan: ExportPlan,
    folder: Path,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
    files: Optional[list[OutFile]] = None,
) -> list[str]:
    """Re-read every written tensor from disk and compare it bit-exact with the source (cast as
    planned), streamed in BUF-sized pieces: memory stays flat whatever the model size, and
    tensors whose dtype is kept are compared without torch. ``files``: only these (default: all)."""
    bad: list[str] = []
    files = plan.files if files is None else files
    counter = ByteCounter(sum(f.nbytes for f in files), on_progress, "verifying")
    fds: dict[str, int] = {}  # the source files, each opened once
    try:
        _verify_files(files, folder, counter, cancel, fds, bad)
    finally:
        for x in fds.values():
            os.close(x)
    return bad


def _verify_files(
    files: list[OutFile],
    folder: Path,
    counter: ByteCounter,
    cancel: Optional[CancelToken],
    fds: dict[str, int],
    bad: list[str],
) -> None:
    from ..formats.safetensors import header as stfmt

    for f in files:
        h = stfmt.read_header(folder / f.name)
        if (h.metadata or {}).get("format") != "pt":
            bad.append(f"{f.name}: header metadata lacks format=pt")
        infos = dict(zip(h.names, zip(map(tuple, h.shapes), h.dtypes)))  # name -> (shape, dtype): no TensorInfo
        offsets = h.offsets
        fd = os.open(folder / f.name, os.O_RDONLY)
        try:
            for t in f.tensors:
                check_cancel(cancel)
                info = infos.get(t.name)
                if info is None or info[0] != tuple(t.shape) or info[1] != t.dtype:
                    bad.append(t.name)
                    continue
                pos = h.data_start + offsets[t.name][0]
                end = h.data_start + offsets[t.name][1]
                if t.written_digest is not None:  # computed (a merge): the file against what was computed
                    digest = hashlib.blake2b(digest_size=32)
                    while pos < end:
                        check_cancel(cancel)
                        got = os.pread(fd, min(BUF, end - pos), pos)
                        if not got:
                            break
                        digest.update(got)
                        pos += len(got)
                        counter.add(len(got))
                    if pos != end or digest.digest() != t.written_digest:
                        bad.append(t.name)
                    continue
                ok = True
                for chunk in _source_chunks(t, cancel, fds):
                    got = os.pread(fd, len(chunk), pos)
                    if got != chunk:
                        ok = False
                        break
                    pos += len(chunk)
                    counter.add(len(chunk))
                if not ok or pos != end:
                    bad.append(t.name)
        finally:
            os.close(fd)
