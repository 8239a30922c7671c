"""Units for people: sizes in bytes (``naturalsize``: one spelling, through humanize) and parameter counts
(``param_count``: 115K, 268M, 1.5B, the way model cards say them). No imports from the rest of ckpt-tui."""

from __future__ import annotations


def naturalsize(n: int | float) -> str:
    import humanize

    return humanize.naturalsize(n, binary=False, format="%.1f")


def param_count(n: int) -> str:
    """A number of parameters, short: 268435456 -> '268M', 115000 -> '115K'."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            v = n / div
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return str(n)
