"""Faults while exporting: kill -9, disk full, Ctrl-C, two exports into one folder, the source
changing under us. The source is byte-identical afterwards and nothing half-written carries the
final name."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.util import sparse_safetensors


def digest(p: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A real torch.save checkpoint of ~320 MB: big enough to interrupt an export midway."""
    d = tmp_path_factory.mktemp("big") / "ckpt"
    d.mkdir()
    torch.save({f"layer{i}.weight": torch.full((1024, 1024 * 8), float(i)) for i in range(10)}, d / "model.pt")
    return d


@pytest.fixture
def slow(tmp_path):
    """1 GiB of zeros in a hole; exported with --dtype bf16 it takes seconds: a race is certain."""
    d = tmp_path / "slow"
    d.mkdir()
    sparse_safetensors(d / "model.safetensors", 1)
    return d


def start(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "ckpt_tui", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def wait_tmp(parent: Path, name: str, proc, timeout=60) -> Path:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        tmps = list(parent.glob(f".{name}.tmp-*"))
        if tmps and any(tmps[0].iterdir()):
            return tmps[0]
        if proc.poll() is not None:
            raise AssertionError(f"export ended before it could be interrupted: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError("no temp folder appeared")


KILLER = """
import sys, time
from ckpt_tui.core.export.api import export

def on_progress(p):
    print("EVENT", p.label, p.done, flush=True)
    time.sleep(0.05)

export(sys.argv[1], sys.argv[2], max_shard_size="40MB", on_progress=on_progress)
print("DONE", flush=True)
"""


def test_kill_minus_9_after_n_progress_events(big, tmp_path):
    """Killed while writing, while verifying, around the final rename: never a partial OUT, the
    source byte-identical, and the next run cleans up."""
    before = digest(big)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    points = 0
    for n in (1, 4, 9, 16, 30, 60):
        out = tmp_path / f"out{n}"
        proc = subprocess.Popen([sys.executable, str(script), str(big), str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        events, killed = 0, False
        for line in proc.stdout:
            if line.startswith("EVENT"):
                events += 1
                if events >= n:
                    proc.send_signal(signal.SIGKILL)
                    killed = True
                    break
        proc.wait()
        if killed:
            assert not out.exists()  # nothing half-written under the final name
        else:  # it finished before the n-th event: complete, with its index
            assert (out / "model.safetensors.index.json").is_file()
        assert digest(big) == before
        points += killed
    assert points >= 4


@pytest.mark.parametrize("signum,code", [(signal.SIGKILL, -9), (signal.SIGINT, 130)])
def test_kill_or_interrupt_mid_export(big, tmp_path, signum, code):
    before = digest(big)
    p = start("export", big, "--out", tmp_path / "out", "--max-shard-size", "40MB")
    wait_tmp(tmp_path, "out", p)
    p.send_signal(signum)
    p.wait(timeout=60)
    assert p.returncode == code
    assert not (tmp_path / "out").exists()
    assert digest(big) == before
    if signum == signal.SIGINT:
        assert "interrupted" in p.stderr.read() and not list(tmp_path.glob(".out.tmp-*"))
    # the next run cleans up what a killed one left, and succeeds
    r = subprocess.run([sys.executable, "-m", "ckpt_tui", "export", str(big), "--out", str(tmp_path / "out"),
                        "--no-verify"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob(".out.tmp-*")) and (tmp_path / "out" / "model.safetensors").is_file()


def test_second_export_into_the_same_folder_refuses(slow, tmp_path):
    p = start("export", slow, "--out", tmp_path / "out", "--dtype", "bf16")
    try:
        wait_tmp(tmp_path, "out", p)
        r = subprocess.run([sys.executable, "-m", "ckpt_tui", "export", str(slow), "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=120)
        assert p.poll() is None, "the first export finished before the race"
        assert r.returncode == 1 and "another ckpt-tui is exporting" in r.stderr
    finally:
        p.wait(timeout=300)
    assert p.returncode == 0, p.stderr.read()


def test_source_changing_during_export_is_detected(slow, tmp_path):
    src = slow
    p = start("export", src, "--out", tmp_path / "out", "--dtype", "bf16")
    wait_tmp(tmp_path, "out", p)
    with open(src / "model.safetensors", "r+b") as f:  # a live job rewriting the checkpoint
        f.seek(-16, os.SEEK_END)
        f.write(b"\x00" * 16)
    assert p.poll() is None, "the export finished before the source changed"
    p.wait(timeout=300)
    assert p.returncode == 1 and "source changed during the export" in p.stderr.read()
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a private tmpfs")
def test_disk_full_on_a_real_small_filesystem(real_ckpt, tmp_path):
    src = real_ckpt("hf-fsdp1") / "checkpoint-2"
    before = digest(src)
    script = (f"mount -t tmpfs -o size=256k tmpfs {tmp_path} && mkdir {tmp_path}/mnt && "
              f"{sys.executable} -m ckpt_tui export {src} --out {tmp_path}/mnt/out; echo rc=$?; ls -a {tmp_path}/mnt")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount" in r.stderr and "rc=" not in r.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert "rc=1" in r.stdout, r.stdout + r.stderr
    assert "no space left" in r.stderr and "needs" in r.stderr and "free" in r.stderr
    assert r.stdout.split("rc=1")[1].split() == [".", ".."]  # nothing left behind
    assert digest(src) == before
