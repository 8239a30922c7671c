"""One export split over the processes of a launcher (``torchrun``, ``srun`` … that set ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): each rank writes and verifies a share of the
output files into one temp folder on a filesystem they all see; rank 0 alone locks OUT, names the
temp folder, writes the index and side files and makes the one atomic rename — after every rank
said its share is written and verified.

No rank may wait forever for a dead peer, so the ranks talk through the launcher's TCP key-value
store (the one ``init_process_group`` would use), never through blocking collectives: gloo's
collectives cannot be interrupted, and some wait past their timeout when a peer dies. Every wait
here is a poll with a deadline:

- each rank publishes a heartbeat (a counter and its bytes done) every ``interval`` seconds from
  a thread; a peer whose heartbeat has not changed for ``dead_after`` seconds (measured on the
  observer's own clock: the nodes' clocks may differ) is dead, and a store that stops answering
  means the launcher's host is gone;
- any failure, on any rank, sets ``abort`` in the store; every rank's watcher sees it and cancels
  its writer (the same cancel token the single-process export honours);
- whether the job commits or aborts is one atomic ``compare_set`` on ``decision``: rank 0 renames
  only after it won ``commit``; a failing rank removes the temp folder only after ``abort`` won, so
  a survivor never deletes what rank 0 is renaming, and whoever survives a dead rank 0 removes it.

The plan is not shipped between ranks (its sources hold open readers): every rank plans the same
export from the same header-only metadata, and rank 0 broadcasts a fingerprint of its plan and its
ckpt-tui version beside the temp folder's name; a rank whose plan differs stops before writing.
Which rank writes which file follows from the plan alone (:func:`assign`).

The store is torch's TCPStore protocol, spoken by tcpstore.py in pure Python: no rank imports torch
(1.6 s and ~220 MB each). torch is imported only for the fallback to its own client (:func:`_connect_torch`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, TypeVar

from ... import __version__
from ..fsutil import snapshot
from ..progress import Cancelled, OnProgress, Progress
from ..staging import Stage, check_unchanged
from .plan import ExportPlan
from .snippet import load_snippet
from .tcpstore import HandshakeError, PrefixStore, Store, StoreError, TCPStoreClient, TCPStoreServer
from .write import (
    ByteCounter,
    ExportError,
    ExportResult,
    raise_no_space,
    source_files,
    stage_export,
    verify_files,
    write_file,
    write_side_files,
)

DEAD_AFTER = 20.0  # seconds without a peer's heartbeat changing: it is dead (the tests prove < 60 s)
JOIN_TIMEOUT = 300.0  # seconds a peer may take to show its first heartbeat (launcher start, planning)
INTERVAL = 0.5
# test hook (fault injection, tests only: a real kill mid-write needs a window): the rank
# CKPT_TUI_TEST_STALL_RANK (default: any rank that has the variable) stops once it has written
# CKPT_TUI_TEST_STALL_AFTER_BYTES bytes, after writing its pid to CKPT_TUI_TEST_STALL_PIDFILE
STALL_ENV = "CKPT_TUI_TEST_STALL_AFTER_BYTES"

T = TypeVar("T")


class Group(Protocol):
    """What the distributed export needs from its transport: a shared key-value store whose every
    call returns (or raises) within a bounded time."""

    rank: int
    world: int
    hosts_store: bool  # this process serves the store: it must outlive the others' last look

    def publish(self, key: str, value: str) -> None: ...

    def poll(self, key: str) -> Optional[str]: ...  # the value, or None when not set yet; never blocks

    def claim(self, key: str, value: str) -> str: ...  # set key to value unless set; the value it holds


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world: int
    addr: str
    port: int
    agent_store: bool  # torchrun's agent hosts the store; else rank 0 does
    run_id: str


def launch_env(environ: Optional[Mapping[str, str]] = None) -> Optional[LaunchEnv]:
    """The torch.distributed environment a launcher set, or None when this process runs alone
    (no ``WORLD_SIZE`` or ``WORLD_SIZE`` 1: the single-process export, unchanged)."""
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
    except ValueError:
        return None
    if world <= 1:
        return None
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise ExportError(
            f"WORLD_SIZE={world} but {', '.join(missing)} is not set: run under torchrun, or set "
            "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process"
        )
    return LaunchEnv(
        rank,
        world,
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        f"{env.get('TORCHELASTIC_RUN_ID', 'env')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
    )


class StoreGroup:
    """:class:`Group` over a TCPStore client — tcpstore.py's or torch's, with the same API (thread-safe: one
    lock around the client). A store that fails (its host is gone: connection refused or reset, or its
    timeout) raises ExportError."""

    def __init__(self, store: Store, rank: int, world: int, hosts_store: bool = False) -> None:
        self.store, self.rank, self.world, self.hosts_store = store, rank, world, hosts_store
        self.server: Optional[TCPStoreServer] = None  # the store this rank hosts, if it is tcpstore.py's
        self.lock = threading.Lock()

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        with self.lock:
            try:
                return fn(*args)
            except Exception as e:  # StoreError; torch's DistNetworkError, DistStoreError (RuntimeErrors)
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ExportError(f"lost contact with the job's store ({first})") from None

    def publish(self, key: str, value: str) -> None:
        self._call(self.store.set, key, value)

    def poll(self, key: str) -> Optional[str]:
        if not self._call(self.store.check, [key]):
            return None
        return self._call(self.store.get, key).decode()

    def claim(self, key: str, value: str) -> str:
        return self._call(self.store.compare_set, key, "", value).decode()


STORE_ENV = "CKPT_TUI_DIST_STORE"  # "torch": torch's own TCPStore client/server instead of tcpstore.py's


def _note(msg: str) -> None:
    sys.stderr.write(f"ckpt-tui: {msg}\n")
    sys.stderr.flush()


def connect_from_env(env: LaunchEnv, timeout: float = 20.0, note: Callable[[str], None] = _note) -> StoreGroup:
    """Join the launcher's store (torchrun's agent store, or rank 0 hosts it on MASTER_PORT) with the
    pure-Python TCPStore protocol (tcpstore.py: no torch import). ``CKPT_TUI_DIST_STORE=torch`` uses torch's
    TCPStore instead; so does a store that connects but fails the handshake (after a ``note``)."""
    how = os.environ.get(STORE_ENV, "").strip().lower()
    if how not in ("", "python", "torch"):
        raise ExportError(f"{STORE_ENV} must be 'python' or 'torch', not {how!r}")
    if how == "torch":
        return _connect_torch(env, timeout)
    hosts = env.rank == 0 and not env.agent_store
    server = None
    try:
        if hosts:
            server = TCPStoreServer(env.port)
        client = TCPStoreClient(env.addr, env.port, timeout=timeout)
    except HandshakeError as e:
        if server is not None:
            server.close()
        note(
            f"rank {env.rank}: the job's store at {env.addr}:{env.port} did not answer ckpt-tui's TCPStore "
            f"client ({e}); using torch's client instead ({STORE_ENV}=torch skips this)"
        )
        return _connect_torch(env, timeout)
    except (StoreError, OSError) as e:
        if server is not None:
            server.close()
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ExportError(f"rank {env.rank}: cannot reach the job's store at {env.addr}:{env.port}: {why}") from None
    group = StoreGroup(PrefixStore(f"ckpt_tui/export/{env.run_id}/", client), env.rank, env.world, hosts)
    group.server = server  # lives as long as the group: the others' last look at the store needs it
    return group


def _connect_torch(env: LaunchEnv, timeout: float) -> StoreGroup:
    """The same store through torch's TCPStore (torch is imported here only). torch's client waits without
    end for a listener that accepts but never answers its PING, so it connects in a thread, given
    ``timeout`` + 10 s: no rank hangs."""
    got: list[StoreGroup] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            got.append(_torch_group(env, timeout))
        except BaseException as e:  # handed to the caller
            failed.append(e)

    worker = threading.Thread(target=run, name="ckpt-tui-torch-store", daemon=True)
    worker.start()
    worker.join(timeout + 10)
    if worker.is_alive():
        raise ExportError(
            f"rank {env.rank}: cannot reach the job's store at {env.addr}:{env.port}: torch's "
            f"TCPStore client got no answer within {timeout + 10:g} s"
        )
    if failed:
        raise failed[0]
    return got[0]


def _torch_group(env: LaunchEnv, timeout: float) -> StoreGroup:
    from datetime import timedelta

    import torch.distributed as dist

    hosts = env.rank == 0 and not env.agent_store
    try:
        store = dist.TCPStore(
            env.addr, env.port, env.world, is_master=hosts, timeout=timedelta(seconds=timeout), wait_for_workers=False
        )
    except (RuntimeError, OSError) as e:  # DistNetworkError / DistStoreError are RuntimeErrors
        raise ExportError(f"rank {env.rank}: cannot reach the job's store at {env.addr}:{env.port}: {e}") from None
    return StoreGroup(dist.PrefixStore(f"ckpt_tui/export/{env.run_id}/", store), env.rank, env.world, hosts)


def assign(plan: ExportPlan, world: int) -> list[list[int]]:
    """Indices of ``plan.files`` each rank writes: the largest file first to the least loaded rank
    (ties: the lower rank). Deterministic from the plan, so every rank agrees without talking."""
    load = [0] * world
    share: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(plan.files)), key=lambda i: (-plan.files[i].nbytes, i)):
        r = min(range(world), key=lambda r: (load[r], r))
        share[r].append(i)
        load[r] += plan.files[i].nbytes
    return [sorted(s) for s in share]


def fingerprint(plan: ExportPlan) -> str:
    """What every rank must agree on: the output files, their tensors and where they come from."""
    doc: list[object] = [
        [
            f.name,
            [
                [
                    t.name,
                    t.dtype,
                    list(t.shape),
                    t.src.dtype,
                    [[r.path, r.offset, r.length] for r in (t.src.ranges or ())],
                ]
                for t in f.tensors
            ],
        ]
        for f in plan.files
    ]
    doc.append(
        [
            str(plan.out.resolve()),
            plan.index,
            plan.index_name,
            [n for _, n in plan.copies],
            [n for n, _ in plan.extra_files],
            __version__,
        ]
    )
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


class Watch:
    """A thread that publishes this rank's heartbeat and bytes, reads the peers', and sets ``stop``
    (the writer's cancel token) when the job must end: abort by any rank, a dead peer, a store gone,
    or the caller's own cancel. On rank 0 it reports the whole job's bytes to ``on_progress``."""

    def __init__(
        self,
        group: Group,
        *,
        total: int,
        on_progress: Optional[OnProgress] = None,
        cancel: Optional[threading.Event] = None,
        dead_after: float = DEAD_AFTER,
        join_timeout: float = JOIN_TIMEOUT,
        interval: float = INTERVAL,
    ) -> None:
        self.group, self.total, self.on_progress, self.user_cancel = group, total, on_progress, cancel
        self.dead_after, self.join_timeout, self.interval = dead_after, join_timeout, interval
        self.stop = threading.Event()
        self.reason = ""
        self.done = 0  # this rank's bytes written + verified
        self.peer_done: dict[int, int] = {}
        self.dead: set[int] = set()  # peers that stopped answering or never joined
        self._end = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-tui-watch", daemon=True)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end.set()
        self._thread.join(timeout=5)

    def fail(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason
        self.stop.set()

    def _run(self) -> None:
        g = self.group
        start = time.monotonic()
        seen: dict[int, tuple[Optional[str], float]] = {}
        seq = 0
        while not self._end.is_set():
            seq += 1
            now = time.monotonic()
            try:
                g.publish(f"hb/{g.rank}", f"{seq} {self.done}")
                for r in range(g.world):
                    if r == g.rank:
                        continue
                    v = g.poll(f"hb/{r}")
                    last = seen.get(r)
                    if last is None or v != last[0]:
                        seen[r] = (v, now)
                        if v is not None:
                            self.peer_done[r] = int(v.split()[1])
                    v0, t = seen[r]
                    limit = self.join_timeout if v0 is None else self.dead_after
                    if now - (start if v0 is None else t) > limit:
                        self.dead.add(r)
                        self.fail(f"rank {r} {'never joined' if v0 is None else 'stopped answering'} for {limit:.0f} s")
                aborted = g.poll("abort")
                if aborted is not None and not self.stop.is_set():
                    self.fail(aborted)
            except ExportError as e:  # the store's host is gone (connection refused/reset) or timed out
                self.fail(str(e))
            if self.user_cancel is not None and self.user_cancel.is_set():
                self.fail(f"rank {g.rank}: cancelled")
            if self.on_progress is not None:
                self.on_progress(
                    Progress(
                        self.done + sum(self.peer_done.values()),
                        self.total,
                        "bytes",
                        f"writing + verifying ({g.world} ranks)",
                    )
                )
            self._end.wait(self.interval)

    def wait_for(self, key: str) -> str:
        """Poll ``key`` until it is set; raise when the job must end first."""
        while True:
            if self.stop.is_set():
                raise ExportError(self.reason)
            v = self.group.poll(key)
            if v is not None:
                return v
            self.stop.wait(0.1)


def _stall_hook(rank: int, stop: threading.Event) -> Optional[Callable[[int], None]]:
    """Tests only: a callback that stops this rank mid-write (see STALL_ENV), or None."""
    after = os.environ.get(STALL_ENV)
    if after is None or int(os.environ.get("CKPT_TUI_TEST_STALL_RANK", str(rank))) != rank:
        return None
    limit = int(after)

    def hook(done: int) -> None:
        if done >= limit:
            pid_file = os.environ.get("CKPT_TUI_TEST_STALL_PIDFILE")
            if pid_file:
                Path(pid_file).write_text(str(os.getpid()))
            while not stop.wait(0.5):
                pass
            raise Cancelled("cancelled")

    return hook


def _wait_acks(
    group: Group, stop: Optional[threading.Event], timeout: float = 30.0, dead: frozenset[int] = frozenset()
) -> None:
    """Rank 0, at the end: wait (bounded) until every other live rank said it saw the outcome, so that a
    store rank 0 hosts (no torchrun agent) outlives their last look at it."""
    pending = set(range(1, group.world)) - dead
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        try:
            pending = {r for r in pending if group.poll(f"ack/{r}") is None}
        except Exception:
            return
        time.sleep(0.1)


def execute_distributed(
    plan: ExportPlan,
    group: Group,
    *,
    jobs: int = 1,
    overwrite: bool = False,
    verify: bool = True,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
    dead_after: float = DEAD_AFTER,
    join_timeout: float = JOIN_TIMEOUT,
) -> ExportResult:
    """This rank's part of ``plan`` (the same plan on every rank); raises ExportError on every rank
    when any rank fails, and then no OUT and no temp folder remain."""
    t0 = time.monotonic()
    rank, world = group.rank, group.world
    share = [plan.files[i] for i in assign(plan, world)[rank]]
    watched = source_files(plan)
    before = snapshot(watched)
    total = plan.tensor_bytes * (2 if verify else 1)
    staging = ExitStack()  # rank 0's staged output: OUT locked, its staging folder, the install
    stage: Optional[Stage] = None
    tmp: Optional[Path] = None
    with Watch(
        group,
        total=total,
        on_progress=on_progress if rank == 0 else None,
        cancel=cancel,
        dead_after=dead_after,
        join_timeout=join_timeout,
    ) as watch:
        try:
            if rank == 0:
                try:
                    stage = staging.enter_context(stage_export([plan], overwrite=overwrite))
                    tmp = stage.path
                except Exception as e:
                    group.publish("start", json.dumps({"error": str(e)}))
                    raise
                group.publish("start", json.dumps({"tmp": str(tmp), "plan": fingerprint(plan), "version": __version__}))
            else:
                start = json.loads(watch.wait_for("start"))
                if "error" in start:
                    raise ExportError(f"rank 0 could not start: {start['error']}")
                if start["version"] != __version__:
                    raise ExportError(
                        f"rank {rank} runs ckpt-tui {__version__}, rank 0 runs {start['version']}: "
                        "install the same version on every node"
                    )
                if start["plan"] != fingerprint(plan):
                    raise ExportError(
                        f"rank {rank} planned a different export than rank 0 (another source, options "
                        "or OUT path on this node?): every rank must see the same files at the same "
                        "paths"
                    )
                tmp = Path(start["tmp"])
            hook = _stall_hook(rank, watch.stop)
            written = [0]
            lk = threading.Lock()

            def on_local(p: Progress) -> None:
                with lk:
                    watch.done = written[0] + p.done
                if hook is not None:
                    hook(watch.done)

            counter = ByteCounter(sum(f.nbytes for f in share), on_local, "writing")
            if jobs > 1 and len(share) > 1:
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    for fu in [pool.submit(write_file, f, tmp / f.name, counter, watch.stop) for f in share]:
                        fu.result()
            else:
                for f in share:
                    write_file(f, tmp / f.name, counter, watch.stop)
            counter.add(0, force=True)
            written[0] = sum(f.nbytes for f in share)
            if verify:
                bad = verify_files(plan, tmp, on_local, watch.stop, files=share)
                if bad:
                    raise ExportError(f"rank {rank}: verification failed: " + ", ".join(bad[:5]))
            check_unchanged(before, snapshot(watched), "export", ExportError)
            group.publish(f"done/{rank}", json.dumps([f.name for f in share]))
            wrote = {rank: [f.name for f in share]}
            if rank == 0:
                for r in range(1, world):
                    wrote[r] = json.loads(watch.wait_for(f"done/{r}"))
                if on_progress is not None:
                    on_progress(Progress(total, total, "bytes", f"writing + verifying ({world} ranks)"))
                write_side_files(plan, tmp, watch.stop)
                if group.claim("decision", "commit") != "commit":
                    raise ExportError(watch.reason or "another rank failed")
                assert stage is not None
                stage.commit()
                group.publish("final", "ok")
            else:
                watch.wait_for("final")
                group.publish(f"ack/{rank}", "ok")
        except BaseException as e:
            if isinstance(e, Cancelled) and watch.reason:
                err: BaseException = ExportError(watch.reason)
            elif isinstance(e, OSError):
                try:
                    raise_no_space(e, plan)
                    err = e
                except ExportError as x:
                    err = x
            else:
                err = e
            own = not watch.reason  # this rank failed first (not told by a peer or the watcher)
            watch.fail(f"rank {rank}: {err}" if own else watch.reason)
            decision = "abort"
            try:
                group.claim("abort", watch.reason)  # the first reason stays: what every rank reports
                decision = group.claim("decision", "abort")
            except Exception:
                pass  # the store is gone: nobody can commit any more
            if decision != "commit" and tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if rank == 0 and group.hosts_store:
                _wait_acks(group, None, timeout=10.0, dead=frozenset(watch.dead))
            else:
                try:
                    group.publish(f"ack/{rank}", "failed")
                except Exception:
                    pass
            if err is e:
                raise
            raise err from None
        finally:
            staging.close()  # the staging folder removed, OUT's lock let go
        if rank == 0 and group.hosts_store:  # OUT is in place; keep the store up until every rank saw "final"
            _wait_acks(group, watch.stop)
    result = ExportResult(
        plan.out,
        [f.name for f in plan.files],
        plan.tensor_bytes,
        sum(len(f.tensors) for f in plan.files),
        plan.params,
        time.monotonic() - t0,
        verified=True if verify else None,
    )
    result.notes = list(plan.to_plan().notes) + [
        f"written by {world} ranks: "
        + "; ".join(f"rank {r}: {', '.join(n) or 'nothing'}" for r, n in sorted(wrote.items()))
    ]
    result.stripped_prefix = plan.prefix.strip if plan.prefix is not None else None
    result.load_code = load_snippet(plan)
    return result
