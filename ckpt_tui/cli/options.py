"""The options and arguments several commands share, declared once."""

from __future__ import annotations

import click

TRUST_PICKLES_HELP = (
    "Treat pickles that name code outside the allowlist as trusted (info, not error). "
    "Only for checkpoints whose origin you trust."
)


def json_option(help: str = "One JSON document."):
    """``--json``: print one document (with ``schema_version``) instead of text; the value is ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def trust_pickles_option(help: str = "See `inspect --help`."):
    """``--trust-pickles``: hand files whose pickles name code outside the allowlist to code that runs it."""
    return click.option("--trust-pickles", is_flag=True, help=help)


def path_argument(name: str = "path", **kw):
    """A path the core opens itself (so a missing or unreadable one is its message and exit code 2,
    not click's)."""
    return click.argument(name, type=click.Path(path_type=str, readable=False), **kw)


def path_option(*decls: str, **kw):
    return click.option(*decls, type=click.Path(path_type=str, readable=False), **kw)
