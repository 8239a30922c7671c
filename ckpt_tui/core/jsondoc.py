"""How a core object appears in a ``--json`` document: its fields, each value made JSON-able, in
one place (rather than a hand-written ``to_json`` per dataclass that only mirrors its fields)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Optional


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


def as_json(obj: Any, keys: Optional[Iterable[str]] = None) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
        return as_json(self, self.json_keys)


def _floatstr(o: float) -> str:
    if o != o:
        return "NaN"
    if o == _INF:
        return "Infinity"
    if o == -_INF:
        return "-Infinity"
    return float.__repr__(o)


_INF = float("inf")


def write_json(doc: Any, write: Callable[[str], Any], *, indent: int, ensure_ascii: bool, chunk: int = 1 << 14) -> None:
    """Write ``json.dumps(doc, indent=indent, ensure_ascii=ensure_ascii)`` through ``write`` in pieces of about
    ``chunk`` encoder parts, never the whole text at once: the same bytes (the same rules for keys, floats,
    ``int``/``str`` subclasses, circular references and unsupported types as the standard encoder), by plain
    recursion into a list rather than the standard indenting encoder's chain of generators (a third of the CPU
    of ``inspect --json`` of a big tree)."""
    from json.encoder import encode_basestring, encode_basestring_ascii

    enc = encode_basestring_ascii if ensure_ascii else encode_basestring
    ind = " " * indent
    out: list[str] = []
    markers: dict[int, Any] = {}

    def key(k: Any) -> str:
        if isinstance(k, str):
            return enc(k)
        if isinstance(k, float):
            return enc(_floatstr(k))
        if k is True:
            return '"true"'
        if k is False:
            return '"false"'
        if k is None:
            return '"null"'
        if isinstance(k, int):
            return enc(int.__repr__(k))
        raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")

    def value(o: Any, level: int) -> None:
        if isinstance(o, str):
            out.append(enc(o))
        elif o is None:
            out.append("null")
        elif o is True:
            out.append("true")
        elif o is False:
            out.append("false")
        elif isinstance(o, int):
            out.append(int.__repr__(o))
        elif isinstance(o, float):
            out.append(_floatstr(o))
        elif isinstance(o, (list, tuple, dict)):
            if not o:
                out.append("{}" if isinstance(o, dict) else "[]")
                return
            i = id(o)
            if i in markers:
                raise ValueError("Circular reference detected")
            markers[i] = o
            nl = "\n" + ind * (level + 1)
            sep = "," + nl
            if isinstance(o, dict):
                out.append("{" + nl)
                first = True
                for k, x in o.items():
                    if first:
                        first = False
                    else:
                        out.append(sep)
                    out.append((enc(k) if k.__class__ is str else key(k)) + ": ")
                    # the common leaves written here, not through a call of value() each
                    if x.__class__ is str:
                        out.append(enc(x))
                    elif x is None:
                        out.append("null")
                    elif x.__class__ is int:
                        out.append(int.__repr__(x))
                    else:
                        value(x, level + 1)
                    if len(out) >= chunk:
                        write("".join(out))
                        out.clear()
                out.append("\n" + ind * level + "}")
            else:
                out.append("[" + nl)
                first = True
                for x in o:
                    if first:
                        first = False
                    else:
                        out.append(sep)
                    value(x, level + 1)
                    if len(out) >= chunk:
                        write("".join(out))
                        out.clear()
                out.append("\n" + ind * level + "]")
            del markers[i]
        else:
            raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")

    value(doc, 0)
    write("".join(out))
