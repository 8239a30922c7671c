"""Start-up and headers-only cost of ``ckpt-tui``, as a Markdown table.

    python bench/inspect_bench.py [--runs 5] [--layout DIR] [--rebuild] [--with-405b | --only-405b]

(1) import start-up: ``import ckpt_tui.cli``, ``ckpt-tui --help`` (and whether they pull in
torch / deepspeed / textual / rich), ``import torch`` for reference.
(2) ``ckpt-tui inspect --json`` on the synthetic 1,024-rank, ~1 TB FSDP layout from
``bench/synthetic.py``: wall time (median), the same less ``ckpt-tui --version`` start-up, and
the bytes the process read (``rchar`` from ``/proc/self/io``) against what a headers-only
reader needs (``.metadata`` + the small non-shard files).
(3) with ``--with-405b`` / ``--only-405b``: ``inspect --json`` on the llama-405B-shaped DCP of
``bench/make_405b.py`` (1.16 M chunk records), wall and peak RSS, beside a plain ``pickle.load`` of its
``.metadata`` with torch's classes.

Writes the table to stdout and ``bench/out/inspect.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
PY = sys.executable
HEAVY = ("torch", "deepspeed", "textual", "rich")


def _cli() -> list[str]:
    exe = shutil.which("ckpt-tui") or str(Path(PY).parent / "ckpt-tui")
    return [exe] if Path(exe).exists() else [PY, "-m", "ckpt_tui"]


def _wall(cmd: list[str], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode()[-2000:]}")
    return statistics.median(times), times


# Runs inside a fresh interpreter; prints one JSON line on fd 2 (stdout may carry the CLI's output).
_MODULES_PROBE = r"""
import json, os, sys
argv = json.loads(sys.argv[1])
if argv is None:
    import ckpt_tui.cli
else:
    from ckpt_tui.cli import main
    sys.stdout = open(os.devnull, "w")
    try:
        main(argv)
    except SystemExit:
        pass
heavy = %r
os.write(2, (json.dumps({m: m in sys.modules for m in heavy}) + "\n").encode())
""" % (HEAVY,)

_IO_PROBE = r"""
import json, os, sys
def rchar():
    with open("/proc/self/io") as f:
        return int(next(l for l in f if l.startswith("rchar:")).split()[1])
r_start = rchar()
from ckpt_tui.cli import main
argv = json.loads(sys.argv[1])
def run():
    saved, sys.stdout = sys.stdout, open(os.devnull, "w")
    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdout.close()
        sys.stdout = saved
    return code
r0 = rchar()
code1 = run()
r1 = rchar()
code2 = run()
r2 = rchar()
print(json.dumps({"process": r2 - r_start, "first": r1 - r0, "second": r2 - r1, "exit": [code1, code2],
                  "heavy": {m: m in sys.modules for m in %r}}))
""" % (HEAVY,)


def _wall_rss(cmd: list[str], runs: int) -> tuple[float, float, list[float]]:
    """(median wall s, median peak RSS MB, the walls) of ``cmd`` — RSS from the child's own rusage (wait4)."""
    walls, rss = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        walls.append(time.perf_counter() - t0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}")
        rss.append(ru.ru_maxrss / 1024)
    return statistics.median(walls), statistics.median(rss), walls


_PLAIN_PICKLE = (
    "import pickle, sys, torch.distributed.checkpoint.filesystem\n"
    "with open(sys.argv[1], 'rb') as f:\n    md = pickle.load(f)\n"
)


def bench_405b(runs: int) -> list[str]:
    """``inspect --json`` on the llama-405B-shaped DCP of ``bench/make_405b.py`` beside a plain ``pickle.load`` of
    its ``.metadata`` with torch's classes (what ``FileSystemReader.read_metadata`` does)."""
    sys.path.insert(0, str(HERE))
    import make_405b  # noqa: E402

    t0 = time.perf_counter()
    d = make_405b.make(OUT / "scale405b")
    built = time.perf_counter() - t0
    info = make_405b.describe(d)
    ours = _wall_rss(_cli() + ["inspect", str(d), "--json"], runs)
    plain = _wall_rss([PY, "-c", _PLAIN_PICKLE, str(d / ".metadata")], runs)
    torch_only = _wall_rss([PY, "-c", "import torch.distributed.checkpoint.filesystem"], runs)
    return [
        "## llama-405B-shaped DCP: `ckpt-tui inspect --json` beside a plain `pickle.load`",
        "",
        f"Layout: `{d}` (`bench/make_405b.py`{'' if built > 5 else ', cached'}): 1,024 ranks × 1,137 tensors, "
        f"`.metadata` {info['metadata_bytes']:,} bytes, {info['shard_files']} sparse shards declaring "
        f"{_fmt_b(info['declared_bytes'])}. Median of {runs}; peak RSS of the process (wait4).",
        "",
        "| what | wall | peak RSS | vs plain pickle.load |",
        "|---|---:|---:|---:|",
        f"| `ckpt-tui inspect --json` | {ours[0]:.2f} s | {ours[1]:,.0f} MB | "
        f"{plain[0] / ours[0]:.1f}× faster, {plain[1] / ours[1]:.1f}× less memory |",
        f"| plain `pickle.load` of `.metadata` with torch's classes (incl. `import torch`) | {plain[0]:.2f} s | "
        f"{plain[1]:,.0f} MB | 1× |",
        f"| `import torch.distributed.checkpoint.filesystem` alone | {torch_only[0]:.2f} s | {torch_only[1]:,.0f} MB | |",
        "",
        f"runs (s): ours {[round(x, 2) for x in ours[2]]}, plain {[round(x, 2) for x in plain[2]]}",
        "",
    ]


def _modules(argv) -> dict:
    p = subprocess.run([PY, "-c", _MODULES_PROBE, json.dumps(argv)], capture_output=True, text=True)
    try:
        return json.loads(p.stderr.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"probe failed: {p.stderr[-2000:]}")


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return (
        f"{os.cpu_count()} CPUs (nproc), {model}{mem}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}"
    )


def _fmt_s(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def _fmt_b(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def _heavy(d: dict) -> str:
    got = [m for m in HEAVY if d.get(m)]
    return "imports " + ", ".join(got) if got else "none of " + "/".join(HEAVY)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layout", default=str(OUT / "scale"), help="where the synthetic layout is (built if absent)")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--only-405b", action="store_true", help="only the llama-405B-shaped DCP section")
    ap.add_argument(
        "--with-405b",
        action="store_true",
        help="add the llama-405B-shaped DCP section "
        "(builds bench/out/scale405b once: ~1.5 min, ~3 GB of memory, 193 MB on disk)",
    )
    a = ap.parse_args(argv)
    if a.only_405b:
        text = "\n".join(bench_405b(a.runs))
        print(text)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "inspect-405b.md").write_text(text)
        return 0
    sys.path.insert(0, str(HERE))
    import synthetic  # noqa: E402

    root = Path(a.layout)
    ckpt = root / "checkpoint-1000"
    build_s = None
    if a.rebuild or not (ckpt / "pytorch_model_fsdp_0" / ".metadata").exists():
        if root.exists():
            shutil.rmtree(root)
        t0 = time.perf_counter()
        synthetic.make_scale_layout(root)
        build_s = time.perf_counter() - t0
    info = synthetic.describe(ckpt)
    small_files = [p for p in ckpt.rglob("*") if p.is_file() and not p.name.endswith(".distcp")]
    needed = sum(p.stat().st_size for p in small_files)
    n_files = sum(1 for p in ckpt.rglob("*") if p.is_file())
    cli = _cli()
    n = a.runs

    rows1 = []
    t, _ = _wall([PY, "-c", "import ckpt_tui.cli"], n)
    rows1.append(("`python -c 'import ckpt_tui.cli'`", t, _heavy(_modules(None))))
    t, _ = _wall(cli + ["--help"], n)
    rows1.append(("`ckpt-tui --help`", t, _heavy(_modules(["--help"]))))
    t_ver, _ = _wall(cli + ["--version"], n)
    rows1.append(("`ckpt-tui --version`", t_ver, _heavy(_modules(["--version"]))))
    t, _ = _wall([PY, "-c", "import torch"], n)
    rows1.append(("`python -c 'import torch'` (reference)", t, "torch"))
    t, _ = _wall([PY, "-c", "pass"], n)
    rows1.append(("`python -c 'pass'` (interpreter floor)", t, "-"))

    t_insp, all_insp = _wall(cli + ["inspect", str(ckpt), "--json"], n)
    p = subprocess.run(
        [PY, "-c", _IO_PROBE, json.dumps(["inspect", str(ckpt), "--json"])], capture_output=True, text=True
    )
    if p.returncode != 0:
        raise RuntimeError(f"I/O probe failed: {p.stderr[-3000:]}")
    io = json.loads(p.stdout.strip().splitlines()[-1])
    doc = json.loads(subprocess.run(cli + ["inspect", str(ckpt), "--json"], capture_output=True, text=True).stdout)

    lines = [
        "# ckpt-tui inspect benchmark",
        "",
        f"Machine: {machine()}  ",
        f"Median of {n} runs, wall clock, warm page cache.",
        "",
        "## Start-up",
        "",
        "| command | wall (median) | heavy modules imported |",
        "|---|---:|---|",
        *[f"| {c} | {_fmt_s(t)} | {h} |" for c, t, h in rows1],
        "",
        "## `ckpt-tui inspect --json` on the synthetic scale layout",
        "",
        f"Layout: `{ckpt}` — HF Trainer + FSDP, {info['shard_files']} ranks "
        f"(`__{{rank}}_0.distcp`, sparse), {_fmt_b(info['declared_bytes'])} declared "
        f"({info['declared_bytes']:,} bytes), {_fmt_b(info['allocated_bytes'])} on disk, "
        f"`.metadata` {info['metadata_bytes']:,} bytes, {n_files} files"
        + (f"; built in {build_s:.1f} s by `bench/synthetic.py`." if build_s is not None else "."),
        "",
        "| measure | value |",
        "|---|---:|",
        f"| wall, median of {n} | {_fmt_s(t_insp)} (runs: {', '.join(_fmt_s(x) for x in all_insp)}) |",
        f"| wall minus `ckpt-tui --version` start-up ({_fmt_s(t_ver)}) | {_fmt_s(t_insp - t_ver)} |",
        f"| bytes read, whole probe process (`rchar`: imports + both calls) | {io['process']:,} ({_fmt_b(io['process'])}) |",
        f"| bytes read by `main([...])`, 1st call (incl. lazy imports) | {io['first']:,} ({_fmt_b(io['first'])}) |",
        f"| bytes read by `main([...])`, 2nd call (data only) | {io['second']:,} ({_fmt_b(io['second'])}) |",
        f"| headers-only floor: `.metadata` + non-shard files | {needed:,} ({_fmt_b(needed)}) |",
        f"| 2nd call / floor | {io['second'] / needed:.3f}× |",
        f"| 2nd call / declared checkpoint size | {io['second'] / info['declared_bytes']:.2e} |",
        f"| exit codes (in-process) | {io['exit']} |",
        f"| heavy modules after inspect | {_heavy(io['heavy'])} |",
        f"| report | layout `{doc.get('layout')}`, components {doc.get('components')}, "
        f"findings {[(f['code'], f['severity']) for f in doc.get('findings', [])]} |",
        "",
    ]
    if a.with_405b:
        lines += bench_405b(n)
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "inspect.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
