"""`torchrun … -m ckpt_tui export`: the export split over ranks (core/export/distributed.py), run by the
real launcher on localhost — one launcher with two processes, and two launchers as two "nodes" meeting
at a c10d rendezvous on 127.0.0.1. The output must be byte-identical to the single-process export of
the same plan, every rank must have written a file, and a rank killed with -9 mid-write must leave no
OUT, no temp folder, and the surviving rank exiting non-zero by its own timeout within 60 s.

The kill needs a window mid-write, so the killed rank stalls through the test-only hook
CKPT_TUI_TEST_STALL_AFTER_BYTES (a fault injection: a real kill mid-write of a small fixture cannot be
timed); the kill itself and everything the survivor does are real.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_tui.core.export.api import plan_export
from ckpt_tui.core.export.distributed import assign
from tests.fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[3]
SHARD = "100KB"  # fsdp2-dcp (265 kB) -> 3 shards: both ranks get at least one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        e.pop(k, None)
    return e | extra


def hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def single(src: Path, out: Path, component: str = "model") -> dict[str, str]:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt_tui",
            "export",
            str(src),
            "--out",
            str(out),
            "--max-shard-size",
            SHARD,
            "--component",
            component,
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return hashes(out)


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def export_args(src: Path, out: Path, component: str = "model") -> list[str]:
    return [
        "-m",
        "ckpt_tui",
        "export",
        str(src),
        "--out",
        str(out),
        "--max-shard-size",
        SHARD,
        "--json",
        "--component",
        component,
    ]


def node(rank: int, port: int, src: Path, out: Path) -> list[str]:
    return torchrun(
        "--nnodes",
        "2",
        "--node_rank",
        str(rank),
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        "ckpt-tui-test",
        "--max_restarts",
        "0",
        *export_args(src, out),
    )


def leftovers(out: Path) -> list[str]:
    return [p.name for p in out.parent.glob(f".{out.name}.tmp-*")]


def check_result(stdout: str, src: Path, out: Path, want: dict[str, str], component: str = "model") -> None:
    assert hashes(out) == want
    res = json.loads(stdout)["result"]
    note = next(n for n in res["notes"] if n.startswith("written by 2 ranks"))
    plan, _ = plan_export(str(src), str(out), max_shard_size=SHARD, component=component)
    shares = assign(plan, 2)
    assert all(shares), shares  # each rank has at least one file …
    for r, idx in enumerate(shares):  # … and says it wrote exactly those
        assert f"rank {r}: {', '.join(plan.files[i].name for i in idx)}" in note, note
    assert not leftovers(out)


@pytest.fixture(scope="module")
def src() -> Path:
    return fixture_path("fsdp2-dcp")


@pytest.mark.parametrize("name,component", [("fsdp2-dcp", "model"), ("ds-zero2-bf16", "optimizer")])
def test_one_launcher_two_processes_match_single_export(tmp_path, name, component):
    src = fixture_path(name)
    want = single(src, tmp_path / "single", component)
    assert len(want) >= 4  # shards + index (+ optimizer_config.json)
    out = tmp_path / "dist"
    r = subprocess.run(
        torchrun(
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            *export_args(src, out, component),
        ),
        env=env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    check_result(r.stdout, src, out, want, component)


def test_two_launchers_as_two_nodes_match_single_export(src, tmp_path):
    want = single(src, tmp_path / "single")
    out, port = tmp_path / "dist", free_port()
    procs = [
        subprocess.Popen(node(i, port, src, out), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in (0, 1)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    check_result("".join(o for o, _ in outs), src, out, want)


def wait_listening(port: int, proc: subprocess.Popen) -> None:
    """Until the first launcher hosts the rendezvous store: then it, not the second, is the store's host."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "the first launcher never listened"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)


@pytest.mark.parametrize("victim", [1, 0], ids=["killed-beside-no-store", "killed-with-the-store-host"])
def test_kill_9_of_one_rank_mid_write_ends_the_other_without_output(src, tmp_path, victim):
    """victim 1: the survivor's launcher hosts the store, so only the survivor's own timeout (no heartbeat
    from the dead rank) can end it; victim 0: the dead rank's launcher hosted the store and exits, so the
    survivor loses contact with the store (or is stopped by its launcher) and cleans up."""
    out, port = tmp_path / "dist", free_port()
    pid_file = tmp_path / "stalled.pid"
    stall = env(CKPT_TUI_TEST_STALL_AFTER_BYTES="1", CKPT_TUI_TEST_STALL_PIDFILE=str(pid_file))
    procs: list[subprocess.Popen] = []
    try:
        for i in (0, 1):
            procs.append(
                subprocess.Popen(
                    node(i, port, src, out),
                    env=stall if i == victim else env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
            if i == 0:
                wait_listening(port, procs[0])
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "no rank reached the stall"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        tmps = leftovers(out)
        assert tmps and any((out.parent / t).iterdir() for t in tmps)  # mid-write: a temp folder with a file
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        killed_at = time.monotonic()
        survivor = procs[1 - victim]
        code = survivor.wait(timeout=60)
        waited = time.monotonic() - killed_at
        procs[victim].wait(timeout=30)
        err = survivor.stderr.read()
        said = [line for line in err.splitlines() if line.startswith("ckpt-tui: ")]
        print(f"\nvictim launcher {victim}: survivor exit {code} after {waited:.1f} s: {said}")
        assert code != 0 and procs[victim].returncode != 0
        assert waited < 60
        assert not out.exists()
        assert not leftovers(out), err
        if victim == 1:  # its own timeout: the dead rank stopped answering
            assert any("stopped answering" in line for line in said), err
        else:  # the store went with rank 0's launcher; under load the heartbeat deadline may say it first
            assert any(w in line for line in said for w in ("lost contact", "interrupted", "stopped answering")), err
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_plain_environment_without_torchrun_rank_0_hosts_the_store(src, tmp_path):
    """What srun (or any launcher) gives when the user sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    per process: no torchrun agent, so rank 0 hosts the store on MASTER_PORT."""
    want = single(src, tmp_path / "single")
    out, port = tmp_path / "dist", free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, *export_args(src, out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        )
        for r in (1, 0)
    ]  # rank 1 first: it waits for rank 0's store
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert outs[0] == ("", "")  # a rank other than 0 prints nothing
    check_result(outs[1][0], src, out, want)


def test_rank_0_refusing_the_output_stops_every_rank(src, tmp_path):
    """A failure that is not a crash (OUT not empty, found by rank 0's preflight) ends every rank at once,
    each saying why, and touches nothing."""
    out, port = tmp_path / "dist", free_port()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    procs = [
        subprocess.Popen(
            [sys.executable, *export_args(src, out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    # rank 1 names rank 0's reason, read from rank 0's start record ("rank 0 could not start: …") or, when
    # its watcher saw rank 0's abort first, from the abort ("rank 0: …"): the same refusal either way
    assert "is not empty" in outs[0][1], outs
    assert "rank 1: rank 0" in outs[1][1] and "is not empty" in outs[1][1], outs
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and not leftovers(out)


def test_launcher_stopping_the_other_local_rank_cleans_up(src, tmp_path):
    """One launcher, two processes: when one dies, torchrun stops the other with SIGTERM; that rank removes
    the temp folder before it exits (SIGTERM is turned into an interruption, not a silent death)."""
    out, pid_file = tmp_path / "dist", tmp_path / "stalled.pid"
    p = subprocess.Popen(
        torchrun("--nnodes", "1", "--nproc_per_node", "2", "--master_port", str(free_port()), *export_args(src, out)),
        env=env(
            CKPT_TUI_TEST_STALL_AFTER_BYTES="1", CKPT_TUI_TEST_STALL_RANK="1", CKPT_TUI_TEST_STALL_PIDFILE=str(pid_file)
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        assert p.returncode != 0
        assert not out.exists() and not leftovers(out), err
        assert any(line.startswith("ckpt-tui: ") for line in err.splitlines()), err
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_rank_0_progress_counts_every_rank(src, tmp_path, monkeypatch):
    """Rank 0's progress is the whole job's bytes: with rank 0 stalled after its first bytes, its reports
    still grow by everything rank 1 writes and verifies. Two ranks in one process, on a real TCPStore."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from ckpt_tui.core.export.distributed import STALL_ENV, StoreGroup, execute_distributed
    from ckpt_tui.core.export.write import ExportError

    port, out = free_port(), tmp_path / "dist"
    stores = [
        dist.TCPStore("127.0.0.1", port, 2, is_master=r == 0, wait_for_workers=False, timeout=timedelta(seconds=20))
        for r in (0, 1)
    ]
    monkeypatch.setenv(STALL_ENV, "1")
    monkeypatch.setenv("CKPT_TUI_TEST_STALL_RANK", "0")
    plans = [plan_export(str(src), str(out), max_shard_size=SHARD)[0] for _ in (0, 1)]
    share1 = sum(plans[1].files[i].nbytes for i in assign(plans[1], 2)[1])
    seen, errors, cancel = [], [], threading.Event()

    def run(r):
        try:
            execute_distributed(
                plans[r],
                StoreGroup(stores[r], r, 2, hosts_store=r == 0),
                on_progress=seen.append if r == 0 else None,
                cancel=cancel if r == 0 else None,
            )
        except ExportError as e:
            errors.append((r, str(e)))

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not any(p.done >= 2 * share1 for p in seen):
        assert time.monotonic() < deadline, seen[-3:]
        time.sleep(0.1)
    assert seen[-1].total == 2 * plans[0].tensor_bytes
    cancel.set()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r for r, _ in errors) == [0, 1], errors
    assert not out.exists() and not leftovers(out)


def test_dry_run_under_a_launcher_prints_the_plan_once(src, tmp_path):
    out = tmp_path / "dist"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckpt_tui",
                "export",
                str(src),
                "--out",
                str(out),
                "--max-shard-size",
                SHARD,
                "--dry-run",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
        )
        for r in (0, 1)
    ]  # port 1: nobody listens; a dry run never joins the store
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "model-00003-of-00003.safetensors" in outs[0][0] and outs[1] == ("", "")
    assert not out.exists()
