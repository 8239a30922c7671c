"""Issue 28's benchmark: a run folder of 200 HF Trainer checkpoints opened by `ckpt-tui inspect RUN` and by the
TUI's run view, in under 1 s beyond start-up.

The synthetic run (made once under --dir, default /tmp/ckpt-tui-bench/run200):
- 200 HF Trainer checkpoints, checkpoint-100 … checkpoint-20000 (save_steps 100), one process (rank 0 only):
  model.safetensors (a 2-layer model's header and data: 8 tensors of 256x256 fp32, 2 MB), optimizer.pt
  (torch.save of an Adam state for them), scheduler.pt, rng_state.pth, config.json, trainer_state.json;
- each trainer_state.json holds the history up to its step: logging_steps 10 and eval_steps 100, so the newest
  checkpoint's log_history has 2,000 train entries (loss, grad_norm, learning_rate) and 200 eval entries (eval_loss).

Measured (median of --repeat runs): `ckpt-tui inspect RUN --json` and `ckpt-tui inspect RUN` minus
`ckpt-tui --version` (start-up), and in-process: the scan (core.report.inspect) and the run view (core.run_view)
apart, and the TUI from start until the run view's table is filled (App.run_test).

The TUI's start-up is its first paint, as in bench/tui_bench.py: `ckpt-tui RUN` in tmux (120x40), `capture-pane`
every 20 ms: process start to anything drawn, to the run table's newest row drawn, to the chart drawn; the figure is
table minus first paint, both in the same run. In process, the TUI is polled every 20 ms with `asyncio.sleep` (as
tui_bench's `until`), not `Pilot.pause`: a pause makes every widget process its queue and the screen repaint, which
takes the GIL from the scan's thread (the previous figure's method, still printed for comparison). On a loaded
machine every wake-up of the UI thread costs the scan a GIL hand-over to a thread that may wait for a core: compare
figures from a quiet machine only.

    python bench/run_view_bench.py [--dir D] [--repeat 5]

Run it on a quiet machine (`uptime` load under 1.5): the figure goes in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHECKPOINTS = 200
SAVE_STEPS = 100
LOGGING_STEPS = 10


def make_run(run: Path) -> Path:
    if (run / f"checkpoint-{CHECKPOINTS * SAVE_STEPS}" / "trainer_state.json").exists():
        return run
    import torch
    from safetensors.torch import save_file

    run.mkdir(parents=True, exist_ok=True)
    weights = {f"model.layers.{i}.w{j}.weight": torch.randn(256, 256) for i in range(2) for j in range(4)}
    params = list(weights.values())
    opt = torch.optim.Adam(params)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    sched = torch.optim.lr_scheduler.LinearLR(opt)
    history: list[dict] = []
    for k in range(1, CHECKPOINTS + 1):
        step = k * SAVE_STEPS
        for s in range(step - SAVE_STEPS + LOGGING_STEPS, step + 1, LOGGING_STEPS):
            history.append(
                {
                    "epoch": s / 1000,
                    "grad_norm": 1.0,
                    "learning_rate": 1e-3 * (1 - s / 25000),
                    "loss": 5 / (1 + s / 1000),
                    "step": s,
                }
            )
        history.append({"epoch": step / 1000, "eval_loss": 5.2 / (1 + step / 1000), "eval_runtime": 1.0, "step": step})
        ck = run / f"checkpoint-{step}"
        ck.mkdir(exist_ok=True)
        save_file(weights, ck / "model.safetensors", metadata={"format": "pt"})
        torch.save(opt.state_dict(), ck / "optimizer.pt")
        torch.save(sched.state_dict(), ck / "scheduler.pt")
        torch.save({"python": 0, "numpy": 0, "cpu": torch.get_rng_state()}, ck / "rng_state.pth")
        (ck / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
        state = {
            "best_global_step": None,
            "best_metric": None,
            "best_model_checkpoint": None,
            "global_step": step,
            "logging_steps": LOGGING_STEPS,
            "eval_steps": SAVE_STEPS,
            "save_steps": SAVE_STEPS,
            "log_history": history,
        }
        (ck / "trainer_state.json").write_text(json.dumps(state, indent=2))  # the Trainer writes it indented
    return run


def cli(*args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ckpt_tui", *args], env=env, capture_output=True, check=False)
    return time.perf_counter() - t0


async def tui_seconds(run: Path, pilot_pause: bool = False) -> tuple[float, float]:
    """In process (App.run_test at 120x40): seconds from make_app until the run view's table is filled, and until its
    chart is given the history. Polled with asyncio.sleep (``pilot_pause``: with Pilot.pause(0.01), as before)."""
    from ckpt_tui.ui.app import make_app
    from ckpt_tui.ui.widgets.run_view import RunPanel

    t0 = time.perf_counter()
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:

        async def until(cond) -> float:
            while not cond():
                await (pilot.pause(0.01) if pilot_pause else asyncio.sleep(0.02))
            return time.perf_counter() - t0

        filled = await until(lambda: app.report is not None and app.main.query_one("#run-table").row_count)
        drawn = await until(lambda: app.main.query_one(RunPanel).drawn)
        return filled, drawn


def tmux_seconds(run: Path, repeat: int) -> Optional[dict[str, float]]:
    """`ckpt-tui RUN` in tmux at 120x40, capture-pane every 20 ms: medians of process start to anything drawn (the
    first paint), to the run table's newest row, to the chart's frame. None without tmux."""
    if shutil.which("tmux") is None:
        return None
    sock = f"ckpt-tui-run-view-bench-{os.getpid()}"
    newest = f"●{CHECKPOINTS * SAVE_STEPS}"
    marks = {"any": lambda s: bool(s.strip()), "table": lambda s: newest in s, "chart": lambda s: "┌" in s}
    runs: dict[str, list[float]] = {k: [] for k in marks}
    env = f"PYTHONPATH={ROOT}"
    try:
        for i in range(repeat):
            cmd = f"cd {ROOT} && {env} exec {sys.executable} -m ckpt_tui {run}"
            t0 = time.perf_counter()
            subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-s", f"r{i}", "-x", "120", "-y", "40", cmd])
            seen: dict[str, float] = {}
            while len(seen) < len(marks) and time.perf_counter() - t0 < 60:
                pane = subprocess.run(
                    ["tmux", "-L", sock, "capture-pane", "-p", "-t", f"r{i}"], capture_output=True, text=True
                ).stdout
                now = time.perf_counter() - t0
                for k, cond in marks.items():
                    if k not in seen and cond(pane):
                        seen[k] = now
                time.sleep(0.02)
            subprocess.run(["tmux", "-L", sock, "kill-session", "-t", f"r{i}"], capture_output=True)
            if len(seen) < len(marks):
                raise RuntimeError(f"tmux run {i}: saw only {sorted(seen)}; screen:\n{pane}")
            for k, v in seen.items():
                runs[k].append(v)
            time.sleep(0.3)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    return {k: statistics.median(v) for k, v in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckpt-tui-bench/run200"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    run = make_run(a.dir)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    start = med([cli("--version") for _ in range(a.repeat)])
    as_json = med([cli("inspect", str(run), "--json") for _ in range(a.repeat)])
    text = med([cli("inspect", str(run)) for _ in range(a.repeat)])

    from ckpt_tui.core.report import inspect

    scans, views = [], []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        rep = inspect(run)
        t1 = time.perf_counter()
        view = rep.run_view()
        views.append(time.perf_counter() - t1)
        scans.append(t1 - t0)
    assert len(view.rows) == CHECKPOINTS and len(view.series["loss"]) == CHECKPOINTS * SAVE_STEPS // LOGGING_STEPS
    asyncio.run(tui_seconds(run))  # imports textual and the app once: a user's process imports them before it paints
    tuis = [asyncio.run(tui_seconds(run)) for _ in range(a.repeat)]
    tui, drawn = med([t[0] for t in tuis]), med([t[1] for t in tuis])
    before = med([asyncio.run(tui_seconds(run, pilot_pause=True))[0] for _ in range(a.repeat)])
    tm = tmux_seconds(run, a.repeat)
    print(
        f"synthetic run: {CHECKPOINTS} HF Trainer checkpoints, 1 rank, newest log_history {len(view.series['loss'])} train + {CHECKPOINTS} eval entries"
    )
    print(f"start-up (--version)            {start:.3f} s")
    print(f"inspect RUN --json              {as_json:.3f} s  ({as_json - start:.3f} s beyond start-up)")
    print(f"inspect RUN (text)              {text:.3f} s  ({text - start:.3f} s beyond start-up)")
    print(f"in-process scan / run view      {med(scans):.3f} s / {med(views):.3f} s")
    print(f"TUI in process: start to run view filled / chart given the history   {tui:.3f} s / {drawn:.3f} s")
    print(f"TUI in process, polled with Pilot.pause(0.01) (the previous method)    {before:.3f} s")
    if tm is None:
        print("TUI in tmux: no tmux here")
    else:
        print(
            f"TUI in tmux 120x40: first paint {tm['any']:.3f} s, run table {tm['table']:.3f} s, chart {tm['chart']:.3f} s"
            f"  ({tm['table'] - tm['any']:.3f} s beyond start-up)"
        )


if __name__ == "__main__":
    main()
