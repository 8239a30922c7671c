"""``ckpt-tui export ADAPTER --merge`` against PEFT's ``merge_and_unload()``, side by side, on a ~1 GB bf16 Llama.

    python bench/merge_bench.py [--cache DIR] [--runs 1] [--driver auto|cli|direct|both] [--tools peft,ours,...]

The model is built once and cached under ``--cache`` (default ``bench/out/merge-data``; no download): a
``LlamaForCausalLM`` from a ``LlamaConfig`` (hidden 2048, intermediate 5632, 8 layers, 16 heads, vocab 32000,
untied head: 542M parameters, 1.08 GB in bf16) with random weights, saved with ``save_pretrained``, and a rank-16
LoRA (alpha 32) on every linear layer of it (q/k/v/o, gate/up/down) with random non-zero ``lora_A``/``lora_B``,
saved with PEFT's ``save_pretrained``.

Tools, each one whole process under GNU ``/usr/bin/time -v`` (imports included; "Maximum resident set size" =
peak RSS):
  peft:         ``AutoModelForCausalLM.from_pretrained(base, dtype=bf16)`` + ``PeftModel.from_pretrained`` +
                ``merge_and_unload()`` + ``save_pretrained(out)``;
  ours:         ``ckpt-tui export ADAPTER --merge --base BASE --out OUT --no-verify`` where ``ckpt-tui export
                --help`` mentions ``--merge`` (``--driver auto``, the default), otherwise (``--driver direct``) a
                script driving ``core/export/merge.py``'s ``merged_tensor`` and ``write.py``'s ``write_file`` for
                every tensor of the base (the config files copied beside it);
  ours+verify:  the same, verified (the CLI's default; direct: ``verify_files`` after the write, which computes
                every merged tensor again);
  import torch: ``python -c "import torch"``, the floor every torch merge pays.

Before each run the base and adapter files are read once (page cache warm for every tool), the output of the
run before is removed and ``sync`` is called outside the timing. ckpt-tui fsyncs its output, PEFT does not: so
``wall`` (the command) and ``+flush`` (the command and the ``sync`` after it) are both reported. After the runs,
ours and PEFT's outputs are compared tensor by tensor (bit-exact, one tensor in memory at a time).

Targets (issue 23): ours ≤ 0.5× PEFT's wall time; ours' peak RSS ≤ 100 MB above ``import torch``'s.
Writes the Markdown table (machine, what else was running, raw numbers) to stdout and ``bench/out/merge.md``.
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
from pathlib import Path

from export_bench import timed  # the same /usr/bin/time + sync timing as the export benchmark (bench/ is on sys.path)

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
PY = sys.executable
BIN = Path(PY).parent

LLAMA = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=32000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 16, 32
CONFIG_FILES = ("config.json", "generation_config.json")

PEFT_SCRIPT = r"""
import sys, torch, transformers, peft
base, adapter, out = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
merged.save_pretrained(out)
"""


def _exe(name: str) -> str:
    p = BIN / name
    return str(p) if p.exists() else (shutil.which(name) or name)


def build(cache: Path) -> tuple[Path, Path]:
    """(base folder, adapter folder) under ``cache``, made once (``.done`` marks a finished build)."""
    base, adapter = cache / "base", cache / "adapter"
    if (cache / ".done").exists():
        return base, adapter
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    torch.manual_seed(0)
    print("[bench] building the base (random bf16 Llama) ...", file=sys.stderr, flush=True)
    cfg = transformers.LlamaConfig(**LLAMA)
    model = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(base)
    print("[bench] building the adapter (rank 16 on every linear) ...", file=sys.stderr, flush=True)
    lora = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:  # PEFT starts lora_B at 0: a merge that did nothing would look fast and right
                p.copy_(torch.randn_like(p) * 0.02)
    lora.peft_config["default"].base_model_name_or_path = str(base)
    lora.save_pretrained(adapter)
    (cache / ".done").write_text(json.dumps({"llama": LLAMA, "rank": RANK, "alpha": ALPHA}))
    return base, adapter


def ours_direct(base: Path, adapter: Path, out: Path, verify: bool) -> None:
    """What ``export --merge`` does, driven by hand until the CLI has it: every tensor of the base, merged where
    the adapter has a LoRA on it, written by the real writer into ``out/model.safetensors``."""
    from ckpt_tui.core.adapters.config import read_lora_config
    from ckpt_tui.core.export.merge import merged_tensor
    from ckpt_tui.core.export.plan import OutFile, OutTensor
    from ckpt_tui.core.export.write import ByteCounter, verify_files, write_file
    from ckpt_tui.core.formats.safetensors.source import safetensors_source

    cfg = read_lora_config(adapter / "adapter_config.json")
    lora = {t.name: t for t in safetensors_source(adapter / "adapter_model.safetensors").tensors}
    tensors = []
    for t in safetensors_source(base / "model.safetensors").tensors:
        module = t.name.removesuffix(".weight")
        a = lora.get(f"base_model.model.{module}.lora_A.weight")
        if a is not None and t.name.endswith(".weight"):
            b = lora[f"base_model.model.{module}.lora_B.weight"]
            t = merged_tensor(t, a, b, cfg.scale(module), fan_in_fan_out=cfg.fan_in_fan_out)
        tensors.append(OutTensor(t.name, t.shape, t.dtype, t))
    f = OutFile("model.safetensors", tensors)
    out.mkdir()
    write_file(f, out / f.name, ByteCounter(f.nbytes, None, "writing"), None)
    for name in CONFIG_FILES:
        if (base / name).exists():
            shutil.copyfile(base / name, out / name)
    if verify:
        plan = type("Plan", (), {"files": [f]})()
        bad = verify_files(plan, out, files=[f])
        if bad:
            raise SystemExit(f"verification failed: {bad[:5]}")


def cli_has_merge() -> bool:
    p = subprocess.run([_exe("ckpt-tui"), "export", "--help"], capture_output=True, text=True)
    return p.returncode == 0 and "--merge" in p.stdout


def tools(base: Path, adapter: Path, driver: str) -> dict[str, list[str]]:
    """tool -> argv with an {out} placeholder."""
    t = {"peft": [PY, "-c", PEFT_SCRIPT, str(base), str(adapter), "{out}"]}
    if driver in ("cli", "both"):
        cli = [_exe("ckpt-tui"), "export", str(adapter), "--merge", "--base", str(base), "--out", "{out}"]
        t["ours"] = cli + ["--no-verify"]
        t["ours+verify"] = cli
    if driver in ("direct", "both"):
        direct = [PY, str(Path(__file__).resolve()), "--_direct", str(base), str(adapter), "{out}"]
        sfx = " (direct)" if driver == "both" else ""
        t["ours" + sfx] = direct
        t["ours+verify" + sfx] = direct + ["--_verify"]
    t["import torch"] = [PY, "-c", "import torch"]
    return t


def _du(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0


def _warm(paths: list[Path]) -> None:
    for p in paths:
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(16 << 20):
                        pass


def run_once(argv: list[str], out: Path, env: dict, warm: list[Path], makes_output: bool) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    _warm(warm)
    os.sync()
    cmd, p, wall, flush, rss = timed(argv, out, env)
    produced = _du(out)
    if p.returncode != 0 or not rss or (makes_output and produced == 0):
        tail = "\n".join((p.stdout + p.stderr).splitlines()[-25:])
        raise RuntimeError(f"failed (rc={p.returncode}, output {produced} B): {' '.join(cmd)}\n{tail}")
    return {"wall": wall, "flush": flush, "rss_mb": rss[-1], "out_bytes": produced}


def compare(a: Path, b: Path) -> str:
    """Whether two merged folders hold the same tensors, bit for bit (one tensor of each in memory at a time)."""
    import torch
    from safetensors import safe_open

    def files(d: Path) -> list[Path]:
        return sorted(d.glob("*.safetensors"))

    where: dict[str, Path] = {}
    for f in files(b):
        with safe_open(str(f), "pt") as h:
            where.update({k: f for k in h.keys()})
    n = 0
    seen = set()
    for f in files(a):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                if k not in where:
                    return f"differ: {k} only in {a.name}"
                x = h.get_tensor(k)
                with safe_open(str(where[k]), "pt") as g:
                    y = g.get_tensor(k)
                if (
                    x.dtype != y.dtype
                    or x.shape != y.shape
                    or not torch.equal(x.view(torch.uint8), y.view(torch.uint8))
                ):
                    return f"differ: {k}"
                n += 1
                seen.add(k)
    if set(where) - seen:
        return f"differ: {sorted(set(where) - seen)[:3]} only in {b.name}"
    return f"equal, bit for bit ({n} tensors)"


def others_running() -> list[str]:
    """The other busy processes on the machine while the bench ran (it has 2 cores shared with others)."""
    me = {os.getpid(), os.getppid()}
    p = subprocess.run(["ps", "-eo", "pid,pcpu,etimes,args", "--sort=-pcpu"], capture_output=True, text=True)
    busy = []
    for line in p.stdout.splitlines()[1:]:
        parts = line.split(None, 3)
        if len(parts) == 4 and int(parts[0]) not in me and float(parts[1]) >= 5.0 and "ps -eo" not in parts[3]:
            busy.append(f"{parts[1]}% cpu: {parts[3][:110]}")
    return busy[:8]


def machine() -> dict:
    mem = next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    import peft
    import torch
    import transformers

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(int(mem.split()[1]) / 1024**2, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=OUT / "merge-data", help="where the model is built once")
    ap.add_argument("--work", type=Path, default=None, help="where outputs go (default: CACHE/run)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmup", action="store_true", help="one untimed run of each tool first")
    ap.add_argument("--driver", choices=("auto", "cli", "direct", "both"), default="auto")
    ap.add_argument("--tools", default=None, help="comma-separated subset of tool names")
    ap.add_argument("--_direct", nargs=3, metavar=("BASE", "ADAPTER", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--_verify", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._direct:
        ours_direct(*map(Path, args._direct), verify=args._verify)
        return
    if not Path("/usr/bin/time").exists():
        raise SystemExit("GNU time missing: apt-get install -y time")
    base, adapter = build(args.cache)
    driver = args.driver if args.driver != "auto" else ("cli" if cli_has_merge() else "direct")
    work = args.work or args.cache / "run"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    want = set(args.tools.split(",")) if args.tools else None
    busy_before = others_running()
    results = []
    outs = {}
    for tool, argv in tools(base, adapter, driver).items():
        if want and tool not in want:
            continue
        out = work / re.sub(r"[^a-z0-9]+", "_", tool.lower()).strip("_")
        makes = tool != "import torch"
        print(f"[bench] {tool} ...", file=sys.stderr, flush=True)
        if args.warmup:
            run_once(argv, out, env, [base, adapter], makes)
        runs = [run_once(argv, out, env, [base, adapter], makes) for _ in range(args.runs)]
        results.append({"tool": tool, "runs": runs})
        outs[tool] = out
        print(
            f"[bench]   wall {statistics.median(r['wall'] for r in runs):.2f}s  rss {max(r['rss_mb'] for r in runs):.0f} MB",
            file=sys.stderr,
        )
    same = {}
    for tool, out in outs.items():
        if tool.startswith("ours") and "peft" in outs:
            same[tool] = compare(out, outs["peft"])
    busy_after = others_running()
    shutil.rmtree(work, ignore_errors=True)
    md = render(results, machine(), args.runs, driver, same, _du(base), busy_before + busy_after)
    print(md)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "merge.md").write_text(md)
    (OUT / "merge.json").write_text(json.dumps(results, indent=1))


def _med(r: dict, key: str) -> float:
    return statistics.median(x[key] for x in r["runs"])


def render(results: list[dict], mach: dict, runs: int, driver: str, same: dict, size: int, busy: list[str]) -> str:
    L = [
        "# ckpt-tui export --merge vs PEFT merge_and_unload",
        "",
        f"Machine: {mach['nproc']} CPUs ({mach['cpu']}), {mach['ram_gb']} GB RAM; Python {mach['python']}, "
        f"torch {mach['torch']}, transformers {mach['transformers']}, peft {mach['peft']}; load average at the end "
        f"{', '.join(f'{x:.2f}' for x in mach['load'])}.",
        f"Base: random bf16 Llama, {size / 1e9:.2f} GB (hidden 2048, intermediate 5632, 8 layers, vocab 32000); "
        f"LoRA r={RANK}, alpha={ALPHA} on {', '.join(TARGETS)}. ours = "
        + {
            "cli": "`ckpt-tui export ADAPTER --merge --base BASE`",
            "direct": "merged_tensor + write_file driven by a script",
            "both": "`ckpt-tui export ADAPTER --merge --base BASE`, and (direct) merged_tensor + write_file",
        }[driver]
        + f". Median of {runs} run(s), page cache warm, whole processes, imports included.",
        "",
        "| tool | wall s | +flush s | peak RSS MB | RSS above import torch | wall / PEFT | +flush / PEFT | output |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    by = {r["tool"]: r for r in results}
    peft, floor = by.get("peft"), by.get("import torch")
    for r in results:
        rss = max(x["rss_mb"] for x in r["runs"])
        above = f"{rss - max(x['rss_mb'] for x in floor['runs']):+.0f} MB" if floor else "–"
        wr = f"{_med(r, 'wall') / _med(peft, 'wall'):.2f}×" if peft else "–"
        fr = f"{_med(r, 'flush') / _med(peft, 'flush'):.2f}×" if peft else "–"
        L.append(
            f"| {r['tool']} | {_med(r, 'wall'):.2f} | {_med(r, 'flush'):.2f} | {rss:.0f} | {above} | {wr} | {fr} | "
            f"{r['runs'][0]['out_bytes'] / 1e9:.2f} GB |"
        )
    L += ["", "Outputs against PEFT's:", ""] + [f"- {t}: {s}" for t, s in same.items()]
    L += ["", "Targets (issue 23):", ""]
    for tool in [t for t in by if t.startswith("ours")]:
        o = by[tool]
        if peft:
            ratio = _med(o, "wall") / _med(peft, "wall")
            L.append(f"- {tool}: wall / PEFT = {ratio:.2f} (target ≤ 0.5) {'PASS' if ratio <= 0.5 else 'MISS'}")
        if floor:
            above = max(x["rss_mb"] for x in o["runs"]) - max(x["rss_mb"] for x in floor["runs"])
            L.append(
                f"- {tool}: peak RSS {above:+.0f} MB above import torch (target ≤ 100) {'PASS' if above <= 100 else 'MISS'}"
            )
    L += ["", "Also running on the machine (ps, ≥ 5% CPU, before and after):", ""]
    L += [f"- {b}" for b in dict.fromkeys(busy)] or ["- nothing"]
    L += ["", "Raw runs (wall s / +flush s / RSS MB):", ""]
    for r in results:
        L.append(
            f"- {r['tool']}: " + ", ".join(f"{x['wall']:.2f}/{x['flush']:.2f}/{x['rss_mb']:.0f}" for x in r["runs"])
        )
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
