"""Faults while exporting: kill -9, disk full, Ctrl-C, two exports into one folder, the source
changing under us. The source is byte-identical afterwards and nothing half-written carries the
final name."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.util import FileLease, freeze


def digest(p: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A real torch.save checkpoint of ~320 MB (exported in 40 MB shards), and a tokenizer file."""
    d = tmp_path_factory.mktemp("big") / "ckpt"
    d.mkdir()
    torch.save({f"layer{i}.weight": torch.full((1024, 1024 * 8), float(i)) for i in range(10)}, d / "model.pt")
    (d / "tokenizer.model").write_bytes(b"tokenizer")
    return d


@pytest.fixture
def small(tmp_path):
    """A real torch.save checkpoint of 1 MB and a tokenizer file: a private copy, changed by a test."""
    d = tmp_path / "small"
    d.mkdir()
    torch.save({"w": torch.arange(256 * 1024, dtype=torch.float32).reshape(256, 1024)}, d / "model.pt")
    (d / "tokenizer.model").write_bytes(b"tokenizer")
    return d


def _sigint_as_in_a_terminal() -> None:
    # A command started in the background by a non-interactive shell (`pytest &`, a CI runner) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler: a Ctrl-C test would see the
    # export finish. ckpt-tui in a terminal has SIGINT at its default; so does the process under test.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_in_a_terminal,
        **kw,
    )


@contextmanager
def export_frozen_mid_way(src: Path, out: Path, *args, stop: bool = True):
    """`ckpt-tui export SRC --out OUT`, frozen mid-export, whatever the machine's load.

    The export copies SRC/tokenizer.model after it wrote and fsynced every tensor, and before it
    verifies and renames the temp folder to OUT. The test holds a lease on that file, so the copy
    waits for it; once it waits, the process is stopped (SIGSTOP) and nothing moves until SIGCONT.
    Yields (process, lease, temp folder); whatever is left running at the end is killed.

    ``stop=False`` leaves it waiting in that open() without SIGSTOP, for a signal meant for the
    thread that waits: a signal sent to a stopped process is taken by whichever of its threads runs
    first after SIGCONT (rich's refresh thread, say), and the waiting open() would go on waiting."""
    lease = FileLease(src / "tokenizer.model")
    p = start("export", src, "--out", out, *args)
    try:
        lease.wait_blocked(proc=p)
        if stop:
            freeze(p)
        tmps = list(out.parent.glob(f".{out.name}.tmp-*"))
        assert len(tmps) == 1 and not out.exists(), (tmps, out.exists())
        assert list(tmps[0].glob("*.safetensors")) and not (tmps[0] / "tokenizer.model").exists()
        yield p, lease, tmps[0]
    finally:
        lease.release()
        if p.poll() is None:
            p.kill()
            p.wait()


KILLER = """
import sys
from ckpt_tui.core.export.api import export

def on_progress(p):  # say where we are, then wait for the test: a kill lands exactly here
    print("EVENT", p.label, p.done, p.total, flush=True)
    if sys.stdin.readline() != "go\\n":
        raise SystemExit("no go-ahead from the test")

export(sys.argv[1], sys.argv[2], max_shard_size="40MB", on_progress=on_progress)
print("DONE", flush=True)
"""

# (step, fraction of its bytes): killed at the first progress event of that step at or past the
# fraction. Each step reports its first and its last chunk, so every point is reached: the first
# chunk written, mid-write, all written (before the index), the first chunk verified, mid-verify,
# all verified (just before the final rename).
KILL_POINTS = [
    ("writing", 0.0),
    ("writing", 0.5),
    ("writing", 1.0),
    ("verifying", 0.0),
    ("verifying", 0.5),
    ("verifying", 1.0),
]


def test_kill_minus_9_at_every_step(big, tmp_path):
    """Killed while writing, while verifying, just before the final rename: never a partial OUT,
    the source byte-identical, the temp folder left for the next run to clean up."""
    before = digest(big)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    for label, frac in KILL_POINTS:
        out = tmp_path / f"out-{label}-{frac}"
        proc = subprocess.Popen(
            [sys.executable, str(script), str(big), str(out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        killed_at = None
        try:
            for line in proc.stdout:
                if not line.startswith("EVENT "):
                    continue
                _, step, done, total = line.split()
                if step == label and int(done) >= frac * int(total):
                    proc.send_signal(signal.SIGKILL)  # it waits in on_progress: nothing moved since the event
                    killed_at = (step, int(done), int(total))
                    break
                proc.stdin.write("go\n")
                proc.stdin.flush()
        finally:
            proc.kill()
            proc.wait()
        assert killed_at is not None, f"the export never reported {label} at {frac:.0%}"
        assert not out.exists(), killed_at  # nothing half-written under the final name
        assert len(list(tmp_path.glob(f".{out.name}.tmp-*"))) == 1, killed_at  # it was killed mid-export
        assert digest(big) == before


@pytest.mark.parametrize("signum,code", [(signal.SIGKILL, -9), (signal.SIGINT, 130)])
def test_kill_or_interrupt_mid_export(big, tmp_path, signum, code):
    before = digest(big)
    out = tmp_path / "out"
    # SIGINT goes to a running process (its main thread waits in the copy's open() and takes it);
    # SIGKILL needs no thread, so that process is stopped first
    with export_frozen_mid_way(big, out, "--max-shard-size", "40MB", stop=signum == signal.SIGKILL) as (p, _, tmp):
        p.send_signal(signum)
        os.kill(p.pid, signal.SIGCONT)
        p.wait(timeout=60)
    assert p.returncode == code
    assert not out.exists()
    assert digest(big) == before
    if signum == signal.SIGINT:
        assert "interrupted" in p.stderr.read() and not list(tmp_path.glob(".out.tmp-*"))
    else:
        assert tmp.is_dir()  # a kill -9 cannot clean up: the next run does
    # the next run cleans up what a killed one left, and succeeds
    r = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "export", str(big), "--out", str(out), "--no-verify"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob(".out.tmp-*")) and (out / "model.safetensors").is_file()


def test_second_export_into_the_same_folder_refuses(small, tmp_path):
    out = tmp_path / "out"
    with export_frozen_mid_way(small, out) as (p, lease, tmp):
        r = subprocess.run(
            [sys.executable, "-m", "ckpt_tui", "export", str(small), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 1 and "another ckpt-tui is writing" in r.stderr
        assert tmp.is_dir()  # the refused export touched nothing of the running one
        lease.release()
        os.kill(p.pid, signal.SIGCONT)
        p.wait(timeout=300)
    assert p.returncode == 0, p.stderr.read()
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.model").read_bytes() == b"tokenizer"


def test_source_changing_during_export_is_detected(small, tmp_path):
    out = tmp_path / "out"
    with export_frozen_mid_way(small, out) as (p, lease, tmp):
        with open(small / "model.pt", "r+b") as f:  # a live job rewriting the checkpoint's weights
            f.seek(f.seek(0, os.SEEK_END) // 2)
            f.write(b"\x00" * 16)
        lease.release()
        os.kill(p.pid, signal.SIGCONT)
        p.wait(timeout=300)
    assert p.returncode == 1 and "source changed during the export" in p.stderr.read()
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a private tmpfs")
def test_disk_full_on_a_real_small_filesystem(real_ckpt, tmp_path):
    src = real_ckpt("hf-fsdp1") / "checkpoint-2"
    before = digest(src)
    script = (
        f"mount -t tmpfs -o size=256k tmpfs {tmp_path} && mkdir {tmp_path}/mnt && "
        f"{sys.executable} -m ckpt_tui export {src} --out {tmp_path}/mnt/out; echo rc=$?; ls -a {tmp_path}/mnt"
    )
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount" in r.stderr and "rc=" not in r.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert "rc=1" in r.stdout, r.stdout + r.stderr
    assert "no space left" in r.stderr and "needs" in r.stderr and "free" in r.stderr
    assert r.stdout.split("rc=1")[1].split() == [".", ".."]  # nothing left behind
    assert digest(src) == before
