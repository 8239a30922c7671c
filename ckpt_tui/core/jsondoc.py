"""How a core object appears in a ``--json`` document: its fields, each value made JSON-able, in
one place (rather than a hand-written ``to_json`` per dataclass that only mirrors its fields)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar, Iterable, Optional


def jsonable(v: Any) -> Any:
    """``v`` as plain JSON values: dict keys as strings, tuples and sets as lists (sets sorted),
    objects with ``to_json()`` by it, paths and anything else as strings."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        seq = sorted(v) if isinstance(v, (set, frozenset)) else v
        return [jsonable(x) for x in seq]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, Path):
        return str(v)
    to_json = getattr(v, "to_json", None)
    if callable(to_json):
        return to_json()
    return str(v)


def as_json(obj: Any, keys: Optional[Iterable[str]] = None) -> dict:
    """The JSON object of dataclass ``obj``: ``keys`` in that order (default: every field in
    declaration order); a key ``"name=attribute"`` is the attribute (or property) under another name."""
    if keys is None:
        keys = [f.name for f in fields(obj)]
    out = {}
    for key in keys:
        name, _, attr = key.partition("=")
        out[name] = jsonable(getattr(obj, attr or name))
    return out


class JsonFields:
    """Mixin for a dataclass whose JSON object mirrors it: ``to_json()`` is :func:`as_json` of
    ``json_keys`` (default: every field). A class whose document adds more overrides ``to_json``
    and starts from ``as_json(self, ...)``."""

    json_keys: ClassVar[Optional[tuple[str, ...]]] = None

    def to_json(self) -> dict:
        return as_json(self, self.json_keys)
