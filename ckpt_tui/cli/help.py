"""`ckpt-tui help [COMMAND]`: the same text as `--help`, for those who type it first."""

from __future__ import annotations

import sys

import click

from ..core.errors import EXIT_OK, EXIT_USAGE
from .output import fail


@click.command("help", short_help="Show the help of ckpt-tui or of one command.")
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
