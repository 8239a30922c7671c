"""``ckpt-tui`` on a checkpoint in object storage: a big real checkpoint (``bench/make_big.py``) uploaded to a
local S3 protocol server (``moto_server``, as in tests/functional/storage/), then timed:

    python bench/object_storage_bench.py [--only fsdp-1g] [--keep]

- ``ckpt-tui inspect --json s3://…``: wall time and ``bytes_fetched``;
- ``ckpt-tui export s3://… --out X --no-verify`` and the verified export: wall time and peak RSS (GNU
  ``/usr/bin/time -v``), the output compared byte for byte with the export of the same checkpoint on local disk.

moto keeps the objects in its own process on the same machine: the figures are ckpt-tui's cost (GETs, memory),
not a network's. Writes a Markdown table to stdout and ``bench/out/object_storage.md``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.functional.storage.conftest import MotoServer  # noqa: E402

DATA = ROOT / "bench" / "out" / "data"


def timed(cmd, env):
    t0 = time.monotonic()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) // 1024
    return r, wall, rss


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=["fsdp-1g"])
    args = ap.parse_args()
    exe = [sys.executable, "-m", "ckpt_tui"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-tui-s3-bench-") as tmp:
        tmp = Path(tmp)
        server = MotoServer(tmp / "moto.log")
        try:
            server.client().create_bucket(Bucket="bench")
            for name in args.only:
                src = DATA / name
                t0 = time.monotonic()
                server.upload("bench", src, name)
                print(f"{name}: uploaded in {time.monotonic() - t0:.1f} s", file=sys.stderr)
                size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
                url = f"s3://bench/{name}"
                r, wall, rss = timed([*exe, "inspect", "--json", url], server.env)
                fetched = json.loads(r.stdout)["bytes_fetched"]
                rows.append((name, size, "inspect --json", wall, rss, f"bytes_fetched {fetched:,}"))
                local = tmp / "local"
                timed([*exe, "export", str(src), "--out", str(local), "--no-verify"], server.env)
                for label, extra in (("export --no-verify", ["--no-verify"]), ("export (verified)", [])):
                    out = tmp / "remote"
                    _, wall, rss = timed([*exe, "export", url, "--out", str(out), *extra], server.env)
                    names = sorted(p.name for p in local.iterdir())
                    same = names == sorted(p.name for p in out.iterdir()) and all(
                        filecmp.cmp(local / n, out / n, shallow=False) for n in names
                    )
                    rows.append(
                        (
                            name,
                            size,
                            label,
                            wall,
                            rss,
                            "bit-identical to the local export" if same else "DIFFERS from the local export",
                        )
                    )
                    shutil.rmtree(out)
                shutil.rmtree(local)
        finally:
            server.stop()
    lines = ["| checkpoint | command | wall s | peak RSS MB | |", "|---|---|---:|---:|---|"]
    for name, size, label, wall, rss, note in rows:
        lines.append(f"| {name} ({size / 1e9:.2f} GB) | `ckpt-tui {label} s3://…` | {wall:.2f} | {rss} | {note} |")
    text = "\n".join(lines)
    print(text)
    (ROOT / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "out" / "object_storage.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
