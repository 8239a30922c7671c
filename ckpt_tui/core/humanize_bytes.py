"""Human sizes for the core's own messages (humanize is a dependency; this keeps one spelling)."""

from __future__ import annotations


def naturalsize(n: int | float) -> str:
    import humanize

    return humanize.naturalsize(n, binary=False, format="%.1f")


def count(n: int) -> str:
    """268435456 -> '268M'."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            v = n / div
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return str(n)
