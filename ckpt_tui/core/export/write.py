"""Execute an export plan: stream bytes into safetensors files in a temp folder, fsync, os.replace.

Memory is bounded by one I/O buffer (plus one tensor where a dtype conversion of a general-path
tensor needs it): same-dtype byte ranges move kernel-side with ``os.copy_file_range``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..dtypes import ITEMSIZE as DTYPE_ITEMSIZE
from ..fsutil import (
    OutputError,
    changed,
    check_sources,
    copy_new,
    create_new,
    flock_exclusive,
    free_bytes,
    fsync_dir,
    preflight_output,
    snapshot,
    write_synced,
)
from ..jsondoc import JsonFields, as_json
from ..progress import OnProgress, Progress, check_cancel
from ..storage import as_path, is_url, read_chunks
from .plan import ExportPlan, OutFile, OutTensor, header_bytes, index_text
from .snippet import load_snippet

BUF = 16 * 1024 * 1024


class ExportError(Exception):
    """The export cannot run or failed; the message says why and what to do."""


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

    def to_json(self) -> dict:
        return as_json(self) | {"seconds": round(self.seconds, 3)}


class ByteCounter:
    """Bytes done of one step, reported to ``on_progress`` at most every 50 ms (thread-safe)."""

    def __init__(self, total: int, on_progress: Optional[OnProgress], label: str):
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


def _copy_range(src_fd: int, dst_fd: int, src_off: int, dst_off: int, length: int, counter, cancel) -> None:
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


def _pwrite_all(dst_fd: int, data, dst_off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(dst_fd, view, dst_off)
        view, dst_off = view[n:], dst_off + n


def _write_tensor(t: OutTensor, dst_fd: int, dst_off: int, counter, cancel, fds: dict) -> None:
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
    tensor = s.load().to(dt).contiguous()  # general path: one tensor in memory
    check_cancel(cancel)
    if tuple(tensor.shape) != tuple(t.shape):
        raise ExportError(f"{t.name}: loaded shape {tuple(tensor.shape)} differs from the plan {t.shape}")
    if tensor.numel():
        data = memoryview(tensor.view(torch.uint8).reshape(-1).numpy())
        written = 0
        while written < len(data):
            written += os.pwrite(dst_fd, data[written : written + BUF], dst_off + written)
    counter.add(t.nbytes)


def _write_remote(t: OutTensor, dst_fd: int, dst_off: int, counter, cancel) -> None:
    """A tensor whose byte ranges are objects in object storage: concurrent ranged GETs, in order, bounded
    memory (storage.read_chunks); cast chunk by chunk where the plan changes the dtype."""
    for data in _source_chunks(t, cancel):
        _pwrite_all(dst_fd, data, dst_off)
        dst_off += len(data)
        counter.add(len(data))


def write_file(f: OutFile, path: Path, counter, cancel) -> None:
    """Write one output file (header, then every tensor's bytes) at ``path`` (must not exist), fsynced."""
    hdr = header_bytes(f)
    fds: dict[str, int] = {}
    fd = create_new(path)
    try:
        os.write(fd, hdr)
        off = len(hdr)
        for t in f.tensors:
            check_cancel(cancel)
            _write_tensor(t, fd, off, counter, cancel, fds)
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
    comp = Path(plan.source.path) if not is_url(plan.source.path) else None
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
    folders = source_folders(plan)
    above = [f.parent for f in folders]  # a tag's checkpoint, a checkpoint's run: OUT may not be or hold them
    check_sources(
        plan.out if out is None else out,
        folders=folders,
        files=[*source_files(plan), *(p for p, _ in plan.copies), *above],
    )


def refusal(e: OutputError, plan: ExportPlan) -> str:
    """What the output preflight found, said for an export."""
    out, parent = plan.out, plan.out.parent
    if e.kind == "no-space":
        from ..units import naturalsize

        return f"no space left on {parent}: the export needs {naturalsize(e.need)}, {naturalsize(e.free)} is free"
    if e.kind == "inside-source":
        return e.source_text(plan.out_given or out, plan.shown(e.source))
    return {
        "missing": f"{parent} does not exist; create it first",
        "read-only": f"no write permission in {parent}",
        "not-writable": f"no write permission in {parent}",
        "not-a-folder": f"{out} exists and is not a folder",
        "not-empty": f"{out} is not empty; choose another --out or pass --overwrite",
    }[e.kind]


def preflight(plan: ExportPlan, overwrite: bool) -> None:
    out = plan.out
    try:
        check_out_vs_sources(plan)
        preflight_output(out, need=plan.output_bytes + (1 << 20), overwrite=overwrite)
    except OutputError as e:
        raise ExportError(refusal(e, plan)) from None


def source_files(plan: ExportPlan) -> list[Path]:
    """Every file the export reads (byte ranges; whole folder for tensors read by torch)."""
    paths = {
        r.path for f in plan.files for t in f.tensors for r in (t.src.ranges or ())
    }  # a Path per file, not per range
    files = set(map(as_path, paths))
    if any(t.src.ranges is None for f in plan.files for t in f.tensors):
        root = plan.source.path if plan.source.path.is_dir() else plan.source.path.parent
        files |= {p for p in root.iterdir() if p.is_file()}
    return sorted(files)


class OutputLock:
    """The lock beside OUT (``.OUT.ckpt-tui.lock``) that one exporter into OUT holds, and the temp
    folders (``.OUT.tmp-PID``) only the holder may create or sweep. The lock file is created with
    ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a killed run's is reused, never through a symbolic link) and
    nothing is ever written to it."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.parent / f".{out.name}.ckpt-tui.lock"
        self.fd: Optional[int] = None

    def acquire(self) -> None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        for _ in range(100):
            try:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    fd = os.open(self.path, flags)  # a killed run's lock file
            except FileNotFoundError:  # its holder removed it meanwhile
                continue
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EMLINK):
                    raise ExportError(
                        f"{self.path} is a symbolic link: ckpt-tui never writes through one; remove "
                        "it (someone else may have planted it) or choose another --out"
                    ) from None
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise ExportError(f"{self.path} is not a regular file: remove it or choose another --out")
            if not flock_exclusive(fd):
                os.close(fd)
                raise ExportError(f"another ckpt-tui is exporting into {self.out}; wait for it or choose another --out")
            try:
                now = os.lstat(self.path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                self.fd = fd
                return
            os.close(fd)  # the holder let go and removed it between our open and our flock: again
        raise ExportError(f"cannot take the lock {self.path}: it keeps changing")

    def new_temp(self) -> Path:
        """Sweep what killed runs into OUT left beside it (we hold the lock, so none of it is a live
        run's: temp folders, the staging folders of a "both" export and their own temp and lock files,
        an old OUT being replaced) and create our temp folder."""
        sweep_beside(self.out)
        tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        return tmp

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            st, now = os.fstat(self.fd), os.lstat(self.path)
            if (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


# what an export into OUT leaves beside it when killed: its temp folder, the staging folders of the TUI's
# "both" (each an export of its own: with their lock and temp), the old OUT an --overwrite was replacing
LEFTOVER_PATTERNS = (".{}.tmp-*", ".{}.model-*", ".{}.optimizer-*", "..{}.model-*", "..{}.optimizer-*", ".{}.old-*")


def leftovers(out: Path) -> list[Path]:
    """What killed exports into ``out`` left beside it (see LEFTOVER_PATTERNS), real entries only."""
    import glob

    found = []
    for pat in LEFTOVER_PATTERNS:
        found += [
            Path(p) for p in glob.glob(os.path.join(glob.escape(str(out.parent)), pat.format(glob.escape(out.name))))
        ]
    return sorted(set(found))


def sweep_beside(out: Path) -> None:
    """Remove :func:`leftovers` of ``out`` (the caller holds OUT's lock): folders by rmtree (which never
    follows a link), a stale lock file or anything else by unlink."""
    for old in leftovers(out):
        try:
            if old.name.endswith(".ckpt-tui.lock"):  # a staging folder's lock: removed once nobody holds it
                fd = os.open(old, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(old)
                except BlockingIOError:
                    pass
                finally:
                    os.close(fd)
            elif old.name.startswith(f".{out.name}.old-") and not os.path.lexists(out):
                os.replace(old, out)  # killed between the two renames of an --overwrite: the old OUT comes back
            elif os.path.isdir(old) and not os.path.islink(old):
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.unlink(old)
        except OSError:
            pass


def write_side_files(plan: ExportPlan, tmp: Path, cancel=None) -> None:
    """The index, the extra files (config) and the copied files of ``plan``, fsynced, into ``tmp``."""
    if plan.index:
        write_synced(tmp / plan.index_name, index_text(plan))
    for name, text in plan.extra_files:
        write_synced(tmp / name, text)
    for src, name in plan.copies:
        check_cancel(cancel)
        if is_url(src):
            write_synced(tmp / name, as_path(src).read_bytes())
        else:
            copy_new(os.path.realpath(src), tmp / name)  # checked by the plan: a regular file of the checkpoint


def check_unchanged(before, watched: list[Path]) -> None:
    moved = changed(before, snapshot(watched))
    if moved:  # a live job is writing the checkpoint: what we copied may be half old, half new
        raise ExportError(
            f"the source changed during the export ({', '.join(Path(c).name for c in moved[:3])}"
            f"{' …' if len(moved) > 3 else ''}): nothing was written; export again once the "
            "checkpoint is complete"
        )


def install(tmp: Path, out: Path, overwrite: bool) -> None:
    """fsync ``tmp`` and rename it to ``out`` (the one atomic step; an old ``out`` goes only with --overwrite)."""
    fsync_dir(tmp)
    if out.exists():
        if not overwrite and any(out.iterdir()):
            raise ExportError(f"{out} appeared and is not empty; nothing was replaced")
        trash = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out)
    fsync_dir(out.parent)


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


def execute(
    plan: ExportPlan,
    *,
    jobs: int = 1,
    overwrite: bool = False,
    verify: bool = True,
    on_progress: Optional[OnProgress] = None,
    cancel=None,
) -> ExportResult:
    t0 = time.monotonic()
    preflight(plan, overwrite)
    watched = source_files(plan)
    before = snapshot(watched)
    out = plan.out
    lock = OutputLock(out)
    try:
        lock.acquire()
        tmp = lock.new_temp()
        try:
            counter = ByteCounter(plan.tensor_bytes, on_progress, "writing")
            if jobs > 1 and len(plan.files) > 1:
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    futs = [pool.submit(write_file, f, tmp / f.name, counter, cancel) for f in plan.files]
                    for fu in futs:
                        fu.result()
            else:
                for f in plan.files:
                    write_file(f, tmp / f.name, counter, cancel)
            counter.add(0, force=True)
            write_side_files(plan, tmp, cancel)
            result = ExportResult(
                out,
                [f.name for f in plan.files],
                plan.tensor_bytes,
                sum(len(f.tensors) for f in plan.files),
                plan.params,
                0.0,
            )
            check_unchanged(before, watched)
            if verify:
                result.mismatches = verify_files(plan, tmp, on_progress, cancel)
                result.verified = not result.mismatches
                if result.mismatches:
                    raise ExportError("verification failed: " + ", ".join(result.mismatches[:5]))
            install(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError as e:
        raise_no_space(e, plan)
        raise
    finally:
        lock.release()
    result.seconds = time.monotonic() - t0
    result.notes = list(plan.to_plan().notes)
    result.stripped_prefix = plan.prefix.strip if plan.prefix is not None else None
    result.load_code = load_snippet(plan)
    return result


def _opened(path: str, fds: Optional[dict]) -> tuple[int, bool]:
    """(a read fd for ``path``, whether the caller closes it): one kept in ``fds`` per file (its owner closes them
    all), or a new one where ``fds`` is None."""
    if fds is None:
        return os.open(path, os.O_RDONLY), True
    fd = fds.get(path)
    if fd is None:
        fd = fds[path] = os.open(path, os.O_RDONLY)
    return fd, False


def _source_chunks(t: OutTensor, cancel=None, fds: Optional[dict] = None):
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
                    raw = bytearray(os.pread(f.fileno(), n, pos))
                    pos += n
                    left -= n
                    yield torch.frombuffer(raw, dtype=sdt).to(dt).view(torch.uint8).numpy().tobytes()
        return
    tensor = s.load().to(dt).contiguous()
    data = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else b""
    for i in range(0, len(data), BUF):
        yield bytes(data[i : i + BUF])


def verify_files(
    plan: ExportPlan, folder: Path, on_progress=None, cancel=None, files: Optional[list[OutFile]] = None
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


def _verify_files(files: list, folder: Path, counter, cancel, fds: dict, bad: list) -> None:
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
