"""A 1,000,000-tensor safetensors file: what ``ckpt-tui inspect`` and ``export`` cost on it, by ``/usr/bin/time -v``.

    python bench/hostile_bench.py [--tensors 1000000] [--root DIR] [--skip-export]

The file is one header of ``--tensors`` entries (``model.layers.{i}.w{j}.weight``, F32, shapes [1], [2] and [3]
in turn, offsets contiguous in name order, ~85 MB of JSON, under safetensors' own 100 MB limit) and their data
(8 MB at 10^6), checked once with the safetensors library itself (``safe_open`` reads its header). Measured:
``ckpt-tui inspect FILE --json`` and ``ckpt-tui export FILE --out OUT --overwrite`` (which verifies), each its wall
time and peak RSS (``Maximum resident set size``) from ``/usr/bin/time -v``. A scaling row at a tenth of the size
shows whether the cost is linear (the ratio should be near 10).

Writes a Markdown table to stdout and ``bench/out/hostile.md``. Not run in CI (it takes a few minutes).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
PY = sys.executable


def make(path: Path, n: int) -> Path:
    """A safetensors file of ``n`` tiny F32 tensors (cached by size)."""
    if path.exists():
        return path
    header: dict = {"__metadata__": {"format": "pt"}}
    pos = 0
    for i in range(n):
        size = 1 + i % 3
        header[f"model.layers.{i // 8}.w{i % 8}.weight"] = {
            "dtype": "F32",
            "shape": [size],
            "data_offsets": [pos, pos + 4 * size],
        }
        pos += 4 * size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + pos)
    from safetensors import safe_open

    with safe_open(str(tmp), framework="numpy") as st:  # the library reads it
        assert len(st.keys()) == n
    tmp.rename(path)
    return path


def timed(cmd: list[str]) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds (user + system), peak RSS in MB, exit code) of ``cmd`` under ``/usr/bin/time -v``
    (the CPU time is the steadier figure on a shared machine)."""
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err).group(1)
    secs = 0.0
    for part in wall.split(":"):
        secs = secs * 60 + float(part)
    cpu = sum(float(re.search(rf"{k} time \(seconds\): (\S+)", err).group(1)) for k in ("User", "System"))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) // 1024
    code = int(re.search(r"Exit status: (\d+)", err).group(1))
    if code not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} exited {code}: {err[-3000:]}")
    return secs, cpu, rss, code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=1_000_000)
    ap.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "ckpt-tui-hostile-bench")
    ap.add_argument("--skip-export", action="store_true")
    a = ap.parse_args()
    a.root.mkdir(parents=True, exist_ok=True)
    cli = [PY, "-m", "ckpt_tui"]
    rows = []
    for n in (a.tensors // 10, a.tensors):
        (a.root / f"st-{n}").mkdir(exist_ok=True)
        f = make(a.root / f"st-{n}" / "model.safetensors", n)
        for what, extra in (("inspect", []), ("inspect --json", ["--json"])):
            rows.append((n, what, *timed([*cli, "inspect", str(f), *extra])))
        if not a.skip_export:
            out = a.root / f"out-{n}"
            shutil.rmtree(out, ignore_errors=True)
            rows.append((n, "export (verified)", *timed([*cli, "export", str(f), "--out", str(out)])))
            shutil.rmtree(out, ignore_errors=True)
    lines = ["| tensors | command | wall | CPU | peak RSS | exit |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {n:,} | `ckpt-tui {what}` | {w:.2f} s | {u:.2f} s | {r:,} MB | {c} |" for n, what, w, u, r, c in rows]
    by = {(n, what): u for n, what, _, u, _, _ in rows}
    for what in ("inspect", "inspect --json", "export (verified)"):
        small, big = by.get((a.tensors // 10, what)), by.get((a.tensors, what))
        if small and big:
            lines.append(f"\n{what}: {big / small:.1f}x the CPU time for 10x the tensors")
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(exist_ok=True)
    (OUT / "hostile.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
