"""How the CLI and the TUI spell things: severity glyphs and colours, role badges, short dtypes,
sizes, counts, shapes. Plain strings, no rich, no textual: each face adds its own styling.

Severity is always a glyph as well as a colour (readable without colour, e.g. ``NO_COLOR``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .dtypes import short_dtype
from .types import SEVERITY_RANK, Finding
from .units import naturalsize, param_count

__all__ = [
    "GLYPH",
    "SEVERITY_COLOR",
    "ROLE_BADGE",
    "MAIN_ROLES",
    "role_badge",
    "worst",
    "size",
    "param_count",
    "naturalsize",
    "short_dtype",
    "shape_text",
    "universal_summary",
]

GLYPH = {"error": "✖", "warning": "▲", "info": "●"}
SEVERITY_COLOR = {"error": "red", "warning": "yellow", "info": "cyan"}

# role -> badge. The CLI shows them as they are; the TUI shows MAIN_ROLES' upper-cased, first.
ROLE_BADGE = {
    "model": "model",
    "optimizer": "optim",
    "model+optimizer": "model+optim",
    "rng": "rng",
    "scheduler": "sched",
    "trainer-state": "state",
    "training-args": "args",
    "config": "config",
    "tokenizer": "tok",
    "script": "script",
    "data-loader": "data",
    "marker": "marker",
    "checkpoint": "ckpt",
    "run": "run",
    "scaler": "scaler",
    "backup": "backup",
    # verl's rank files: which of a rank's files holds the model, the optimizer, the scheduler + RNG
    "model-shard": "model",
    "optimizer-shard": "optim",
    "extra-state": "sched+rng",
}
MAIN_ROLES = ("model", "optimizer", "model+optimizer")


def role_badge(role: str) -> Optional[str]:
    """The badge of a node's role; None for roles without one (shards and metadata files: too many)."""
    return ROLE_BADGE.get(role)


def worst(findings: Iterable[Finding]) -> Optional[str]:
    """The worst severity among ``findings`` (None if there are none)."""
    return min((f.severity for f in findings), key=lambda s: SEVERITY_RANK[s], default=None)


def size(n: Optional[float]) -> str:
    """Bytes (or bytes a second), humanized (None as 0)."""
    return naturalsize(n or 0)


def shape_text(shape: Iterable[object]) -> str:
    """``4096×4096``; ``scalar`` for ()."""
    return "×".join(str(d) for d in shape) or "scalar"


def universal_summary(facts: Mapping[str, Any]) -> str:
    """A universal checkpoint folder in one line: its parameters, which state files they have and
    the fp32 weights' size, e.g. ``21 parameters with fp32, exp_avg, exp_avg_sq, step; 115K params, 460.3 kB fp32``."""
    bits = [f"{facts.get('param_folders', 0)} parameters"]
    if facts.get("states"):
        bits[0] += " with " + ", ".join(facts["states"])
    tail = []
    if facts.get("param_count"):
        tail.append(f"{param_count(facts['param_count'])} params")
    if facts.get("tensor_bytes"):
        tail.append(f"{naturalsize(facts['tensor_bytes'])} fp32")
    return "; ".join(bits + ([", ".join(tail)] if tail else []))
