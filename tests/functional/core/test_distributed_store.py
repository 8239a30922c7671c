"""The split export's store without torch (core/export/tcpstore.py): the pure-Python client against torch's
own TCPStore server (both backends, libuv and the classic one), the pure-Python server against torch's own
client, keys laid out exactly as torch's PrefixStore lays them out, every failure (a store gone, a store
gone silent, a listener that is no store) bounded by the timeout — and a rank that torchrun starts never
importing torch, checked on the rank's own ``-X importtime`` log, with ``CKPT_TUI_DIST_STORE=torch`` as the
control that the same check does see torch when a rank imports it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from ckpt_tui.core.export.distributed import STORE_ENV, LaunchEnv, StoreGroup, connect_from_env
from ckpt_tui.core.export.tcpstore import HandshakeError, PrefixStore, StoreError, TCPStoreClient, TCPStoreServer
from ckpt_tui.core.export.write import ExportError
from tests.fixtures import fixture_path
from tests.functional.core.test_distributed_export import check_result, env, export_args, free_port, single, torchrun

PREFIX = "ckpt_tui/export/run/0/"  # what connect_from_env uses: a trailing "/", so keys hold "//"


def torch_master(use_libuv: bool, timeout: float = 10.0) -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=use_libuv, timeout=timedelta(seconds=timeout)
    )


def torch_client(port: int, timeout: float = 10.0, use_libuv: bool = True) -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        wait_for_workers=False,
        use_libuv=use_libuv,
        timeout=timedelta(seconds=timeout),
    )


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "classic"])
def test_client_against_torch_server(use_libuv):
    master = torch_master(use_libuv)
    ours = PrefixStore(PREFIX, TCPStoreClient("127.0.0.1", master.port, timeout=2.0))
    theirs = dist.PrefixStore(PREFIX, master)

    ours.set("hb/1", "1 500")  # ours writes, torch reads: the same key, the same bytes
    assert theirs.get("hb/1") == b"1 500" and theirs.check(["hb/1"])
    assert master.get(f"{PREFIX}/hb/1") == b"1 500"  # torch's PrefixStore layout: prefix + "/" + key
    theirs.set("start", '{"tmp": "/x"}')  # torch writes, ours reads (get waits: a set has no reply)
    assert ours.get("start") == b'{"tmp": "/x"}'
    assert ours.check(["start"]) and ours.check(["start", "hb/1"])
    assert not ours.check(["final"]) and not ours.check(["start", "final"])
    ours.set("bin", b"\x00\xff" * 1000)  # bytes, and more than one TCP segment
    assert theirs.get("bin") == b"\x00\xff" * 1000

    # compare_set: the first claim wins, later ones get the winner; torch's answer for a missing key too
    assert ours.compare_set("decision", "", "commit") == b"commit"
    assert ours.compare_set("decision", "", "abort") == b"commit"
    assert theirs.compare_set("decision", "", "abort") == b"commit"
    assert ours.compare_set("decision", "commit", "done") == b"done" and theirs.get("decision") == b"done"
    assert ours.compare_set("absent", "x", "y") == b"x" and not theirs.check(["absent"])
    assert theirs.compare_set("abort", "", "rank 1: boom") == b"rank 1: boom"
    assert ours.compare_set("abort", "", "rank 0: later") == b"rank 1: boom"

    # a key never set: get times out (bounded), and the connection stays usable, as torch's does
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="timed out after 2 s waiting"):
        ours.get("never")
    assert 1.5 < time.monotonic() - t0 < 5
    assert ours.check(["start"]) and ours.get("hb/1") == b"1 500"


def test_server_against_torch_client():
    with TCPStoreServer(0) as server:
        for use_libuv in (True, False):  # torch's client is the same for both; the flag must not matter
            theirs = dist.PrefixStore(PREFIX, torch_client(server.port, 2.0, use_libuv))
            ours = PrefixStore(PREFIX, TCPStoreClient("127.0.0.1", server.port, timeout=2.0))
            theirs.set(f"k{use_libuv}", "v")
            assert theirs.get(f"k{use_libuv}") == b"v" and ours.get(f"k{use_libuv}") == b"v"
            assert theirs.check([f"k{use_libuv}"]) and not theirs.check(["nope"])
            ours.set(f"o{use_libuv}", "w")
            assert theirs.get(f"o{use_libuv}") == b"w"
            assert theirs.compare_set(f"c{use_libuv}", "", "1") == b"1"
            assert ours.compare_set(f"c{use_libuv}", "", "2") == b"1"
            assert theirs.compare_set(f"c{use_libuv}", "1", "3") == b"3"
            assert theirs.compare_set(f"m{use_libuv}", "x", "y") == b"x" and not ours.check([f"m{use_libuv}"])
            assert theirs.add(f"n{use_libuv}", 3) == 3 and theirs.add(f"n{use_libuv}", 4) == 7
            with pytest.raises(RuntimeError):  # torch's own wait timeout (then its CANCEL_WAIT) is served
                theirs.get("never")
            theirs.set("late", "ok")
            assert theirs.get("late") == b"ok"  # … and the connection is still in step after it

            # a WAIT that a later SET (from another client) releases
            got = []
            waiter = threading.Thread(target=lambda: got.append(theirs.get(f"later{use_libuv}")))
            waiter.start()
            time.sleep(0.3)
            ours.set(f"later{use_libuv}", "now")
            waiter.join(timeout=5)
            assert got == [b"now"]
        assert f"/{PREFIX}/kTrue".encode() in server.data  # torch's client puts "/" before every key


def test_server_with_many_clients_and_threads():
    with TCPStoreServer(0) as server:
        clients = [TCPStoreClient("127.0.0.1", server.port, timeout=5.0) for _ in range(8)]
        wins, errors = [], []

        def work(i: int) -> None:
            try:
                c = clients[i % len(clients)]
                for j in range(50):
                    c.set(f"hb/{i}", f"{j} {j * 100}")
                    assert c.check([f"hb/{i}"])
                    assert c.get(f"hb/{i}") == f"{j} {j * 100}".encode()
                wins.append(c.compare_set("decision", "", f"rank {i}"))
            except Exception as e:  # noqa: BLE001 — reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        assert len(set(wins)) == 1 and len(wins) == 16  # exactly one claim won, everyone saw it


HOST_STORE = r"""
import sys, time
from datetime import timedelta
if sys.argv[1] == "torch":
    import torch.distributed as dist
    s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    port = s.port
else:
    from ckpt_tui.core.export.tcpstore import TCPStoreServer
    s = TCPStoreServer(0)
    port = s.port
print(port, flush=True)
time.sleep(600)
"""


def _wait_stopped(pid: int, timeout: float = 30.0) -> None:
    """Until every thread of process ``pid`` is stopped (``T`` in /proc/<pid>/task/*/stat): a server thread
    still running would answer the next request (a loaded machine delivers SIGSTOP late)."""
    t0 = time.monotonic()
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(s in ("T", "t") for s in states):
            return
        assert time.monotonic() - t0 < timeout, f"process {pid} not stopped: thread states {states}"
        time.sleep(0.01)


@pytest.mark.parametrize("host", ["torch", "python"])
@pytest.mark.parametrize("how", ["kill-9", "SIGSTOP"])
def test_a_store_that_vanishes_or_goes_silent_raises_within_the_timeout(host, how):
    """kill -9 of the store's process: the next request fails at once; a store that stops answering
    (SIGSTOP: the connection stays open) fails within the client's timeout. Never a hang."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOST_STORE, host], stdout=subprocess.PIPE, text=True, env=env(), start_new_session=True
    )
    try:
        port = int(p.stdout.readline())
        c = TCPStoreClient("127.0.0.1", port, timeout=2.0)
        c.set("a", "1")
        assert c.check(["a"]) and c.get("a") == b"1"
        os.kill(p.pid, signal.SIGKILL if how == "kill-9" else signal.SIGSTOP)
        if how == "kill-9":
            p.wait(timeout=10)
        else:  # a signal is delivered when the kernel next runs it: wait for the stopped state, not a time
            _wait_stopped(p.pid)
        t0 = time.monotonic()
        with pytest.raises(StoreError) as e:
            for _ in range(3):  # a set may still land in the kernel's buffer; the next reply cannot come
                c.set("a", "2")
                c.check(["a"])
        took = time.monotonic() - t0
        assert took < (1.0 if how == "kill-9" else 3.5), (took, e.value)
        assert (
            ("closed" in str(e.value) or "reset" in str(e.value))
            if how == "kill-9"
            else "no answer from the store within 2 s" in str(e.value)
        )
        with pytest.raises(StoreError):  # and it stays failed, at once
            c.get("a")
        group = StoreGroup(c, 1, 2)  # what the export sees: its own message, as with torch's client
        with pytest.raises(ExportError, match=r"^lost contact with the job's store \("):
            group.poll("a")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_a_listener_that_is_no_store_fails_the_handshake_and_falls_back_to_torch(monkeypatch):
    """A socket that accepts but never answers the PING: the handshake fails within the timeout
    (HandshakeError), connect_from_env says so on stderr and tries torch's client once — which waits
    without end for that PING (torch's own behaviour), so it is given timeout + 10 s: the rank stops with
    the usual message, bounded."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(HandshakeError):
            TCPStoreClient("127.0.0.1", port, timeout=1.0)
        notes: list[str] = []
        launch = LaunchEnv(1, 2, "127.0.0.1", port, True, "run/0")
        monkeypatch.delenv(STORE_ENV, raising=False)
        t0 = time.monotonic()
        with pytest.raises(ExportError, match=rf"^rank 1: cannot reach the job's store at 127.0.0.1:{port}: "):
            connect_from_env(launch, timeout=1.0, note=notes.append)
        assert time.monotonic() - t0 < 20
        assert len(notes) == 1 and "using torch's client instead" in notes[0], notes


def eventually(group: StoreGroup, key: str, within: float = 10.0):
    deadline = time.monotonic() + within
    while (v := group.poll(key)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return v


def test_connect_from_env_picks_the_store(monkeypatch):
    """Rank 0 without an agent hosts tcpstore.py's server on MASTER_PORT and rank 1 reaches it; with
    CKPT_TUI_DIST_STORE=torch both use torch's TCPStore; another value is refused; nobody listening is the
    same ExportError as before."""
    monkeypatch.delenv(STORE_ENV, raising=False)
    port = free_port()
    g0 = connect_from_env(LaunchEnv(0, 2, "127.0.0.1", port, False, "t/0"), timeout=5.0)
    g1 = connect_from_env(LaunchEnv(1, 2, "127.0.0.1", port, False, "t/0"), timeout=5.0)
    assert isinstance(g0.server, TCPStoreServer) and g0.hosts_store and g1.server is None
    assert isinstance(g1.store, PrefixStore) and isinstance(g1.store.store, TCPStoreClient)
    g0.publish("start", "x")  # a set has no reply: another connection sees it a moment later
    assert eventually(g1, "start") == "x" and g1.poll("final") is None and g1.claim("decision", "abort") == "abort"
    assert g0.claim("decision", "commit") == "abort"
    assert b"/ckpt_tui/export/t/0//start" in g0.server.data
    g0.server.close()
    with pytest.raises(ExportError, match=r"^lost contact with the job's store"):
        g1.poll("start")

    monkeypatch.setenv(STORE_ENV, "torch")
    port = free_port()
    t0 = connect_from_env(LaunchEnv(0, 2, "127.0.0.1", port, False, "t/0"), timeout=5.0)
    t1 = connect_from_env(LaunchEnv(1, 2, "127.0.0.1", port, False, "t/0"), timeout=5.0)
    assert isinstance(t1.store, dist.PrefixStore) and t0.server is None
    t0.publish("start", "y")
    assert eventually(t1, "start") == "y"

    monkeypatch.setenv(STORE_ENV, "grpc")
    with pytest.raises(ExportError, match="CKPT_TUI_DIST_STORE must be"):
        connect_from_env(LaunchEnv(1, 2, "127.0.0.1", port, False, "t/0"), timeout=1.0)

    monkeypatch.delenv(STORE_ENV)
    port = free_port()  # nobody listens: refused until the timeout
    with pytest.raises(ExportError, match=rf"^rank 1: cannot reach the job's store at 127.0.0.1:{port}: no store"):
        connect_from_env(LaunchEnv(1, 2, "127.0.0.1", port, True, "t/0"), timeout=1.0)


TORCH_IMPORT = re.compile(r"^import time:.*\|\s*torch(\.\S+)?\s*$", re.M)
OWN_IMPORT = re.compile(r"^import time:.*\|\s*ckpt_tui\.core\.export\.tcpstore\s*$", re.M)


def rank_logs(log_dir: Path) -> list[str]:
    logs = sorted(log_dir.rglob("stderr.log"))
    assert len(logs) == 2, logs
    return [p.read_text() for p in logs]


@pytest.mark.parametrize("store", ["python", "torch"])
def test_ranks_under_torchrun_do_not_import_torch(tmp_path, store):
    """Each rank's own ``-X importtime`` log (PYTHONPROFILEIMPORTTIME; torchrun --redirects 2 sends each
    rank's stderr to its own file, apart from the launcher's, which does import torch) must show the
    export's modules and no torch. The control, CKPT_TUI_DIST_STORE=torch, shows that the same check does
    find torch when a rank imports it — so the first case cannot pass for want of a log."""
    src = fixture_path("fsdp2-dcp")
    want = single(src, tmp_path / "single")
    out, logs = tmp_path / "dist", tmp_path / "logs"
    r = subprocess.run(
        torchrun(
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            "--log-dir",
            str(logs),
            "--redirects",
            "2",
            *export_args(src, out),
        ),
        env=env(PYTHONPROFILEIMPORTTIME="1", **{STORE_ENV: store}),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    check_result(r.stdout, src, out, want)
    for log in rank_logs(logs):
        assert OWN_IMPORT.search(log), log[-2000:]  # the rank's log, with the store module imported
        torch_lines = TORCH_IMPORT.findall(log)
        assert bool(torch_lines) == (store == "torch"), TORCH_IMPORT.search(log)
