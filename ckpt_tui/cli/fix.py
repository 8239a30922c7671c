"""`ckpt-tui fix PATH`: list the repairs that apply, show their plans, apply them."""

from __future__ import annotations

import sys

import click

from ..core.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from ..core.safetext import visible
from .options import json_option, path_argument, trust_pickles_option
from .output import echo, emit_json, fail, local_only


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


@click.command("fix", short_help="Repair what inspect flags, with a backup and a dry run.")
@path_argument()
@click.option(
    "--only",
    "only",
    default=None,
    metavar="ID",
    help="Apply only this fix id (universal-info, latest, dcp-metadata) or finding code.",
)
@click.option("--dry-run", is_flag=True, help="Print exactly what each repair would change; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Apply without asking (needed without a terminal).")
@json_option("One JSON document (schema_version 1).")
@trust_pickles_option()
def fix_cmd(path, only, dry_run, yes, as_json, trust_pickles):
    """Repair what `inspect` flags in PATH, safely: each repair shows its plan first (--dry-run
    stops there), keeps a backup (hard link, no copy), writes atomically (temp file + fsync +
    rename), then re-inspects to check the finding is gone.

    \b
    Examples:
      ckpt-tui fix checkpoint-2000 --dry-run
      ckpt-tui fix checkpoint-2000/global_step2000 --only universal-info --yes

    Exit codes: 0 ok (--dry-run: every listed repair can be applied), 1 a repair failed or errors
    remain that no repair fixes (with --only: errors of that kind), 2 bad path or usage, 130
    interrupted.
    """
    local_only(path, "fix")
    from ..core.codes import FIXES
    from ..core.progress import Cancelled
    from ..core.repair import repairs_for
    from ..core.report import inspect
    from ..core.scan import ScanError

    try:
        try:
            rep = inspect(path, trust_pickles=trust_pickles)
        except ScanError as e:
            fail(str(e), EXIT_USAGE)
        reps = repairs_for(rep)
        if only:
            known = {f.id for f in FIXES.values() if f.command}
            reps = [r for r in reps if only in (r.id, r.code)]
            if not reps and only not in known and only not in {f.code for f in rep.findings}:
                fail(f"unknown fix id {only!r}; ids: {', '.join(sorted(known))}", EXIT_USAGE)
        applicable = [r for r in reps if r.can_apply]
        if not dry_run and applicable and not yes and not _interactive():
            fail(
                "no terminal to ask for confirmation: pass --yes to apply the repairs (or --dry-run to see them)",
                EXIT_USAGE,
            )
        results = []
        for r in reps:
            if not as_json:
                echo(("[dry run] " if dry_run else "") + r.plan.describe())
            if dry_run or not r.can_apply:
                continue
            ask = visible(f"Apply `{r.id}` to {rep.inventory.shown(r.path)}?")
            if not yes and not click.confirm(ask, default=False, err=True):
                echo(f"ckpt-tui: skipped {r.id} at {rep.inventory.shown(r.path)}", err=True)
                continue
            res = r.apply(on_progress=None, cancel=None)
            results.append(res)
            if not as_json:
                echo(("✓ " if res.ok else "✖ ") + res.message)
            elif not res.ok:
                echo(f"ckpt-tui: {r.id} at {rep.inventory.shown(r.path)}: {res.message}", err=True)
        after = inspect(path, trust_pickles=trust_pickles) if results else rep
    except KeyboardInterrupt:
        fail("interrupted (a repair stopped before its rename leaves the original untouched)", EXIT_INTERRUPTED)
    except Cancelled:
        fail("cancelled", EXIT_INTERRUPTED)
    except ScanError as e:
        fail(str(e), EXIT_USAGE)
    except OSError as e:
        fail(f"{e.strerror or e}: {getattr(e, 'filename', '') or ''}", EXIT_FINDINGS)
    failed = any(not x.ok for x in results) or any(r.refused for r in reps)  # refused: a symbolic link on the way
    errors = [f for f in after.findings if f.severity == "error"]
    if only:  # --only: the findings that fix addresses, not the checkpoint's other errors (said, not counted)
        others = [f for f in errors if only not in (f.code, f.fix)]
        errors = [f for f in errors if only in (f.code, f.fix)]
        if others and not as_json:
            echo(
                f"ckpt-tui: {len(others)} other error(s) remain in {after.inventory.shown()} (not "
                f"addressed by --only {only}): see `ckpt-tui inspect {after.inventory.shown()}`",
                err=True,
            )
    if dry_run:  # what would remain: the errors no listed repair can fix
        fixed = {(r.code, r.path) for r in reps if r.can_apply}
        errors = [f for f in errors if (f.code, f.path) not in fixed]
        failed = any(not r.can_apply for r in reps)
    if as_json:
        emit_json(
            {
                "path": str(after.inventory.path),
                "dry_run": dry_run,
                "repairs": [r.to_json() for r in reps],
                "results": [x.to_json() for x in results],
                "findings": [f.to_json() for f in after.findings],
            },
            ensure_ascii=False,
        )
    else:
        if not reps:
            echo("ckpt-tui: nothing to repair" + (f" for {only}" if only else ""), err=True)
        for f in errors:
            echo(
                f"ckpt-tui: {'would still be' if dry_run else 'still'} an error: {f.code} at "
                f"{after.inventory.shown(f.path)}",
                err=True,
            )
    sys.exit(EXIT_FINDINGS if failed or errors else EXIT_OK)
