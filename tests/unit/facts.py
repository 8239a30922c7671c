"""Every node's facts held to their declaration (ckpt_tui/core/facts.py): each key declared for the
node's format, each value of the declared type."""

from __future__ import annotations

import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

from .api import facts_type


def conforms(value: Any, tp: Any) -> bool:
    """Is ``value`` a ``tp`` (int, float, str, bool, list[...], dict[..., ...], Optional/Union)?"""
    origin = get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is list:
        (item,) = get_args(tp)
        return isinstance(value, list) and all(conforms(x, item) for x in value)
    if origin is dict:
        k, v = get_args(tp)
        return isinstance(value, dict) and all(conforms(a, k) and conforms(b, v) for a, b in value.items())
    if isinstance(tp, type):
        return isinstance(value, tp)
    raise TypeError(f"no rule for {tp!r}")


def undeclared(report) -> list[str]:
    """``path: key ...`` for every fact of ``report`` that its format does not declare as written."""
    out = []
    for n in report.inventory.nodes():
        decl = facts_type(n.format, n.is_dir)
        hints = get_type_hints(decl)
        for key, value in n.facts.items():
            if key not in hints:
                out.append(f"{n.path} ({n.format}): {key} is not declared in {decl.__name__}")
            elif not conforms(value, hints[key]):
                out.append(f"{n.path} ({n.format}): {key}={value!r} is not {hints[key]}")
    return out
