"""Text that came from a checkpoint, made safe for a terminal: the one place both faces and ``--json`` escape it.

A name, a path, the contents of ``latest``, a JSON value or key, an object-store key -- or a message quoting any
of them -- may hold bytes a terminal obeys: ESC and C1 CSI (U+009B) sequences set the window title (OSC 0), write
the clipboard (OSC 52), wipe the screen (``ESC[2J``) or make links (OSC 8); BEL, CR and backspace rewrite what was
shown; bidi overrides (U+202E) and isolates reorder it. :func:`visible` shows each such character as an escape
(``\\x1b``, ``\\u202e``), so the text reads the same and does nothing. Markup (Rich's ``[red]``, Textual's
``[@click=…]``) is each face's business: the CLI escapes it, the TUI never parses data as markup.
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE", "visible", "json_safe"]

# C0 controls, DEL, C1 controls; the bidi marks, embeddings, overrides and isolates; the line and paragraph
# separators (some terminals and editors break lines there); lone surrogates (a file name's undecodable bytes)
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_KEEP_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # os.fsdecode's surrogateescape of an undecodable byte: show that byte
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: object, *, lines: bool = False) -> str:
    """``text`` (any value: ``str()`` of it) with every control character, bidi control and lone surrogate
    shown as an escape: ``\\x1b]0;title\\x07``. ``lines=True`` keeps newlines and tabs (a message of several
    lines); CR is always escaped (it would overwrite the line)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():  # the common case, at C speed: nothing to escape (isprintable is False for all of UNSAFE)
        return s
    return (_UNSAFE_KEEP_LINES if lines else UNSAFE).sub(_escape, s)


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def json_safe(doc_text: str) -> str:
    """A JSON document (``json.dumps`` output, ``ensure_ascii=False``) with DEL, C1 controls, bidi controls,
    U+2028/2029 and lone surrogates written as ``\\uXXXX`` escapes (json.dumps escapes only C0). Outside strings
    JSON is ASCII, so each is inside a string, and the escape decodes to the same value."""
    if doc_text.isascii() and "\x7f" not in doc_text:  # the common case: isascii is a flag of the str, O(1)
        return doc_text
    return _JSON_UNSAFE.sub(_json_escape, doc_text)
