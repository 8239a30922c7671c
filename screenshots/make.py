"""Regenerate the screenshots of the README and docs/tui.md by driving the real app on real fixture checkpoints.

    python screenshots/make.py            # writes screenshots/*.svg (and /tmp/ckpt-tui-shots/png/*.png)
    python screenshots/make.py --size 120x40   # docs/tui.md's wide set, in screenshots/120x40/
    python screenshots/make.py --size 100x30   # a trial at another size, under /tmp/ckpt-tui-shots/100x30

The checkpoints are copied to fixed, readable paths under /tmp/ckpt-tui-shots so the pictures
show the user reports' names; ProgressBars run on a MockClock so the bars are stable.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from textual.clock import MockClock  # noqa: E402

from ckpt_tui.ui.app import make_app  # noqa: E402
from tests.fixtures import fixture_path  # noqa: E402

BASE = Path("/tmp/ckpt-tui-shots")
SIZE = (80, 24)  # the target terminal; `--size 100x30` to try another
if "--size" in sys.argv:
    SIZE = tuple(int(v) for v in sys.argv[sys.argv.index("--size") + 1].split("x"))  # type: ignore[assignment]
# 80x24 (the target) in screenshots/, 120x40 (a common SSH window) in screenshots/120x40/, others in /tmp
HERE_OUT = (
    HERE
    if SIZE == (80, 24)
    else (HERE / "120x40" if SIZE == (120, 40) else Path(f"/tmp/ckpt-tui-shots/{SIZE[0]}x{SIZE[1]}"))
)


def fresh_copy(src: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest, symlinks=True)
    return dest


def big_checkpoint(dest: Path, gib: float = 1.0) -> Path:
    """A ~1 GB HF-style torch checkpoint (pytorch_model.bin), written once and reused."""
    from ckpt_tui.samples import big_torch_checkpoint

    return big_torch_checkpoint(dest, gib)


async def wait_for(pilot, cond, timeout=60.0, step=0.05):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("timed out waiting")
        await pilot.pause(step)


def save(app, name: str) -> Path:
    HERE_OUT.mkdir(parents=True, exist_ok=True)
    out = HERE_OUT / f"{name}.svg"
    out.write_text(app.export_screenshot(title=f"ckpt-tui — {name}"))
    print(f"wrote {out}")
    return out


async def shot_main_and_wizard(ckpt: Path) -> None:
    from ckpt_tui.ui.screens.wizards import ExportWizard

    app = make_app(ckpt, clock=MockClock())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        from ckpt_tui.ui.widgets.details import TensorTable

        await wait_for(pilot, lambda: len(app.query_one(TensorTable).rows) > 0)
        await pilot.pause(0.2)
        save(app, "main")

        out = ckpt.parent / f"{ckpt.name}-safetensors"
        if out.exists():
            shutil.rmtree(out)
        await pilot.press("e")
        assert isinstance(app.screen, ExportWizard), app.screen
        await pilot.press("enter", "enter", "enter", "enter")
        wiz = app.screen
        await wait_for(pilot, lambda: wiz.plan is not None)
        await pilot.pause(0.2)
        save(app, "export-wizard")


async def shot_lora(ckpt: Path) -> None:
    """A LoRA run (issue 23): the ADAPTER badge, the base in the details, the rows of q_proj and v_proj apart, and the
    export wizard's choice of the merged model or the adapter. Run from the Trainer's output folder, as a user is."""
    from ckpt_tui.ui.screens.wizards import ExportWizard
    from ckpt_tui.ui.widgets.details import TensorTable

    here = os.getcwd()
    os.chdir(ckpt.parent)
    try:
        app = make_app(Path(ckpt.name), clock=MockClock())
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.report is not None)
            await wait_for(pilot, lambda: len(app.query_one(TensorTable).rows) > 0)
            await pilot.pause(0.2)
            save(app, "lora")
            await pilot.press("e")
            assert isinstance(app.screen, ExportWizard), app.screen
            await pilot.pause(0.2)
            save(app, "lora-export-wizard")
    finally:
        os.chdir(here)


async def shot_whole(run: Path, empty: Path) -> None:
    """Issue 24: a run whose newest save was killed (its run view marks it ✖ and says why; issue 28), and
    weights saved under ZeRO-3 without gathering (each empty tensor a red ✖). From the folder holding them."""
    from ckpt_tui.ui.widgets.details import TensorTable
    from ckpt_tui.ui.widgets.run_view import RunPanel

    here = os.getcwd()
    try:
        for where, name in ((run, "incomplete-run"), (empty, "empty-weights")):
            os.chdir(where.parent)
            app = make_app(Path(where.name), clock=MockClock())
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: app.report is not None)
                if where is run:  # a run folder opens on its run view: the checkpoints' table and the loss chart
                    await wait_for(pilot, lambda: app.main.query_one("#run-table").row_count > 0)
                    await wait_for(pilot, lambda: app.main.query_one(RunPanel).drawn)  # drawn after the table
                else:
                    await wait_for(pilot, lambda: len(app.query_one(TensorTable).rows) > 0)
                await pilot.pause(0.2)
                save(app, name)
    finally:
        os.chdir(here)


async def shot_findings(ckpt: Path) -> None:
    from ckpt_tui.ui.screens.findings import FindingsScreen

    app = make_app(ckpt, clock=MockClock())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("f")
        assert isinstance(app.screen, FindingsScreen)
        table = app.screen.query_one("DataTable")
        for _ in range(table.row_count):
            if table.get_row_at(table.cursor_row)[2] == "universal-info-missing":
                break
            await pilot.press("j")
        assert table.get_row_at(table.cursor_row)[2] == "universal-info-missing"
        await pilot.pause(0.2)
        save(app, "findings")


async def shot_export_progress(ckpt: Path) -> None:
    from textual.widgets import ProgressBar

    from ckpt_tui.core.export.api import plan_export
    from ckpt_tui.ui.widgets.jobs_panel import JobRow

    out = ckpt.parent / f"{ckpt.name}-safetensors"
    if out.exists():
        shutil.rmtree(out)
    app = make_app(ckpt, clock=MockClock())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        plan, _ = plan_export(ckpt, out, max_shard_size="300MB")
        from ckpt_tui.ui.jobs import outcome

        job = app.main.run_export(plan)

        def shown():
            rows = [r for r in app.query(JobRow) if r.worker is job]
            if not rows or outcome(job) != "running":
                return None
            bars = rows[0].query(ProgressBar)
            if not bars:
                return None  # the row is not composed yet
            bar, p = bars.first(), rows[0].progress
            if not bar.total or p is None or p.label != "writing":
                return None
            return bar.progress / bar.total

        await wait_for(pilot, lambda: (shown() or 0) >= 0.35, timeout=300, step=0.02)
        frac = shown()
        svg = app.export_screenshot(title="ckpt-tui — export-progress")
        if frac is None or not 0.2 <= frac <= 0.9:
            raise RuntimeError(f"missed the window: progress {frac}")
        HERE_OUT.mkdir(parents=True, exist_ok=True)
        (HERE_OUT / "export-progress.svg").write_text(svg)
        print(f"wrote {HERE_OUT / 'export-progress.svg'} at {frac:.0%}")
        job.cancelled_event.set()
        await wait_for(pilot, lambda: outcome(job) != "running", timeout=120)


def to_png(svgs) -> None:
    if not shutil.which("rsvg-convert"):
        return
    pngdir = BASE / "png"
    pngdir.mkdir(parents=True, exist_ok=True)
    for s in svgs:
        png = pngdir / (s.stem + ("" if SIZE == (80, 24) else f"-{SIZE[0]}x{SIZE[1]}") + ".png")
        subprocess.run(["rsvg-convert", str(s), "-o", str(png)], check=True)
        print(f"  {png}")


def main() -> int:
    os.environ.setdefault("CKPT_TUI_FIXTURE_CACHE", "/tmp/fxc")
    fsdp = fresh_copy(fixture_path("hf-fsdp1") / "checkpoint-2", BASE / "run" / "checkpoint-2000")
    ds = fresh_copy(fixture_path("hf-ds-zero2") / "checkpoint-2", BASE / "deepspeed-run" / "checkpoint-3")
    big = big_checkpoint(BASE / "llama-run" / "checkpoint-500")
    lora = fresh_copy(fixture_path("peft-llama"), BASE / "lora-run") / "run" / "checkpoint-2"
    asyncio.run(shot_main_and_wizard(fsdp))
    asyncio.run(shot_findings(ds))
    asyncio.run(shot_lora(lora))
    killed = fresh_copy(fixture_path("hf-killed-save") / "run", BASE / "killed" / "run")
    empty = fresh_copy(fixture_path("zero3-ungathered") / "checkpoint-2", BASE / "zero3" / "checkpoint-2")
    asyncio.run(shot_whole(killed, empty / "model.safetensors"))
    asyncio.run(shot_export_progress(big))
    to_png(sorted(HERE_OUT.glob("*.svg")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
