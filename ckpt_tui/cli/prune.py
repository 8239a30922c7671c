"""`ckpt-tui prune RUN`: the plan first (every path, the bytes it frees), then exactly the plan (--yes)."""

from __future__ import annotations

import os
import sys

import click

from ..core.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .options import json_option, path_argument
from .output import echo, emit_json, fail, local_only


@click.command("prune", short_help="Free a run folder's disk: the plan first.")
@path_argument("run")
@click.option(
    "--keep-last",
    default=1,
    show_default=True,
    metavar="N",
    type=click.IntRange(min=1),
    help="Keep the N newest complete checkpoints untouched.",
)
@click.option(
    "--what",
    type=click.Choice(["optimizer", "checkpoint"]),
    default="optimizer",
    show_default=True,
    help="optimizer: only optimizer/scheduler/RNG files whose loss leaves the weights intact; "
    "checkpoint: whole checkpoint folders.",
)
@click.option("--no-keep-best", is_flag=True, help="Do not keep the best checkpoint (trainer_state.json) whole.")
@click.option("--yes", "-y", is_flag=True, help="Remove exactly the plan (without it: print the plan, change nothing).")
@click.option(
    "--quiet-for",
    default=60.0,
    show_default=True,
    metavar="S",
    type=click.FloatRange(min=0),
    help="Refuse when any file of the run was modified in the last S seconds.",
)
@click.option("--force", is_flag=True, help="Prune even though files were modified in the last --quiet-for seconds.")
@json_option("One JSON document (schema_version 1): the plan, and with --yes what was removed.")
def prune_cmd(run, keep_last, what, no_keep_best, yes, quiet_for, force, as_json):
    """Free the disk a training run's folder takes: remove the optimizer states of old checkpoints
    (--what optimizer, the default) or old checkpoints whole (--what checkpoint).

    It always keeps the newest complete checkpoint, the one `latest` names, and the best
    (unless --no-keep-best), and the last --keep-last N complete ones. Without --yes it
    changes nothing and prints every path it would remove and the bytes that frees, by
    checkpoint. With --yes it removes exactly that plan, checking each path again first
    (never through a symbolic link, never outside RUN). Each checkpoint gets a marker
    (.ckpt-tui-prune.json, see docs/prune.md) before anything goes from it, so a prune
    killed halfway leaves a checkpoint inspect reports as half pruned, and the next prune
    finishes it. Ctrl-C stops it before its next removal and says what is left.

    \b
    Examples:
      ckpt-tui prune output_dir                      the plan
      ckpt-tui prune output_dir --keep-last 2 --yes  apply it
      ckpt-tui prune output_dir --what checkpoint    whole old checkpoints

    Exit codes: 0 ok, 1 a checkpoint was refused (the reason is printed) or a removal failed,
    or the run is not quiet, 2 bad path or usage, 130 interrupted.
    """
    local_only(run, "prune")
    from pathlib import Path

    from ..core.prune import PruneError, plan, require_quiet
    from ..core.report import inspect
    from ..core.scan import ScanError
    from ..core.units import naturalsize

    try:
        if os.path.islink(run) or not os.path.isdir(run):
            raise PruneError(f"{run} is not a folder (a symbolic link is never followed): name the run folder")
        p = plan(Path(run), inspect(run), what=what, keep_last=keep_last, keep_best=not no_keep_best)
    except (PruneError, ScanError) as e:
        fail(str(e), EXIT_USAGE)
    if yes and p.checkpoints and not force:
        try:  # before the plan is printed as "Removing": a run still being written is refused first
            require_quiet(Path(p.run), quiet_for)
        except PruneError as e:
            fail(str(e), EXIT_FINDINGS)
    if not as_json:
        _print_plan(p, yes, naturalsize)
    res = None
    if yes and p.checkpoints:
        res = _apply(p, quiet_for, force, as_json, naturalsize)
    failed = bool(p.refused) or bool(res and res.failed)
    if as_json:
        doc = {"plan": p.to_json(), "applied": res is not None}
        if res is not None:
            doc.update(res.to_json())
        emit_json(doc, ensure_ascii=False)
    elif res is not None:
        for path, why in res.failed:
            echo(f"ckpt-tui: {path}: {why}", err=True)
        echo(f"Removed {len(res.removed)} path(s), freed {naturalsize(res.bytes_freed)}.")
    sys.exit(EXIT_FINDINGS if failed else EXIT_OK)


def _apply(p, quiet_for: float, force: bool, as_json: bool, naturalsize):
    """core.prune.apply with a progress bar on stderr (bytes, rate, time left). The first Ctrl-C (SIGINT) sets the
    cancel token: the prune stops before its next removal, says what went and what is left, and exits 130; a
    second Ctrl-C stops it at once (its checkpoint stays marked, as after a kill)."""
    import signal
    import threading

    from ..core.prune import PruneCancelled, PruneError, apply
    from ..core.types import shell_path
    from .output import progress_bar

    cancel = threading.Event()

    def on_sigint(signum, frame):
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, on_sigint) if main_thread else None
    try:
        with progress_bar(as_json, "bytes") as bar:
            task = bar.add_task("removing", total=p.bytes or None)

            def on_progress(pr):
                bar.update(task, completed=pr.done, total=pr.total or None)

            return apply(p, quiet_for=quiet_for, force=force, on_progress=on_progress, cancel=cancel)
    except PruneError as e:
        fail(str(e), EXIT_FINDINGS)
    except PruneCancelled as e:
        done = f"removed {len(e.result.removed)} path(s), freed {naturalsize(e.result.bytes_freed)}"
        left = (
            f"`{e.marked}/` is marked half pruned (its marker lists what is left): "
            f"`ckpt-tui prune {shell_path(str(p.run))} --yes` finishes it (with --force within a minute: this "
            "prune's own removals are recent writes)"
            if e.marked
            else "every checkpoint is untouched or finished"
        )
        fail(f"interrupted: {done}; {left}", EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        fail(
            "interrupted: the checkpoint being pruned is marked half pruned; run the prune again to finish it",
            EXIT_INTERRUPTED,
        )
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, before)


def _print_plan(p, yes: bool, naturalsize) -> None:
    verb = "Removing" if yes else "Would remove"
    if not p.checkpoints:
        echo(f"Nothing to prune in {p.run} (--what {p.what}).")
    for c in p.checkpoints:
        echo(f"{c.path}/  step {c.step}: {verb.lower()} {naturalsize(c.bytes)}" + (f"  ({c.note})" if c.note else ""))
        for e in c.entries:
            tail = "/" if e.kind == "dir" else " (link; its target untouched)" if e.kind == "link" else ""
            note = f"  ({e.link_note()})" if e.link_note() else ""
            echo(f"  {e.path}{tail}  {naturalsize(e.bytes)}{note}")

    def shown(path: str) -> str:  # a folder with its slash; a Lightning .ckpt file without
        return path if os.path.isfile(os.path.join(p.run, path)) else f"{path}/"

    for path, why in p.kept:
        echo(f"keep {shown(path)}: {why}")
    for path, why in p.skipped:
        echo(f"skip {shown(path)}: {why}")
    for path, why in p.refused:
        echo(f"ckpt-tui: refused {shown(path)}: {why}", err=True)
    if p.checkpoints:
        echo(f"{verb} {sum(len(c.entries) for c in p.checkpoints)} path(s), {naturalsize(p.bytes)} in all.")
        if not yes:
            echo("Nothing was changed: pass --yes to remove exactly this.")
