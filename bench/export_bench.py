"""``ckpt-tui export`` against the peers, side by side, on real checkpoints built on CPU.

    python bench/make_big.py                       # once: ~16 GB under bench/out/data/ (cached)
    python bench/export_bench.py [--runs 3] [--only fsdp-1g ...] [--tools ours,accelerate,...]

Checkpoints (from ``bench/make_big.py``): FSDP1 DCP ``fsdp-1g`` / ``fsdp-4g`` (HF Trainer layout,
model in ``pytorch_model_fsdp_0/``), DeepSpeed ``ds-zero2`` / ``ds-zero3`` (134M params, bf16).

Tools per checkpoint kind:
  DCP:   ours (``ckpt-tui export CKPT --out X --no-verify``), ours+verify (same, default verify),
         ``accelerate merge-weights CKPT/pytorch_model_fsdp_0 X``,
         ``python -m torch.distributed.checkpoint.format_utils dcp_to_torch CKPT/pytorch_model_fsdp_0 X.pt``,
         ``cp -r CKPT/pytorch_model_fsdp_0 X`` (the floor: the same bytes, no format change).
  DCP zstd (``fsdp-zstd-1g``: fsdp-1g's model, every item through torch's ZStandard extension): ours, ours+verify,
         ``dcp_to_torch``, and the floor: ``zstandard`` itself inflating every frame, its output discarded.
  DCP optimizer (``fsdp-optim-*``: ``optimizer_0/``): ours optimizer (``--component optimizer --no-verify``),
         ours optimizer+verify, ``dcp_to_torch CKPT/optimizer_0 X.pt``.
  ZeRO:  ours, ours+verify, ``python CKPT/zero_to_fp32.py CKPT X --safe_serialization``; the optimizer
         state: ours optimizer (``--component optimizer --no-verify``), ours optimizer+verify.
  Megatron-Core (``megatron-llama-1g``: a Llama-family GPT, torch_dist, TP=2): ours (the plain export, megatron's
         names), ours+verify, ours --to hf (a Hugging Face LlamaForCausalLM folder: QKV and fc1 split, config.json;
         ``--no-verify``), ours+verify --to hf, ``cp -r CKPT/checkpoints/iter_0000010 X`` (the floor).

Each command runs under GNU ``/usr/bin/time -v`` ("Maximum resident set size" = peak RSS of the
largest process; install with ``apt-get install -y time`` if missing). One warm-up run per
(checkpoint, tool), then ``--runs`` timed runs; the median is reported. The page cache is not
dropped (the checkpoint is warm for everyone). Outputs are removed between runs, and ``sync`` is
called outside the timing after every run so no run inherits another's dirty pages.

``ckpt-tui export`` fsyncs its output; the peers do not. So two times are reported: ``wall`` (the
command) and ``+flush`` (the command plus the ``sync`` right after it, i.e. until the bytes are on
disk) — the second is the like-for-like comparison.

Writes the Markdown table (plus machine, raw per-run numbers and the issue's targets) to stdout
and ``bench/out/export.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
DATA = OUT / "data"
WORK = OUT / "export-run"
PY = sys.executable
BIN = Path(PY).parent

CKPTS = {  # name -> kind
    "fsdp-1g": "dcp",
    "fsdp-4g": "dcp",
    "fsdp-optim-1g": "dcp-optim",
    "fsdp-optim-2g": "dcp-optim",
    "fsdp-zstd-1g": "dcp-zstd",
    "ds-zero2": "zero",
    "ds-zero3": "zero",
    "ds-moe": "moe",
    "megatron-llama-1g": "megatron",
}
LARGER = {"dcp": "fsdp-4g", "zero": "ds-zero3"}
SIZED = {
    "dcp": "pytorch_model_fsdp_0",
    "dcp-optim": "optimizer_0",
    "dcp-zstd": "pytorch_model_fsdp_0",
    "megatron": "checkpoints",
}
# the floor of a zstd DCP: zstandard itself inflating every frame of its .distcp files, the output discarded
ZSTD_FLOOR = """
import sys, zstandard
from pathlib import Path
for p in sorted(Path(sys.argv[1]).glob("*.distcp")):
    with open(p, "rb") as f:
        r = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        while r.read(1 << 24):
            pass
"""  # kind -> the folder whose bytes the row counts


def _exe(name: str) -> str:
    p = BIN / name
    return str(p) if p.exists() else (shutil.which(name) or name)


def tools(kind: str, ckpt: Path) -> dict[str, tuple[list[str], str]]:
    """tool -> (argv with {out} placeholder, output path kind 'dir'|'file')."""
    ours = [_exe("ckpt-tui"), "export", str(ckpt), "--out", "{out}"]
    t: dict[str, tuple[list[str], str]] = {
        "ours": (ours + ["--no-verify"], "dir"),
        "ours+verify": (ours, "dir"),
    }
    if kind == "dcp":
        m = ckpt / "pytorch_model_fsdp_0"
        t["accelerate merge-weights"] = ([_exe("accelerate"), "merge-weights", str(m), "{out}"], "dir")
        t["dcp_to_torch"] = (
            [PY, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", str(m), "{out}.pt"],
            "file",
        )
        t["cp -r (floor)"] = (["cp", "-r", str(m), "{out}"], "dir")
        # split over processes (issue 14.1): 1GB shards so two ranks have files to share; each rank under its own
        # /usr/bin/time -v (torchrun --no-python) for its peak RSS
        run2 = [
            PY,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "--no-python",
            "/usr/bin/time",
            "-v",
            PY,
            "-m",
            "ckpt_tui",
            "export",
            str(ckpt),
            "--out",
            "{out}",
            "--max-shard-size",
            "1GB",
        ]
        t["ours 1GB shards"] = (ours + ["--max-shard-size", "1GB", "--no-verify"], "dir")
        t["ours+verify 1GB shards"] = (ours + ["--max-shard-size", "1GB"], "dir")
        t["ours+verify 1GB --jobs 2"] = (ours + ["--max-shard-size", "1GB", "--jobs", "2"], "dir")
        t["ours 1GB torchrun 2 ranks"] = (run2 + ["--no-verify"], "dir")
        t["ours+verify 1GB torchrun 2 ranks"] = (run2, "dir")
        t["torchrun start-up 2 ranks"] = (
            [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--no-python", "true"],
            "none",
        )
        t["ranks' import torch.distributed"] = (
            [
                PY,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "--no-python",
                PY,
                "-c",
                "import torch.distributed",
            ],
            "none",
        )
        # what a rank loads before it works, now that it reaches the store without torch (issue 14)
        t["ranks' import ckpt_tui export"] = (
            [
                PY,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "--no-python",
                PY,
                "-c",
                "import ckpt_tui.cli.export, ckpt_tui.core.export.api, ckpt_tui.core.export.distributed",
            ],
            "none",
        )
    elif kind == "dcp-zstd":  # the model of fsdp-1g, every item zstd-compressed (torch's ZStandard extension)
        m = ckpt / "pytorch_model_fsdp_0"
        t["dcp_to_torch"] = (
            [PY, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", str(m), "{out}.pt"],
            "file",
        )
        t["zstandard decompress (floor)"] = ([PY, "-c", ZSTD_FLOOR, str(m)], "none")
    elif kind == "megatron":  # a Llama-family Megatron-Core GPT: the plain export against --to hf (issue 27)
        t["ours --to hf"] = (ours + ["--to", "hf", "--no-verify"], "dir")
        t["ours+verify --to hf"] = (ours + ["--to", "hf"], "dir")
        t["cp -r (floor)"] = (["cp", "-r", str(ckpt / "checkpoints" / "iter_0000010"), "{out}"], "dir")
        return t
    elif kind == "dcp-optim":  # the optimizer state of an HF Trainer / Accelerate FSDP checkpoint (optimizer_0/)
        t = {
            "ours optimizer": (ours + ["--component", "optimizer", "--no-verify"], "dir"),
            "ours optimizer+verify": (ours + ["--component", "optimizer"], "dir"),
            "dcp_to_torch": (
                [
                    PY,
                    "-m",
                    "torch.distributed.checkpoint.format_utils",
                    "dcp_to_torch",
                    str(ckpt / "optimizer_0"),
                    "{out}.pt",
                ],
                "file",
            ),
        }
    else:
        # the floor: the bytes ours writes (model.safetensors, 4 bytes a parameter), copied file to file by the kernel
        t["cp of the output (floor)"] = (["cp", "-r", str(_exported(ckpt)), "{out}"], "dir")
    if kind == "zero":  # zero_to_fp32 fails on a mixture of experts ("is not a model state checkpoint")
        t["zero_to_fp32"] = ([PY, str(ckpt / "zero_to_fp32.py"), str(ckpt), "{out}", "--safe_serialization"], "dir")
    if kind in ("zero", "moe"):  # the optimizer state (fp32 masters, exp_avg, exp_avg_sq: 3x the fp32 model)
        t["ours optimizer"] = (ours + ["--component", "optimizer", "--no-verify"], "dir")
        t["ours optimizer+verify"] = (ours + ["--component", "optimizer"], "dir")
    return t


def _exported(ckpt: Path) -> Path:
    """ckpt-tui's export of ``ckpt`` (made once, outside the timings): what the floor row copies."""
    out = OUT / "floor" / ckpt.name
    if not (out / "model.safetensors").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([_exe("ckpt-tui"), "export", str(ckpt), "--out", str(out), "--no-verify"], check=True)
    return out


def _du(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0


def _clean(out: Path) -> None:
    for p in (out, Path(str(out) + ".pt")):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    os.sync()


def timed(
    argv: list[str], out: Path, env: dict
) -> tuple[list[str], subprocess.CompletedProcess, float, float, list[float]]:
    """Run ``argv`` (``{out}`` replaced) under ``/usr/bin/time -v``, then ``sync``: (the command, its process, wall s,
    wall s with the flush, each "Maximum resident set size" it printed in MB). merge_bench.py times with it too."""
    cmd = ["/usr/bin/time", "-v"] + [a.replace("{out}", str(out)) for a in argv]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    t1 = time.perf_counter()
    os.sync()
    t2 = time.perf_counter()
    rss = [int(x) / 1024 for x in re.findall(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)]
    return cmd, p, t1 - t0, t2 - t0, rss


def run_once(argv: list[str], out: Path, env: dict, kind: str = "dir") -> dict:
    _clean(out)
    cmd, p, wall, flush, rss = timed(argv, out, env)
    produced = max(_du(out), _du(Path(str(out) + ".pt")))
    if p.returncode != 0 or not rss or (produced == 0 and kind != "none"):
        tail = "\n".join((p.stdout + p.stderr).splitlines()[-25:])
        raise RuntimeError(f"failed (rc={p.returncode}, output {produced} B): {' '.join(cmd)}\n{tail}")
    # nested /usr/bin/time (one per rank under torchrun --no-python): the ranks' first, the launcher's last
    return {"wall": wall, "flush": flush, "rss_mb": rss[-1], "rank_rss_mb": rss[:-1], "out_bytes": produced}


def machine() -> dict:
    mem = next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    df = subprocess.run(["df", "-T", str(OUT)], capture_output=True, text=True).stdout.splitlines()[-1].split()
    import deepspeed  # noqa: F401
    import torch  # noqa: F401  (versions only)

    vers = {m: __import__(m).__version__ for m in ("torch", "deepspeed", "accelerate")}
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(int(mem.split()[1]) / 1024**2, 1),
        "fs": f"{df[1]} on {df[0]} ({df[-1]})",
        "python": platform.python_version(),
        **vers,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help=f"checkpoints (of {list(CKPTS)})")
    ap.add_argument("--tools", default=None, help="comma-separated subset of tool names")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    if not Path("/usr/bin/time").exists():
        raise SystemExit("GNU time missing: apt-get install -y time")
    env = dict(
        os.environ,
        PYTHONWARNINGS="ignore",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    WORK.mkdir(parents=True, exist_ok=True)
    want_tools = set(args.tools.split(",")) if args.tools else None

    results = []  # dicts: ckpt, size, tool, runs[...]
    for name in args.only or list(CKPTS):
        ckpt = args.data / name
        if not (ckpt / ".done").exists():
            raise SystemExit(f"{ckpt} missing: run python bench/make_big.py {name}")
        kind = CKPTS[name]
        size = _du(ckpt / SIZED.get(kind, ""))
        for tool, (argv, out_kind) in tools(kind, ckpt).items():
            if want_tools and tool not in want_tools:
                continue
            out = WORK / re.sub(r"[^a-z0-9]+", "_", tool.lower()).strip("_")
            print(f"[bench] {name} {tool} ...", file=sys.stderr, flush=True)
            if not args.no_warmup:
                run_once(argv, out, env, out_kind)
            runs = [run_once(argv, out, env, out_kind) for _ in range(args.runs)]
            _clean(out)
            results.append({"ckpt": name, "kind": kind, "size": size, "tool": tool, "runs": runs})
            med = statistics.median(r["wall"] for r in runs)
            print(f"[bench]   wall {med:.2f}s  rss {max(r['rss_mb'] for r in runs):.0f} MB", file=sys.stderr)
    shutil.rmtree(WORK, ignore_errors=True)

    md = render(results, machine(), args.runs)
    print(md)
    (OUT / "export.md").write_text(md)
    (OUT / "export.json").write_text(json.dumps(results, indent=1))


def _med(r: dict, key: str) -> float:
    return statistics.median(x[key] for x in r["runs"])


def render(results: list[dict], mach: dict, runs: int) -> str:
    L = [
        "# ckpt-tui export vs peers",
        "",
        f"Machine: {mach['nproc']} CPUs ({mach['cpu']}), {mach['ram_gb']} GB RAM, bench/out on {mach['fs']}; "
        f"Python {mach['python']}, torch {mach['torch']}, deepspeed {mach['deepspeed']}, "
        f"accelerate {mach['accelerate']}.",
        f"Median of {runs} runs after one warm-up; page cache warm. `wall` = command; `+flush` = command + `sync` "
        "(ours fsyncs itself, the peers do not). Ratio = tool / ours (ours = `--no-verify`).",
        "",
        "| checkpoint | size | tool | wall s | +flush s | peak RSS MB | wall ratio | +flush ratio | output | MB/s |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    ours = {r["ckpt"]: r for r in results if r["tool"] == "ours"}
    for r in results:
        o = ours.get(r["ckpt"])
        w, f = _med(r, "wall"), _med(r, "flush")
        rss = statistics.median(x["rss_mb"] for x in r["runs"])
        wr = f"{w / _med(o, 'wall'):.2f}×" if o else "–"
        fr = f"{f / _med(o, 'flush'):.2f}×" if o else "–"
        L.append(
            f"| {r['ckpt']} | {r['size'] / 1e9:.2f} GB | {r['tool']} | {w:.2f} | {f:.2f} | {rss:.0f} | "
            f"{wr} | {fr} | {r['runs'][0]['out_bytes'] / 1e9:.2f} GB | {r['runs'][0]['out_bytes'] / 1e6 / w:.0f} |"
        )
    L.append("")
    L.append("Under torchrun the peak RSS column is the launcher's; each rank's is in the split section below.")

    # verification cost
    L += ["", "Verification cost (ours+verify − ours, median wall):", ""]
    for name, o in ours.items():
        v = next((r for r in results if r["ckpt"] == name and r["tool"] == "ours+verify"), None)
        if v:
            L.append(
                f"- {name}: {_med(v, 'wall') - _med(o, 'wall'):+.2f} s ({_med(v, 'wall'):.2f} vs {_med(o, 'wall'):.2f})"
            )

    # split over processes (issue 14.1)
    by = {(r["ckpt"], r["tool"]): r for r in results}
    for name in sorted({r["ckpt"] for r in results}):
        one, two = by.get((name, "ours+verify 1GB shards")), by.get((name, "ours+verify 1GB torchrun 2 ranks"))
        start = by.get((name, "torchrun start-up 2 ranks"))
        if not (one and two):
            continue
        L += ["", f"Split over ranks, {name}, 1GB shards, with verification (median wall):", ""]
        s0 = _med(start, "wall") if start else 0.0
        net = _med(two, "wall") - s0
        L.append(
            f"- 1 process {_med(one, 'wall'):.2f} s; torchrun 2 ranks {_med(two, 'wall'):.2f} s, minus the "
            f"launcher's start-up {s0:.2f} s = {net:.2f} s: {net / _med(one, 'wall'):.2f}× (target ≤ 0.7) "
            f"{'PASS' if net / _med(one, 'wall') <= 0.7 else 'MISS'}"
        )
        ranks = [x for r in two["runs"] for x in r["rank_rss_mb"]]
        if ranks:
            L.append(
                f"- peak RSS per rank {min(ranks):.0f}–{max(ranks):.0f} MB "
                f"(launcher {max(x['rss_mb'] for x in two['runs']):.0f} MB)"
            )
        for tool in (
            "ours+verify 1GB --jobs 2",
            "ours 1GB shards",
            "ours 1GB torchrun 2 ranks",
            "ranks' import torch.distributed",
            "cp -r (floor)",
        ):
            if (name, tool) in by:
                L.append(
                    f"- {tool}: {_med(by[(name, tool)], 'wall'):.2f} s (+flush {_med(by[(name, tool)], 'flush'):.2f} s)"
                )

    # targets
    L += ["", "Targets (issue):", ""]
    by = {(r["ckpt"], r["tool"]): r for r in results}
    for kind, peer, limit in (("dcp", "accelerate merge-weights", 0.25), ("zero", "zero_to_fp32", 0.4)):
        name = LARGER[kind]
        o, p = by.get((name, "ours")), by.get((name, peer))
        if o and p:
            for key in ("wall", "flush"):
                ratio = _med(o, key) / _med(p, key)
                L.append(
                    f"- {name} {key}: ours / {peer} = {ratio:.2f} (target ≤ {limit}) "
                    f"{'PASS' if ratio <= limit else 'MISS'}"
                )
    for name in sorted({r["ckpt"] for r in results}):  # --to hf against the plain export (issue 27: within 1.2x)
        for plain, hf in (("ours", "ours --to hf"), ("ours+verify", "ours+verify --to hf")):
            a, b = by.get((name, plain)), by.get((name, hf))
            if a and b:
                for key in ("wall", "flush"):
                    ratio = _med(b, key) / _med(a, key)
                    L.append(
                        f"- {name} {key}: {hf} / {plain} = {ratio:.2f} (target ≤ 1.2) "
                        f"{'PASS' if ratio <= 1.2 else 'MISS'}"
                    )
    rss = [(r["ckpt"], r["tool"], max(x["rss_mb"] for x in r["runs"])) for r in results if r["tool"].startswith("ours")]
    for name, tool, mx in rss:
        L.append(f"- {name} {tool} peak RSS {mx:.0f} MB (target ≤ 400) {'PASS' if mx <= 400 else 'MISS'}")

    L += ["", "Raw runs (wall s / +flush s / RSS MB):", ""]
    for r in results:
        raw = ", ".join(f"{x['wall']:.2f}/{x['flush']:.2f}/{x['rss_mb']:.0f}" for x in r["runs"])
        L.append(f"- {r['ckpt']} {r['tool']}: {raw}")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
