"""What every command prints the same way: an error line and its exit code, a long core call under
a progress bar, the ``--json`` document, and the human inspection report.

Exit codes: 0 ok · 1 findings of severity error, or the operation failed · 2 unreadable path or
bad usage · 130 interrupted. rich is imported only when something is drawn (``--help`` stays light).

Every string that came from a checkpoint (names, paths, ``latest``, messages quoting them) is printed through
:func:`echo` / :func:`fail` or, in what Rich draws, :func:`esc`: control characters and bidi controls shown as
escapes (``core.safetext.visible``), Rich markup escaped. ``--json`` escapes C1 and bidi controls too.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from ..core.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from ..core.formats.registry import format_of
from ..core.safetext import json_safe, visible
from ..core.types import SCHEMA_VERSION


def echo(msg: object = "", *, err: bool = False) -> None:
    """``click.echo`` of text that may quote a checkpoint: its control characters shown as escapes (newlines
    and tabs kept), so nothing in it reaches the terminal as a sequence."""
    click.echo(visible(msg, lines=True), err=err)


def esc(text: object) -> str:
    """``text`` for Rich markup: control characters shown as escapes, then Rich's markup escaped (``[red]`` and
    ``[link=…]`` in a name print as written)."""
    from rich.markup import escape

    return escape(visible(text))


def fail(msg: str, code: int) -> NoReturn:
    echo(f"ckpt-tui: {msg}", err=True)
    sys.exit(code)


def local_only(path: str, command: str) -> None:
    """``command`` writes beside its checkpoint: an object-storage URL is one line and exit code 2."""
    from ..core.storage import is_url

    if is_url(path):
        fail(
            f"{path}: `ckpt-tui {command}` works on a checkpoint on local disk (it writes beside it); "
            "copy it to a local folder first",
            EXIT_USAGE,
        )


def emit_json(doc: dict, *, indent: int = 2, ensure_ascii: bool = True) -> None:
    """Print ``doc`` as the command's one JSON document, ``schema_version`` first.

    ``indent``/``ensure_ascii`` are per command as released (inspect and fix keep non-ASCII, the
    tensor listings indent by 1): changing them would change the bytes scripts already parse.

    Streamed (``core.jsondoc.write_json``: the same bytes as ``json.dumps``): written some 16,000 parts at a time,
    each piece through :func:`json_safe` (it maps single characters, so a piece boundary never splits an escape),
    never the whole document as one string (the report of 200,000 files is ~120 MB of JSON, and several copies of
    it were held at once), with the cyclic GC paused (the parts are acyclic; its collections would re-walk the
    document)."""
    # the encoder escapes C0 but leaves C1 (U+009B is a CSI), bidi controls and U+2028/2029 raw: json_safe escapes
    # them
    import gc

    from ..core.jsondoc import write_json

    was = gc.isenabled()
    gc.disable()
    try:
        write_json(
            {"schema_version": SCHEMA_VERSION, **doc},
            lambda piece: click.echo(json_safe(piece), nl=False),
            indent=indent,
            ensure_ascii=ensure_ascii,
        )
        click.echo()
    finally:
        if was:
            gc.enable()


def progress_bar(as_json: bool, unit: str):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    cols = [TextColumn("{task.description}"), BarColumn()]
    cols += [DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else [MofNCompleteColumn()]
    cols.append(TimeRemainingColumn())
    return Progress(*cols, console=Console(stderr=True), transient=True, disable=as_json)


def run_core(fn, *, as_json: bool, unit: str = "bytes", label: str = "", cleanup: str = ""):
    """Call ``fn(on_progress=..., cancel=...)`` with a progress bar on stderr (one bar per step
    label, e.g. writing / verifying) and map its errors to the exit codes. ``cleanup`` is said
    after an interruption (e.g. "the partial output was removed")."""
    import threading

    from ..core.export.write import ExportError
    from ..core.formats import FormatError
    from ..core.progress import Cancelled
    from ..core.scan import ScanError
    from ..core.storage import StorageError

    cancel = threading.Event()
    after = f"; {cleanup}" if cleanup else ""
    with progress_bar(as_json, unit) as bar:
        tasks: dict[str, int] = {}

        def on_progress(p):
            step = label or p.label or "working"
            if step not in tasks:
                tasks[step] = bar.add_task(esc(step[:40]), total=p.total)  # a label may name a file
            bar.update(tasks[step], completed=p.done, total=p.total)

        try:
            return fn(on_progress=on_progress, cancel=cancel)
        except KeyboardInterrupt:
            cancel.set()
            fail("interrupted" + after, EXIT_INTERRUPTED)
        except Cancelled:
            fail("cancelled" + after, EXIT_INTERRUPTED)
        except (ScanError, StorageError) as e:  # StorageError: a URL that cannot be used (verify's download)
            fail(str(e), EXIT_USAGE)
        except (ExportError, FormatError, ValueError) as e:
            fail(str(e), EXIT_FINDINGS)
        except OSError as e:
            fail(f"{e.strerror or e}: {getattr(e, 'filename', '') or ''}{after}", EXIT_FINDINGS)


def conversion_plan(make, refusal: type[Exception], *, dry_run: bool, as_json: bool):
    """``make()``: a conversion's plan (``universal``, ``convert``), its errors mapped to the exit codes
    (an unreadable path 2; ``refusal``, the converter's own error, or a failed read 1); then which
    checkpoint it took and its warnings on stderr. With ``dry_run``, print the plan (or its JSON) and exit 0."""
    from ..core.scan import ScanError

    try:
        plan = make()
    except ScanError as e:
        fail(str(e), EXIT_USAGE)
    except refusal as e:
        fail(str(e), EXIT_FINDINGS)
    except (OSError, ValueError) as e:
        fail(f"cannot plan the conversion: {e}", EXIT_FINDINGS)
    for line in plan.said:
        echo(f"ckpt-tui: {line}", err=True)
    for w in plan.warnings:
        echo(f"ckpt-tui: warning: {w}", err=True)
    if dry_run:
        if as_json:
            emit_json({"plan": plan.to_json()})
        else:
            echo(plan.to_plan().describe())
        sys.exit(EXIT_OK)
    return plan


def inspect_or_fail(path: str, trust: bool):
    """``inspect(path)``; an unreadable path is its message and exit code 2."""
    from ..core.report import inspect
    from ..core.scan import ScanError

    try:
        return inspect(path, trust_pickles=trust)
    except ScanError as e:
        fail(str(e), EXIT_USAGE)


def print_report(rep, show_all: bool, view=None) -> None:
    """The inspection as a tree with badges and findings, then the findings in full; a run folder's run view
    (``view``, else the default one: core/run_view.py) after its checkpoints."""
    from rich.console import Console, Group
    from rich.padding import Padding
    from rich.text import Text
    from rich.tree import Tree

    from ..core.present import (
        GLYPH,
        SEVERITY_COLOR,
        naturalsize,
        param_count,
        role_badge,
        short_dtype,
    )

    inv = rep.inventory
    con = Console(highlight=False, emoji=False)  # a name's :smile: is text too
    by_path: dict[str, list] = {}
    for f in rep.findings:
        by_path.setdefault(f.path, []).append(f)

    def label(n) -> str:
        name = esc(n.abspath.name if n.path == "." else n.name) + ("/" if n.is_dir else "")
        bits = [f"[bold]{name}[/]" if n.is_dir else name]
        badge = role_badge(n.role)
        if badge:
            bits.append(f"[reverse] {badge} [/]")
        fmt = format_of(n)
        if fmt.shown:
            bits.append(f"[dim]{esc(n.format)}[/]")
        if n.size:
            bits.append(naturalsize(n.size))
        f = n.facts
        extra = []
        words = fmt.tree_label(n)
        if words:
            extra.append(esc(words))
        if f.get("world_size"):
            extra.append(f"{f['world_size']} rank{'s' if f['world_size'] != 1 else ''}")
        weights = not fmt.one_line and (n.is_dir or n.role in ("model", "model+optimizer"))
        if f.get("param_count") and weights:
            extra.append(f"{param_count(f['param_count'])} params")
        if f.get("dtypes") and weights:
            extra.append(esc("/".join(short_dtype(d) for d in f["dtypes"][:3])))
        if extra:
            bits.append("[dim](" + ", ".join(extra) + ")[/]")
        for fd in by_path.get(n.path, []):
            bits.append(f"[{SEVERITY_COLOR[fd.severity]}]{GLYPH[fd.severity]} {esc(fd.code)}[/]")
        return " ".join(bits)

    def add(tree, n, depth):
        kids = n.children
        fmt = format_of(n)
        if not show_all and fmt.one_line:
            # one line (its label has the summary); only what has a finding is listed below it
            for c in n.walk():
                if c is not n and c.path in by_path:
                    tree.add(f"{label(c)} [dim]{esc(c.path[len(n.path) + 1 :] if n.path != '.' else c.path)}[/]")
            nparams = n.facts.get("param_folders", 0)
            tree.add(f"[dim]{nparams} parameter folder{'s' if nparams != 1 else ''} in zero/; --all lists them[/]")
            return
        if not show_all and fmt.shard_files:
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
    con.print(f"[bold]{esc(inv.summary)}[/]")
    con.print(root)
    if inv.checkpoints:
        con.print("\n[bold]Checkpoints[/] (newest first)")
        listed = Text()  # one print for them all: a print per line took a tenth of a second for 200 checkpoints
        for i, ck in enumerate(inv.checkpoints):
            listed.append(("\n" if i else "") + f"  {visible(ck['path'])}  step {visible(ck['step'])}  ")
            listed.append(f"{visible(ck['layout'])}  ")
            listed.append(*(("✔ complete", "green") if ck["complete"] else ("✖ incomplete", "red")))
        con.print(listed)
        from .run_table import run_lines

        con.print()
        con.print(Text("\n".join(run_lines(view if view is not None else rep.run_view()))), soft_wrap=True)
    if rep.findings:
        con.print("\n[bold]Findings[/]")
        batch: list = []  # printed 256 findings per call: a print per line cost more than all the rest of inspect
        for i, f in enumerate(rep.findings, 1):
            message = Text(visible(f.message, lines=True))  # plain text: never markup
            if f.fix:
                message.append(f"  (fix: {visible(f.fix)})", style="dim")
            batch.append(
                Text.assemble(
                    (f"{GLYPH[f.severity]} {f.severity:7s}", SEVERITY_COLOR[f.severity]),
                    " ",
                    (visible(f.code), "bold"),
                    " ",
                    (visible(inv.shown(f.path)), "dim"),
                )
            )
            batch.append(Padding(message, (0, 0, 0, 4), expand=False))
            if i % 256 == 0 or i == len(rep.findings):
                con.print(Group(*batch))
                batch = []
    else:
        con.print("\n[green]✔ no problems found[/]")
