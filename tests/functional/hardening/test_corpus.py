"""Bad input made from real files: every case gives a finding or a clear error — never a crash,
a hang or an unbounded allocation (run under RLIMIT_AS and a per-case time limit)."""

import json
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MEMORY_LIMIT_MB = 3072  # torch-free inspector; far above what a header read needs, far below a 2^63 header


def run_corpus(paths, seconds=20.0):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.functional.hardening.corpus_runner",
            str(MEMORY_LIMIT_MB),
            str(seconds),
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]


def cut_points(size):
    pts = {0, 1, 7, 8, 9, 21, 22, 64, 100, size // 3, size // 2, size - 22, size - 1}
    return sorted(p for p in pts if 0 <= p < size)


@pytest.fixture(scope="module")
def corpus(real_ckpt, tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    cases = []

    def case(name, src):
        d = base / name
        shutil.copytree(src, d, symlinks=True)
        cases.append(d)
        return d

    files = {
        "st": (real_ckpt("accelerate-save-state"), "model.safetensors"),
        "zero2": (real_ckpt("ds-zero2-bf16"), "global_step2/mp_rank_00_model_states.pt"),
        "optim": (real_ckpt("ds-zero2-bf16"), "global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        "dcpmeta": (real_ckpt("fsdp1-dcp"), ".metadata"),
        "distcp": (real_ckpt("fsdp1-dcp"), "__0_0.distcp"),
        "index": (real_ckpt("hf-model-sharded"), "model.safetensors.index.json"),
        "args": (real_ckpt("hf-ds-zero2") / "checkpoint-2", "training_args.bin"),
    }
    for key, (src, rel) in files.items():
        data = (src / rel).read_bytes()
        for cut in cut_points(len(data)):  # truncated at many points, including 0 bytes
            if cut and not data[cut:].strip():
                continue  # only a trailing newline removed: still a valid file
            d = case(f"{key}-cut{cut}", src)
            (d / rel).write_bytes(data[:cut])
        for pos in (0, 4, 8, 12, 30, 40, 60, len(data) - 20, len(data) - 10):  # flipped header bytes
            if 0 <= pos < len(data):
                d = case(f"{key}-flip{pos}", src)
                b = bytearray(data)
                b[pos] ^= 0xFF
                (d / rel).write_bytes(bytes(b))
    st_src, st_rel = files["st"]
    data = (st_src / st_rel).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    d = case("st-huge-header", st_src)
    (d / st_rel).write_bytes(struct.pack("<Q", 2**63) + data[8:])
    for label, mutate in (
        (
            "overlap",
            lambda h, k: h[k].__setitem__("data_offsets", [0, h[k]["data_offsets"][1] - h[k]["data_offsets"][0]]),
        ),
        ("out-of-range", lambda h, k: h[k].__setitem__("data_offsets", [10**12, 10**12 + 4])),
        ("negative", lambda h, k: h[k].__setitem__("shape", [-1])),
    ):
        h = json.loads(json.dumps(header))
        keys = [k for k in h if k != "__metadata__"]
        mutate(h, keys[-1])
        raw = json.dumps(h).encode()
        d = case(f"st-{label}", st_src)
        (d / st_rel).write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
    # a zip without its central directory
    z_src, z_rel = files["zero2"]
    zdata = (z_src / z_rel).read_bytes()
    d = case("zip-no-central-dir", z_src)
    (d / z_rel).write_bytes(zdata[: zdata.rfind(b"PK\x01\x02")])
    # .metadata referencing missing files / lengths past EOF
    d = case("dcp-missing-file", real_ckpt("fsdp1-dcp"))
    os.remove(d / "__1_0.distcp")
    d = case("dcp-short-file", real_ckpt("fsdp1-dcp"))
    with open(d / "__1_0.distcp", "r+b") as f:
        f.truncate(100)
    # latest with garbage or a path outside
    for label, content in (("garbage", b"\xff\xfe\x00garbage\n" * 100), ("escape", b"../../etc"), ("empty", b"")):
        d = case(f"latest-{label}", real_ckpt("ds-zero2-bf16"))
        (d / "latest").write_bytes(content)
    # an index pointing outside the folder
    i_src, i_rel = files["index"]
    doc = json.loads((i_src / i_rel).read_text())
    k = sorted(doc["weight_map"])[0]
    doc["weight_map"][k] = "../../etc/passwd"
    d = case("index-outside", i_src)
    (d / i_rel).write_text(json.dumps(doc))
    # symlink loops, a FIFO, a device node, non-UTF-8 names, very deep nesting
    d = case("specials", real_ckpt("plain-pt"))
    os.symlink(d, d / "loop")
    os.symlink(d / "nope", d / "dangling")
    os.mkfifo(d / "fifo")
    try:
        os.mknod(d / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except (PermissionError, OSError):
        pass
    (d / os.fsdecode(b"bad-\xff\xfe-name.pt")).write_bytes(b"\x80\x02garbage")
    deep = d
    for i in range(60):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    return cases


def test_every_case_gives_a_finding_or_a_clear_error(corpus):
    results = run_corpus(corpus)
    assert len(results) == len(corpus)
    print(f"\ncorpus: {len(corpus)} bad inputs, outcomes {sorted({r['outcome'] for r in results})}")
    bad = [r for r in results if r["outcome"] not in ("ok", "scan-error")]
    assert not bad, json.dumps(bad[:3], indent=1)
    by_name = {Path(r["path"]).name: r for r in results}
    # the broken file is named by a finding, not silently accepted
    for name, r in by_name.items():
        flip_in_data = "-flip" in name and int(name.rsplit("flip", 1)[1]) > 64
        if flip_in_data:  # a flipped byte inside tensor data changes a value, which no header can tell
            continue
        if "-cut" in name or name.startswith(("st-", "zip-", "dcp-", "latest-", "index-")):
            assert r["outcome"] == "ok" and r["error"], (name, r)
    assert "file-corrupt" in by_name["st-huge-header"]["codes"]
    assert "file-truncated" in by_name["zip-no-central-dir"]["codes"]
    assert "latest-dangling" in by_name["latest-escape"]["codes"]
    assert "index-mismatch" in by_name["index-outside"]["codes"]
    assert "shard-missing" in by_name["dcp-missing-file"]["codes"]
    assert "file-truncated" in by_name["dcp-short-file"]["codes"]
    assert {"special-file", "unreadable"} <= set(by_name["specials"]["codes"])


def test_the_cli_never_prints_a_traceback(corpus):
    for d in corpus[::7]:
        r = subprocess.run(
            [sys.executable, "-m", "ckpt_tui", "inspect", str(d), "--json"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode in (0, 1), (d, r.stderr)
        assert "Traceback" not in r.stderr
        json.loads(r.stdout)


def test_a_folder_of_100000_empty_files(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    for i in range(100_000):
        (d / f"f{i:06d}.bin").touch()
    [r] = run_corpus([d], seconds=120)
    assert r["outcome"] == "ok"
