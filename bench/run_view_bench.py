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

    python bench/run_view_bench.py [--dir D] [--repeat 5]

Run it on a quiet machine (`uptime` load under 1.5): the figure goes in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


async def tui_seconds(run: Path) -> float:
    from ckpt_tui.ui.app import make_app

    t0 = time.perf_counter()
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.report is None or not app.main.query_one("#run-table").row_count:
            await pilot.pause(0.01)
        return time.perf_counter() - t0


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
    tui = med([asyncio.run(tui_seconds(run)) for _ in range(a.repeat)])
    print(
        f"synthetic run: {CHECKPOINTS} HF Trainer checkpoints, 1 rank, newest log_history {len(view.series['loss'])} train + {CHECKPOINTS} eval entries"
    )
    print(f"start-up (--version)            {start:.3f} s")
    print(f"inspect RUN --json              {as_json:.3f} s  ({as_json - start:.3f} s beyond start-up)")
    print(f"inspect RUN (text)              {text:.3f} s  ({text - start:.3f} s beyond start-up)")
    print(f"in-process scan / run view      {med(scans):.3f} s / {med(views):.3f} s")
    print(f"TUI: start to run view filled   {tui:.3f} s")


if __name__ == "__main__":
    main()
