"""Small modal screens: confirm, error, result, help. Their CSS is dialogs.tcss (type selectors on Dialog
match every subclass)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from ...core.codes import CODES
from ...core.present import GLYPH
from ..actions import ACTIONS
from ..format import plain, visible

# rows a dialog's frame takes besides its scrolled body: border 2, padding 2, title 2, buttons 4
FRAME_ROWS = 10


def shown(body):
    """A dialog's title or body: a str (which may quote a checkpoint) as plain Content, never markup; a Content
    or Text the caller built is kept."""
    return plain(body) if isinstance(body, str) else body


class Dialog(ModalScreen):
    """A box of at most 90% of the screen: the body scrolls, the title and the buttons always show."""

    CSS_PATH = Path(__file__).with_name("dialogs.tcss")

    def on_mount(self) -> None:
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        room = max(3, int(self.size.height * 0.9) - FRAME_ROWS)
        for body in self.query(VerticalScroll):
            body.styles.max_height = room


class ConfirmDialog(Dialog):
    AUTO_FOCUS = "#yes"
    BINDINGS = [Binding("escape", "no", "No"), Binding("y", "yes", "Yes"), Binding("n", "no", "No")]

    def __init__(self, title: str, body: str = "", yes: str = "Yes", no: str = "No"):
        super().__init__()
        self.title_text, self.body, self.yes, self.no = title, body, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(shown(self.title_text), classes="title")
            if self.body:
                with VerticalScroll():
                    yield Static(shown(self.body))
            with Horizontal(classes="buttons"):
                yield Button(f"{self.no} (n)", id="no")
                yield Button(f"{self.yes} (y)", id="yes", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_yes(self) -> None:
        self.dismiss(True)

    def action_no(self) -> None:
        self.dismiss(False)


class MessageDialog(Dialog):
    """A result or an error: the message, and where the log is — never a traceback."""

    AUTO_FOCUS = "#close"
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("enter", "close", "Close"),
        Binding("j", "scroll(1)", "Down", show=False),
        Binding("k", "scroll(-1)", "Up", show=False),
    ]

    def __init__(self, title: str, body, error: bool = False):
        super().__init__(classes="error" if error else "")
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(shown(self.title_text), classes="title")
            with VerticalScroll():
                yield Static(shown(self.body))
            with Horizontal(classes="buttons"):
                yield Button("Close (enter)", id="close", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_scroll(self, lines: int) -> None:
        self.query_one(VerticalScroll).scroll_relative(y=lines, animate=False)


FINDING_HELP = {c.code: c.help for c in CODES.values()}  # the registry's one-line help, in its order


class HelpScreen(Dialog):
    """Every key (and, for one that cannot run now, why), then every finding code. j/k scroll."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close"),
        Binding("q", "close", "Close"),
        Binding("j,down", "scroll(1)", "Down", show=False),
        Binding("k,up", "scroll(-1)", "Up", show=False),
        Binding("space,pagedown", "page(1)", "Page down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
    ]

    def __init__(self, why_not: Optional[dict[str, Optional[str]]] = None):
        super().__init__()
        self.why_not = why_not or {}

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        for a in ACTIONS:
            why = self.why_not.get(a.id)
            text = Text(a.help)
            if why:
                text.append(f" — not now: {visible(why)}", style="italic")
            keys.add_row(a.key_display or a.key, text)
        keys.add_row("j / k", "Down / up in the tree, tables and this help")
        keys.add_row("enter", "Open a folder, or jump to a finding's file")
        keys.add_row("ctrl+p", "Command palette: every action by name")
        codes = Table.grid(padding=(0, 2))
        codes.add_column(style="bold", no_wrap=True)
        codes.add_column()
        for k, v in FINDING_HELP.items():
            codes.add_row(k, v)
        with Vertical():
            yield Static("ckpt-tui — keys (j/k scroll)", classes="title")
            with VerticalScroll(can_focus=True):
                yield Static(keys)
                legend = "  ".join(f"{g} {sev}" for sev, g in GLYPH.items())
                yield Static(Text(f"\nFinding codes ({legend})", style="bold"))
                yield Static(codes)
            with Horizontal(classes="buttons"):
                yield Button("Close (esc)", id="close", variant="primary")

    def on_button_pressed(self, event) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_scroll(self, lines: int) -> None:
        self.query_one(VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_page(self, pages: int) -> None:
        body = self.query_one(VerticalScroll)
        body.scroll_relative(y=pages * max(1, body.size.height - 1), animate=False)
