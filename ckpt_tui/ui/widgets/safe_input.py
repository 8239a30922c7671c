"""An Input whose value may hold a checkpoint's name (the wizards' output folder): its control characters and
bidi controls are drawn as one visible cell each (``␛`` for ESC, ``�`` for C1 and bidi), never sent to the
terminal. One cell per character, so the cursor stays where Input puts it; the value itself is unchanged."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Input

from ...core.safetext import UNSAFE

_PICTURES = {c: 0x2400 + c for c in range(0x20)} | {0x7F: 0x2421}  # Unicode's control pictures: ␀ … ␟, ␡


def _shown(m) -> str:
    c = ord(m.group())
    return chr(_PICTURES.get(c, 0xFFFD))


class SafeInput(Input):
    @property
    def _value(self) -> Text:  # Input draws its value from this property (Textual 8)
        text = super()._value
        if not self.password and not text.plain.isprintable():
            text.plain = UNSAFE.sub(_shown, text.plain)  # same length: spans and the cursor are unchanged
        return text
