"""`ckpt-tui demo`: build a real demo run once (torch FSDP and DeepSpeed on 2 CPU ranks) and open it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from .inspect import run_tui
from .output import fail, inspect_or_fail, print_report


@click.command("demo", short_help="Build a real demo run once, then open it.")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Build it here instead of ~/.cache/ckpt-tui/demo.",
)
@click.option("--no-open", is_flag=True, help="Print the inspection instead of opening the TUI.")
@click.option("--rebuild", is_flag=True, help="Build it again even if it is already there.")
@click.option("--clean", is_flag=True, help="Remove the demo folder and stop.")
@click.pass_context
def demo_cmd(ctx, out, no_open, rebuild, clean):
    """Build a small but real training run that shows both problems of the
    user reports, then open it in the terminal UI.

    \b
    Two runs, trained and saved on 2 CPU ranks by the real frameworks:
      fsdp-trainer-run/checkpoint-20/  HF-Trainer-style FSDP save: model
        and optimizer in DCP sub-folders (so `accelerate merge-weights
        checkpoint-20` fails with `.metadata` missing)
      deepspeed-zero2/  DeepSpeed ZeRO-2 bf16 without
        universal_checkpoint_info (so ds_to_universal asserts)

    The first run builds it in ~/.cache/ckpt-tui/demo (about 15 s on 2 cores);
    later runs reuse it. `ckpt-tui demo --clean` removes it.
    """
    import shutil
    import time

    from ..core.present import naturalsize
    from ..core.userdirs import demo_dir, log_file
    from ..samples import STEP_PREFIX, build_demo, demo_is_built, demo_stamp

    target = Path(out) if out else demo_dir()
    if clean:
        if not target.exists():
            click.echo(f"Nothing to remove: {target} does not exist.", err=True)
            sys.exit(EXIT_OK)
        if not demo_stamp(target).exists():
            fail(f"{target} is not a ckpt-tui demo folder; not removing it", EXIT_USAGE)
        size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
        shutil.rmtree(target)
        demo_stamp(target).unlink()
        click.echo(f"Removed the demo run {target} ({naturalsize(size)}).", err=True)
        sys.exit(EXIT_OK)

    if demo_is_built(target) and not rebuild:
        click.echo(f"Using the demo run built earlier in {target} (`ckpt-tui demo --clean` removes it).", err=True)
    else:
        t0 = time.monotonic()

        def step(msg: str) -> None:
            click.echo(f"  {time.monotonic() - t0:5.1f} s  {msg}", err=True)

        click.echo(
            f"Building the demo run in {target}: real torch FSDP and DeepSpeed training on 2 CPU ranks, "
            "once (later runs reuse it).",
            err=True,
        )
        step("starting 2 ranks with torchrun (each imports torch and DeepSpeed)")
        log = log_file("demo")
        with open(log, "w", encoding="utf-8") as lf:

            def on_line(line: str) -> None:  # the frameworks' chatter goes to the log, our steps to the user
                lf.write(line + "\n")
                if line.startswith(STEP_PREFIX):
                    step(line[len(STEP_PREFIX) :])

            try:
                build_demo(target, on_line=on_line)
            except FileExistsError as e:  # not ours: nothing was built, nothing to log
                log.unlink()
                fail(str(e), EXIT_USAGE)
            except Exception as e:  # the generator failed: say why, no traceback
                lf.flush()
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                fail(f"could not build the demo: {first}; the full log is in {log}", EXIT_FINDINGS)
        log.unlink()
        step(f"done: {target}")
    if not no_open and sys.stdout.isatty() and sys.stdin.isatty():
        sys.exit(run_tui(ctx, target))
    for sub in sorted(p for p in target.iterdir() if p.is_dir()):
        click.echo("")
        rep = inspect_or_fail(str(sub), False)
        print_report(rep, False)
    sys.exit(EXIT_OK)
