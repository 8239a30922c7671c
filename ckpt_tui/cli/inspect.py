"""`ckpt-tui inspect`, `open` (the TUI, the default command) and `tensors`: reading a checkpoint."""

from __future__ import annotations

import os
import sys

import click

from ..core.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from ..core.storage import StorageError, check, is_url
from .options import TRUST_PICKLES_HELP, json_option, path_argument, trust_pickles_option
from .output import echo, emit_json, fail, inspect_or_fail, print_report


@click.command("inspect", short_help="Say what a checkpoint is and what is wrong with it.")
@path_argument(default=".")
@json_option("Print one JSON document (schema_version 1) instead of a tree.")
@trust_pickles_option(TRUST_PICKLES_HELP)
@click.option("--all", "show_all", is_flag=True, help="Show every file, not a condensed tree.")
@click.option(
    "--best-metric",
    metavar="NAME",
    default=None,
    help="A run folder's best checkpoint: the one with the best NAME (an eval metric of log_history, "
    "eval_ prefixed as the Trainer does) at its step, not the one the run recorded.",
)
@click.option(
    "--higher-is-better",
    is_flag=True,
    default=None,
    help="With --best-metric: higher is better (default: lower; the run's own greater_is_better for its own metric).",
)
def inspect_cmd(path, as_json, trust_pickles, show_all, best_metric, higher_is_better):
    """Say what PATH is: layout, framework, ranks, dtype, sizes, and what is broken.

    PATH may be a checkpoint folder (checkpoint-2000/), a run folder holding many, a
    single sub-folder (pytorch_model_fsdp_0/, global_step2000/) or one file.
    """
    if higher_is_better and not best_metric:
        fail("--higher-is-better goes with --best-metric NAME", EXIT_USAGE)
    rep = inspect_or_fail(path, trust_pickles)
    view = None
    if rep.inventory.checkpoints:
        view = rep.run_view(best_metric=best_metric, higher_is_better=higher_is_better)
    if as_json:
        emit_json(rep.to_json(view), ensure_ascii=False)
    else:
        print_report(rep, show_all, view)
    sys.exit(EXIT_FINDINGS if rep.has_errors else EXIT_OK)


@click.command("open", short_help="Open a checkpoint in the terminal UI (the default).")
@path_argument(default=".")
@trust_pickles_option()
@click.option("--print", "print_only", is_flag=True, help="Print the inspection instead of opening the TUI.")
@click.pass_context
def open_cmd(ctx, path, trust_pickles, print_only):
    """Open PATH in the terminal UI (the default command: `ckpt-tui PATH`).

    Without a terminal (piped output, CI), prints the inspection instead.
    """
    if print_only or not (sys.stdout.isatty() and sys.stdin.isatty()):
        rep = inspect_or_fail(path, trust_pickles)
        print_report(rep, False)
        sys.exit(EXIT_FINDINGS if rep.has_errors else EXIT_OK)

    if is_url(path):  # a wrong bucket, no credentials, no endpoint: one line before the TUI starts
        try:
            check(path)
        except StorageError as e:
            fail(str(e), EXIT_USAGE)
    elif not os.path.exists(path):
        fail(f"{path}: no such file or folder", EXIT_USAGE)
    sys.exit(run_tui(ctx, path, trust_pickles=trust_pickles))


def run_tui(ctx, path, **kw) -> int:
    """Run the Textual app on ``path``; its exit code (``--debug`` of the main group shows tracebacks)."""
    from ..ui.app import make_app
    from ..ui.run import run_app

    return run_app(make_app(path, **kw), debug=bool(ctx.find_root().obj.get("debug")))


@click.command("tensors", short_help="List every tensor: name, shape, dtype, size.")
@path_argument()
@json_option("One JSON document with every tensor.")
@click.option("--limit", type=int, default=0, help="Show at most N tensors (0: all).")
@click.option(
    "--component",
    type=click.Choice(["model", "optimizer"]),
    default="model",
    show_default=True,
    help="The model's tensors as export writes them, or the optimizer state's entries.",
)
@click.option("--stored", is_flag=True, help="Every entry under its stored key (a DCP's optimizer state too).")
def tensors_cmd(path, as_json, limit, component, stored):
    """List every tensor of a component (name, shape, dtype, bytes) from its headers.

    The dtype is the one `export --dtype keep` writes; a tensor stored narrower (a frozen bf16
    parameter of a DeepSpeed run, which has no fp32 master) says what it is upcast from.

    PATH is a checkpoint folder (its model component is listed; a run folder: its newest
    checkpoint's) or a component: a DCP folder, a DeepSpeed tag folder (the fp32 weights an export
    rebuilds), a universal checkpoint, a safetensors file or index, a torch file, a DeepSpeed
    model-states file (its module) or optim-states file (that rank's fp32 partitions, exp_avg,
    exp_avg_sq).

    The model is listed as `export` writes it: a DCP saved with its optimizer lists the model's
    tensors under their exported names (`--stored`: every entry as stored); `--component
    optimizer` lists the optimizer state's entries.
    """
    from ..core.formats import FormatError
    from ..core.present import naturalsize, shape_text, short_dtype
    from ..core.tensors import list_optimizer_tensors, list_tensors, listable, optimizer_listable

    rep = inspect_or_fail(path, False)
    inv = rep.inventory
    if component == "optimizer":
        node, note = optimizer_listable(inv, inv.root)
        if node is None:
            fail(f"{inv.shown()} holds no optimizer state ckpt-tui can list ({inv.summary})", EXIT_FINDINGS)
        listing = list_optimizer_tensors(node, inv.parsed)
    else:
        node, note = listable(inv, inv.root)  # what the TUI's tensor table shows for the same node
        listing = list_tensors(node, inv.parsed, stored=stored) if node is not None else iter(())
    if node is None:
        echo(f"ckpt-tui: {note or f'{inv.shown()} holds no tensors ckpt-tui can list ({inv.summary})'}", err=True)
    elif note:
        echo(f"ckpt-tui: listing {note}", err=True)
    rows = []
    try:
        for i, t in enumerate(listing):
            if limit and i >= limit:
                break
            rows.append(t)
    except FormatError as e:
        fail(f"{inv.shown(node.path)}: {e}", EXIT_FINDINGS)
    node = node or inv.root
    if as_json:
        emit_json({"path": str(node.abspath), "tensors": [t.to_json() for t in rows]}, indent=1)
        sys.exit(EXIT_OK)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ..core.safetext import visible

    table = Table(box=None, pad_edge=False)
    for col in ("name", "shape", "dtype", "size"):
        table.add_column(col, justify="right" if col == "size" else "left", overflow="fold")
    from ..core.whole import empty_weights

    empty = empty_weights(node, inv)  # saved without gathering: its empty rows marked, and why said after them
    for t in rows:
        dtype = f"{t.dtype} (upcast from {short_dtype(t.upcast_from)})" if t.upcast_from else t.dtype
        shape = Text(visible(shape_text(t.shape)))
        if empty and not t.numel:
            shape = Text(f"✖ {shape_text(t.shape)}", style="bold red")
        # every cell from the header as a Text: a str cell is Rich markup
        table.add_row(Text(visible(t.name)), shape, Text(visible(dtype)), naturalsize(t.nbytes))
    console = Console(soft_wrap=False)
    console.print(table)
    total = sum(t.nbytes for t in rows)
    click.echo(f"{len(rows)} tensors, {sum(t.numel for t in rows):,} elements, {naturalsize(total)}")
    if empty:
        console.print(
            Text(
                f"✖ weights-empty: {visible(inv.shown(node.path))} {empty}; `ckpt-tui inspect {inv.shown()}` "
                "says why and where the weights are",
                style="bold red",
            )
        )
    upcast = [t for t in rows if t.upcast_from]
    if upcast:
        echo(
            f"{len(upcast)} frozen tensor(s) have no fp32 master: listed in the dtype an export writes with "
            f"--dtype keep, upcast from the {short_dtype(upcast[0].upcast_from)} they are stored in"
        )
    sys.exit(EXIT_OK)
