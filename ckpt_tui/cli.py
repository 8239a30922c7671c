"""Headless commands over the core. stdout, stderr and exit codes are a tested contract:

0 ok · 1 findings of severity error, or the operation failed · 2 unreadable path or bad usage ·
130 interrupted. ``--json`` prints one document with a ``schema_version``. Never a traceback
(``--debug`` shows one).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import __version__
from .cli_support import fail, run_core
from .core.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

GLYPH = {"error": "✖", "warning": "▲", "info": "●"}
COLOR = {"error": "red", "warning": "yellow", "info": "cyan"}
ROLE_BADGE = {"model": "model", "optimizer": "optim", "model+optimizer": "model+optim", "rng": "rng",
              "scheduler": "sched", "trainer-state": "state", "training-args": "args", "config": "config",
              "tokenizer": "tok", "script": "script", "data-loader": "data", "marker": "marker",
              "metadata": "meta", "shard": "shard", "scaler": "scaler", "checkpoint": "ckpt", "run": "run"}


class _Group(click.Group):
    """`ckpt-tui PATH` is `ckpt-tui open PATH`."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["open", *args]
        return super().resolve_command(ctx, args)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=_Group, context_settings=CONTEXT, invoke_without_command=True,
             subcommand_metavar="[PATH | COMMAND [ARGS]]")
@click.version_option(__version__, "--version", "-V", prog_name="ckpt-tui")
@click.option("--debug", is_flag=True, help="Show a traceback when something fails (for bug reports).")
@click.pass_context
def main_group(ctx, debug):
    """Open a distributed-training checkpoint and make it usable.

    `ckpt-tui PATH` opens PATH in the terminal UI; every command below works
    without it. `ckpt-tui help COMMAND` (or `COMMAND --help`) explains one.

    \b
    Examples:
      ckpt-tui checkpoint-2000                 browse it, fix it, export it
      ckpt-tui inspect checkpoint-2000         what it is, what is wrong
      ckpt-tui inspect checkpoint-2000 --json  the same as JSON
      ckpt-tui export checkpoint-2000 --out merged/   to safetensors
      ckpt-tui demo                            try it on a real demo run

    Reads headers and metadata only: inspecting a 1 TB checkpoint reads a few
    MB, and never runs code from a pickle (see --trust-pickles).

    Exit codes: 0 ok, 1 errors found or the operation failed, 2 unreadable path
    or bad usage, 130 interrupted.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@main_group.command("help", short_help="Show the help of ckpt-tui or of one command.")
@click.argument("command", required=False)
@click.pass_context
def help_cmd(ctx, command):
    """Show the help of ckpt-tui, or of COMMAND (the same as `ckpt-tui COMMAND --help`)."""
    group = ctx.parent.command
    if not command:
        click.echo(group.get_help(ctx.parent))
        sys.exit(EXIT_OK)
    cmd = group.get_command(ctx, command)
    if cmd is None:
        fail(f"no command {command!r}; the commands are: {', '.join(sorted(group.commands))}", EXIT_USAGE)
    sub = click.Context(cmd, info_name=command, parent=ctx.parent)
    click.echo(cmd.get_help(sub))
    sys.exit(EXIT_OK)


def _report(path: str, trust: bool):
    from .core.inspect import inspect
    from .core.scan import ScanError

    try:
        return inspect(path, trust_pickles=trust)
    except ScanError as e:
        fail(str(e), EXIT_USAGE)


@main_group.command("inspect", short_help="Say what a checkpoint is and what is wrong with it.")
@click.argument("path", type=click.Path(path_type=str, readable=False), default=".")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema_version 1) instead of a tree.")
@click.option("--trust-pickles", is_flag=True,
              help="Treat pickles that name code outside the allowlist as trusted (info, not error). "
                   "Only for checkpoints whose origin you trust.")
@click.option("--all", "show_all", is_flag=True, help="Show every file, not a condensed tree.")
def inspect_cmd(path, as_json, trust_pickles, show_all):
    """Say what PATH is: layout, framework, ranks, dtype, sizes, and what is broken.

    PATH may be a checkpoint folder (checkpoint-2000/), a run folder holding many, a
    single sub-folder (pytorch_model_fsdp_0/, global_step2000/) or one file.
    """
    rep = _report(path, trust_pickles)
    if as_json:
        click.echo(json.dumps(rep.to_json(), indent=2, ensure_ascii=False))
    else:
        _print_report(rep, show_all)
    sys.exit(EXIT_FINDINGS if rep.has_errors else EXIT_OK)


@main_group.command("open", short_help="Open a checkpoint in the terminal UI (the default).")
@click.argument("path", type=click.Path(path_type=str, readable=False), default=".")
@click.option("--trust-pickles", is_flag=True, help="See `inspect --help`.")
@click.option("--print", "print_only", is_flag=True, help="Print the inspection instead of opening the TUI.")
@click.pass_context
def open_cmd(ctx, path, trust_pickles, print_only):
    """Open PATH in the terminal UI (the default command: `ckpt-tui PATH`).

    Without a terminal (piped output, CI), prints the inspection instead.
    """
    if print_only or not (sys.stdout.isatty() and sys.stdin.isatty()):
        rep = _report(path, trust_pickles)
        _print_report(rep, False)
        sys.exit(EXIT_FINDINGS if rep.has_errors else EXIT_OK)

    if not os.path.exists(path):
        fail(f"{path}: no such file or folder", EXIT_USAGE)
    sys.exit(_run_tui(ctx, path, trust_pickles=trust_pickles))


def _run_tui(ctx, path, **kw) -> int:
    from .ui.app import make_app
    from .ui.run import run_app

    return run_app(make_app(path, **kw), debug=bool(ctx.find_root().obj.get("debug")))


@main_group.command("tensors", short_help="List every tensor: name, shape, dtype, size.")
@click.argument("path", type=click.Path(path_type=str, readable=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON document with every tensor.")
@click.option("--limit", type=int, default=0, help="Show at most N tensors (0: all).")
def tensors_cmd(path, as_json, limit):
    """List every tensor of a component (name, shape, dtype, bytes) from its headers.

    PATH is a checkpoint folder (its model component is listed) or a component: a DCP folder,
    a DeepSpeed tag folder (the fp32 weights an export rebuilds), a safetensors file or index,
    a torch file.
    """
    from .core.formats import FormatError
    from .core.humanize_bytes import naturalsize
    from .core.tensors import list_tensors

    rep = _report(path, False)
    inv = rep.inventory
    node = inv.root
    comp = inv.model_path()
    if comp and comp != ".":
        node = inv.node(comp) or node
        click.echo(f"ckpt-tui: listing the model component `{comp}`", err=True)
    try:
        rows = []
        for i, t in enumerate(list_tensors(node, inv.parsed)):
            if limit and i >= limit:
                break
            rows.append(t)
    except FormatError as e:
        fail(f"{node.path}: {e}", EXIT_FINDINGS)
    if as_json:
        from .core.model import SCHEMA_VERSION

        click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "path": str(node.abspath),
                               "tensors": [t.to_json() for t in rows]}, indent=1))
        sys.exit(EXIT_OK)
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("name", "shape", "dtype", "size"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for t in rows:
        table.add_row(t.name, "×".join(str(d) for d in t.shape) or "scalar", t.dtype, naturalsize(t.nbytes))
    Console(soft_wrap=False).print(table)
    total = sum(t.nbytes for t in rows)
    click.echo(f"{len(rows)} tensors, {sum(t.numel for t in rows):,} elements, {naturalsize(total)}")
    sys.exit(EXIT_OK)


@main_group.command("demo", short_help="Build a real demo run once, then open it.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Build it here instead of ~/.cache/ckpt-tui/demo.")
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

    from .core.humanize_bytes import naturalsize
    from .core.userdirs import demo_dir, log_file
    from .samples import DEMO_STAMP, build_demo, demo_is_built

    target = Path(out) if out else demo_dir()
    if clean:
        if not target.exists():
            click.echo(f"Nothing to remove: {target} does not exist.", err=True)
            sys.exit(EXIT_OK)
        if not (target / DEMO_STAMP).exists():
            fail(f"{target} is not a ckpt-tui demo folder; not removing it", EXIT_USAGE)
        size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
        shutil.rmtree(target)
        click.echo(f"Removed the demo run {target} ({naturalsize(size)}).", err=True)
        sys.exit(EXIT_OK)

    if demo_is_built(target) and not rebuild:
        click.echo(f"Using the demo run built earlier in {target} "
                   "(`ckpt-tui demo --clean` removes it).", err=True)
    else:
        t0 = time.monotonic()

        def step(msg: str) -> None:
            click.echo(f"  {time.monotonic() - t0:5.1f} s  {msg}", err=True)

        click.echo(f"Building the demo run in {target}: real torch FSDP and DeepSpeed training on 2 CPU ranks, "
                   "once (later runs reuse it).", err=True)
        step("starting 2 ranks with torchrun (each imports torch and DeepSpeed)")
        log = log_file("demo")
        with open(log, "w", encoding="utf-8") as lf:
            def on_line(line: str) -> None:  # the frameworks' chatter goes to the log, our steps to the user
                lf.write(line + "\n")
                if line.startswith("[samples] "):
                    step(line[len("[samples] "):])

            try:
                build_demo(target, on_line=on_line)
            except FileExistsError as e:
                fail(str(e), EXIT_USAGE)
            except Exception as e:  # the generator failed: say why, no traceback
                lf.flush()
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                fail(f"could not build the demo: {first}; the full log is in {log}", EXIT_FINDINGS)
        log.unlink()
        step(f"done: {target}")
    if not no_open and sys.stdout.isatty() and sys.stdin.isatty():
        sys.exit(_run_tui(ctx, target))
    for sub in sorted(p for p in target.iterdir() if p.is_dir()):
        click.echo("")
        rep = _report(str(sub), False)
        _print_report(rep, False)
    sys.exit(EXIT_OK)


@main_group.command("export", short_help="Export the model weights to safetensors.")
@click.argument("src", type=click.Path(path_type=str, readable=False))
@click.option("--out", "out", required=True, type=click.Path(path_type=str, readable=False),
              help="Output folder (created; must be empty unless --overwrite).")
@click.option("--dtype", type=click.Choice(["keep", "fp32", "bf16", "fp16"]), default="keep", show_default=True,
              help="Output dtype of floating-point tensors. keep = as stored (DeepSpeed: the fp32 masters).")
@click.option("--max-shard-size", default="50GB", show_default=True,
              help="Split into model-0000k-of-0000n.safetensors + index above this size (as save_pretrained).")
@click.option("--jobs", type=int, default=1, show_default=True, help="Write output shards in N parallel threads.")
@click.option("--tag", default=None, help="DeepSpeed tag folder to export instead of the one `latest` names.")
@click.option("--exclude-frozen", is_flag=True, help="Leave out frozen parameters (DeepSpeed).")
@click.option("--strip-prefix", default=None, help="Remove this prefix from tensor names (e.g. Lightning's 'model.').")
@click.option("--config", "config", default=None, type=click.Path(path_type=str, readable=False),
              help="config.json (or a folder with config/tokenizer files) to copy into the output.")
@click.option("--dry-run", is_flag=True, help="Print the plan (files, tensors, bytes) and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output folder (atomically, at the end).")
@click.option("--no-verify", is_flag=True, help="Skip re-reading every tensor and comparing it with the source.")
@click.option("--trust-pickles", is_flag=True, help="Load pickles that name code outside the allowlist.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan or the result as one JSON document.")
def export_cmd(src, out, dtype, max_shard_size, jobs, tag, exclude_frozen, strip_prefix, config, dry_run,
               overwrite, no_verify, trust_pickles, as_json):
    """Export the model weights of SRC to safetensors in OUT, ready for
    from_pretrained.

    SRC may be the checkpoint folder (checkpoint-2000/: the model component is
    picked and named), a run folder (its newest complete checkpoint), or a
    component: a DCP folder, a DeepSpeed tag folder (fp32 weights rebuilt from
    the ZeRO partitions), a universal checkpoint, a torch file, safetensors.

    Bytes are streamed by offset with bounded memory; the output is written to
    a temp folder, fsynced and moved into place only when complete and
    verified.

    \b
    Examples:
      ckpt-tui export checkpoint-2000 --out merged/
      ckpt-tui export checkpoint-2000 --out merged/ --dtype bf16 \\
          --max-shard-size 5GB
      ckpt-tui export checkpoint-2000 --out merged/ --dry-run
    """

    from .core.export.api import plan_export
    from .core.export.plan import parse_size
    from .core.export.write import ExportError, execute
    from .core.humanize_bytes import count, naturalsize
    from .core.model import SCHEMA_VERSION
    from .core.scan import ScanError

    try:
        parse_size(max_shard_size)
    except ValueError as e:
        fail(str(e), EXIT_USAGE)
    try:
        plan, said = plan_export(src, out, dtype=dtype, max_shard_size=max_shard_size, exclude_frozen=exclude_frozen,
                                 strip_prefix=strip_prefix, config=config, tag=tag, trust_pickles=trust_pickles)
    except ScanError as e:
        fail(str(e), EXIT_USAGE)
    except (ExportError, FileNotFoundError, ValueError) as e:
        fail(str(e), EXIT_FINDINGS)
    for line in said:
        click.echo(f"ckpt-tui: {line}", err=True)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "plan": plan.to_plan().to_json()}, indent=2))
        else:
            click.echo(plan.to_plan().describe())
        sys.exit(EXIT_OK)
    res = run_core(lambda **kw: execute(plan, jobs=jobs, overwrite=overwrite, verify=not no_verify, **kw),
                   as_json=as_json, cleanup="the partial output was removed, the source is untouched")
    res.notes = said + res.notes
    if as_json:
        click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "result": res.to_json()}, indent=2))
        sys.exit(EXIT_OK)
    ver = {True: "verified ✓ (every tensor re-read and compared bit-exact)", False: "verification FAILED",
           None: "not verified (--no-verify)"}[res.verified]
    click.echo(f"Wrote {len(res.files)} file(s), {naturalsize(res.bytes)}, {res.tensors} tensors, "
               f"{count(res.params)} params to {res.out} in {res.seconds:.1f} s — {ver}")
    for n in res.notes:
        if not n.startswith("the model is") and not n.startswith("exporting the newest"):
            click.echo(f"  note: {n}")
    click.echo("Load it with:\n  from transformers import AutoModelForCausalLM\n"
               f"  model = AutoModelForCausalLM.from_pretrained({str(res.out)!r})")
    sys.exit(EXIT_OK)


@main_group.command("verify", short_help="Check an export against its source, bit-exact.")
@click.argument("out", type=click.Path(path_type=str, readable=False))
@click.option("--against", "against", required=True, type=click.Path(path_type=str, readable=False),
              help="The checkpoint OUT was exported from.")
@click.option("--strip-prefix", default=None, help="The --strip-prefix the export used.")
@click.option("--trust-pickles", is_flag=True, help="Hand files with non-allowlisted pickles to the reference loaders.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def verify_cmd(out, against, strip_prefix, trust_pickles, as_json):
    """Compare every tensor of an export with its source, bit-exact, read by an independent
    reference path (torch DCP loader, DeepSpeed zero_to_fp32, torch.load).

    The reference loaders unpickle freely, so they only get a checkpoint ckpt-tui screened.
    """
    from .core.model import SCHEMA_VERSION
    from .core.verify import verify

    res = run_core(lambda **kw: verify(out, against, trust_pickles=trust_pickles, strip_prefix=strip_prefix, **kw),
                   as_json=as_json, unit="files", label="verifying")
    if as_json:
        click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "result": res.to_json()}, indent=2))
    else:
        mark = "✓" if res.ok else "✖"
        click.echo(f"{mark} {res.compared} tensors compared with {res.reference}: "
                   f"{len(res.mismatches)} mismatched, {len(res.missing_in_output)} missing from the export")
        for n in res.mismatches[:20]:
            click.echo(f"  mismatch: {n}")
        for n in res.missing_in_output[:20]:
            click.echo(f"  missing: {n}")
        if res.not_in_reference:
            click.echo(f"  {len(res.not_in_reference)} exported tensor(s) the reference does not produce "
                       f"(e.g. {res.not_in_reference[0]}): not checked")
    sys.exit(EXIT_OK if res.ok else EXIT_FINDINGS)


@main_group.command("diff", short_help="Compare the weights of two checkpoints.")
@click.argument("a", type=click.Path(path_type=str, readable=False))
@click.argument("b", type=click.Path(path_type=str, readable=False))
@click.option("--trust-pickles", is_flag=True, help="See `inspect --help`.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def diff_cmd(a, b, trust_pickles, as_json):
    """Compare the model weights of A and B (two steps, or an export and its source): tensors only
    in A, only in B, shape/dtype changes, max |a-b| per tensor. Exit 0 if identical, 1 if not."""
    from .core.analysis import diff
    from .core.model import SCHEMA_VERSION

    res = run_core(lambda **kw: diff(a, b, trust_pickles=trust_pickles, **kw), as_json=as_json, label="comparing")
    if as_json:
        click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "result": res.to_json()}, indent=2))
    else:
        for n in res.only_a:
            click.echo(f"- only in A: {n}")
        for n in res.only_b:
            click.echo(f"+ only in B: {n}")
        for c in res.changed:
            click.echo(f"~ {c['name']}: {c['a']['dtype']}{c['a']['shape']} -> {c['b']['dtype']}{c['b']['shape']}")
        diffs = sorted(((v, k) for k, v in res.max_abs.items() if v != 0), reverse=True, key=lambda x: (x[0] == x[0], x[0]))
        for v, k in diffs[:30]:
            click.echo(f"≠ {k}: max |a-b| = {v:.6g}")
        same = sum(1 for v in res.max_abs.values() if v == 0)
        click.echo(f"{same} identical, {len(diffs)} differ, {len(res.only_a)} only in A, {len(res.only_b)} only in B, "
                   f"{len(res.changed)} shape/dtype changes")
    sys.exit(EXIT_OK if res.identical else EXIT_FINDINGS)


@main_group.command("stats", short_help="Per-tensor min/max/mean/std and NaN/Inf counts.")
@click.argument("path", type=click.Path(path_type=str, readable=False))
@click.option("--trust-pickles", is_flag=True, help="See `inspect --help`.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def stats_cmd(path, trust_pickles, as_json):
    """Per-tensor min/max/mean/std and NaN/Inf counts of the model weights, streamed with bounded
    memory — find a diverged run without loading the model. Exit 1 if any NaN/Inf."""
    from rich.console import Console
    from rich.table import Table

    from .core.analysis import stats
    from .core.model import SCHEMA_VERSION

    rows = run_core(lambda **kw: stats(path, trust_pickles=trust_pickles, **kw), as_json=as_json, label="reading")
    bad = [r for r in rows if r.nan or r.inf]
    if as_json:
        click.echo(json.dumps({"schema_version": SCHEMA_VERSION, "tensors": [r.to_json() for r in rows]}, indent=1))
    else:
        table = Table(box=None, pad_edge=False)
        for col in ("name", "dtype", "min", "max", "mean", "std", "nan", "inf"):
            table.add_column(col, justify="left" if col in ("name", "dtype") else "right")
        fmt = lambda v: "" if v is None else f"{v:.4g}"
        for r in rows:
            style = "red" if (r.nan or r.inf) else None
            table.add_row(r.name, r.dtype, fmt(r.min), fmt(r.max), fmt(r.mean), fmt(r.std), str(r.nan), str(r.inf),
                          style=style)
        Console(soft_wrap=False).print(table)
        click.echo(f"{len(rows)} tensors; {len(bad)} with NaN or Inf" + (f" (first: {bad[0].name})" if bad else ""))
    sys.exit(EXIT_FINDINGS if bad else EXIT_OK)


# ---------------------------------------------------------------- human output

def _print_report(rep, show_all: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.padding import Padding
    from rich.tree import Tree

    from .core.humanize_bytes import count, naturalsize
    from .core.dtypes import short_dtype

    inv = rep.inventory
    con = Console(highlight=False)
    by_path: dict[str, list] = {}
    for f in rep.findings:
        by_path.setdefault(f.path, []).append(f)

    def label(n) -> str:
        name = escape(n.abspath.name if n.path == "." else n.name) + ("/" if n.is_dir else "")
        bits = [f"[bold]{name}[/]" if n.is_dir else name]
        badge = ROLE_BADGE.get(n.role)
        if badge and n.role not in ("shard", "metadata"):
            bits.append(f"[reverse] {badge} [/]")
        if n.format not in ("dir", "unknown", "text", "json", "python"):
            bits.append(f"[dim]{n.format}[/]")
        if n.size:
            bits.append(naturalsize(n.size))
        f = n.facts
        extra = []
        if f.get("zero_stage") is not None and n.format == "deepspeed-zero":
            extra.append(f"ZeRO-{f['zero_stage']}")
        if f.get("world_size"):
            extra.append(f"{f['world_size']} ranks")
        if f.get("param_count") and (n.is_dir or n.role in ("model", "model+optimizer")):
            extra.append(f"{count(f['param_count'])} params")
        if f.get("dtypes") and (n.is_dir or n.role in ("model", "model+optimizer")):
            extra.append("/".join(short_dtype(d) for d in f["dtypes"][:3]))
        if extra:
            bits.append("[dim](" + ", ".join(extra) + ")[/]")
        for fd in by_path.get(n.path, []):
            bits.append(f"[{COLOR[fd.severity]}]{GLYPH[fd.severity]} {fd.code}[/]")
        return " ".join(bits)

    def add(tree, n, depth):
        kids = n.children
        if not show_all and n.format == "dcp":
            shards = [c for c in kids if c.role == "shard"]
            others = [c for c in kids if c.role != "shard"]
            for c in others:
                add(tree.add(label(c)), c, depth + 1)
            if shards:
                bad = [c for c in shards if c.path in by_path]
                for c in bad:
                    tree.add(label(c))
                tree.add(f"[dim]{len(shards)} .distcp shard files, {naturalsize(sum(c.size for c in shards))}[/]")
            return
        limit = None if show_all else 40
        shown = kids if limit is None else kids[:limit]
        for c in shown:
            sub = tree.add(label(c))
            if c.is_dir and (show_all or depth < 6):
                add(sub, c, depth + 1)
        if limit is not None and len(kids) > limit:
            tree.add(f"[dim]… {len(kids) - limit} more (use --all)[/]")

    root = Tree(label(inv.root))
    add(root, inv.root, 0)
    con.print(f"[bold]{escape(inv.summary)}[/]")
    con.print(root)
    if inv.checkpoints:
        con.print("\n[bold]Checkpoints[/] (newest first)")
        for ck in inv.checkpoints:
            mark = "[green]✔ complete[/]" if ck["complete"] else "[red]✖ incomplete[/]"
            con.print(f"  {escape(ck['path'])}  step {ck['step']}  {ck['layout']}  {mark}")
    if rep.findings:
        con.print("\n[bold]Findings[/]")
        for f in rep.findings:
            fix = f"  [dim](fix: {f.fix})[/]" if f.fix else ""
            con.print(f"[{COLOR[f.severity]}]{GLYPH[f.severity]} {f.severity:7s}[/] [bold]{f.code}[/] "
                      f"[dim]{escape(f.path)}[/]")
            con.print(Padding(f"{escape(f.message)}{fix}", (0, 0, 0, 4), expand=False))
    else:
        con.print("\n[green]✔ no problems found[/]")


def _register() -> None:
    from .cli_fix import fix_cmd
    from .cli_universal import universal_cmd

    main_group.add_command(fix_cmd)
    main_group.add_command(universal_cmd)


_register()


def main(argv=None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        main_group.main(args=argv, prog_name="ckpt-tui", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ckpt-tui: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("ckpt-tui: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_OK)
    except SystemExit:
        raise
    except Exception as e:  # never a traceback unless asked
        if debug:
            raise
        click.echo(f"ckpt-tui: internal error: {type(e).__name__}: {e} (run with --debug for details)", err=True)
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_OK)


if __name__ == "__main__":
    main()
