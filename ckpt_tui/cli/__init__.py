"""Headless commands over the core. stdout, stderr and exit codes are a tested contract:

0 ok · 1 findings of severity error, or the operation failed · 2 unreadable path or bad usage ·
130 interrupted. ``--json`` prints one document with a ``schema_version``. Never a traceback
(``--debug`` shows one).

A module per command group (inspect.py: inspect/open/tensors; export.py: export/verify/diff/stats;
universal.py; convert.py; fix.py; prune.py; demo.py; help.py), the options they share in options.py, what they print in
output.py. Importing this package imports neither torch, DeepSpeed, textual nor rich.
"""

from __future__ import annotations

import os
import sys

import click

from .. import __version__
from ..core.errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .convert import convert_cmd
from .demo import demo_cmd
from .export import diff_cmd, export_cmd, stats_cmd, verify_cmd
from .fix import fix_cmd
from .help import help_cmd
from .inspect import inspect_cmd, open_cmd, tensors_cmd
from .prune import prune_cmd
from .universal import universal_cmd

__all__ = ["main", "main_group"]


class _Group(click.Group):
    """`ckpt-tui PATH` is `ckpt-tui open PATH`."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["open", *args]
        return super().resolve_command(ctx, args)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(
    cls=_Group,
    context_settings=CONTEXT,
    invoke_without_command=True,
    subcommand_metavar="[PATH | COMMAND [ARGS]]",
    commands=[
        help_cmd,
        inspect_cmd,
        open_cmd,
        tensors_cmd,
        demo_cmd,
        export_cmd,
        verify_cmd,
        diff_cmd,
        stats_cmd,
        universal_cmd,
        convert_cmd,
        fix_cmd,
        prune_cmd,
    ],
)
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
    except BaseException as e:  # never a traceback unless asked; torch's CheckpointException is a BaseException
        if debug:
            raise
        from ..core.safetext import visible

        first = next(iter(str(e).splitlines()), "")  # a CheckpointException's text carries each rank's traceback
        click.echo(
            visible(f"ckpt-tui: internal error: {type(e).__name__}: {first} (run with --debug for details)"), err=True
        )
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_OK)
