"""Small modal screens: confirm, error, result, help."""

from __future__ import annotations

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

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90%; max-width: 100; height: auto; max-height: 90%; border: thick $primary;
                     background: $surface; padding: 1 2; }}
{name} .title {{ text-style: bold; margin-bottom: 1; }}
{name} .buttons {{ height: 3; align: right middle; margin-top: 1; }}
{name} Button {{ margin-left: 2; }}
{name} VerticalScroll {{ height: auto; max-height: 20; }}
"""


class ConfirmDialog(ModalScreen[bool]):
    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmDialog")
    AUTO_FOCUS = "#yes"
    BINDINGS = [Binding("escape", "no", "No"), Binding("y", "yes", "Yes"), Binding("n", "no", "No")]

    def __init__(self, title: str, body: str = "", yes: str = "Yes", no: str = "No"):
        super().__init__()
        self.title_text, self.body, self.yes, self.no = title, body, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            if self.body:
                with VerticalScroll():
                    yield Static(self.body)
            with Horizontal(classes="buttons"):
                yield Button(f"{self.no} (n)", id="no")
                yield Button(f"{self.yes} (y)", id="yes", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_yes(self) -> None:
        self.dismiss(True)

    def action_no(self) -> None:
        self.dismiss(False)


class MessageDialog(ModalScreen[None]):
    """A result or an error: the message, and where the log is — never a traceback."""

    DEFAULT_CSS = DIALOG_CSS.format(name="MessageDialog") + """
    MessageDialog.error > Vertical { border: thick $error; }
    """
    AUTO_FOCUS = "#close"
    BINDINGS = [Binding("escape", "close", "Close"), Binding("enter", "close", "Close")]

    def __init__(self, title: str, body, error: bool = False):
        super().__init__(classes="error" if error else "")
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            with VerticalScroll():
                yield Static(self.body)
            with Horizontal(classes="buttons"):
                yield Button("Close (enter)", id="close", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


FINDING_HELP = {c.code: c.help for c in CODES.values()}  # the registry's one-line help, in its order


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = DIALOG_CSS.format(name="HelpScreen") + """
    HelpScreen VerticalScroll { max-height: 30; }
    """
    BINDINGS = [Binding("escape", "close", "Close"), Binding("question_mark", "close", "Close"),
                Binding("q", "close", "Close")]

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        for a in ACTIONS:
            if a.action != "noop":
                keys.add_row(a.key_display or a.key, a.help)
        keys.add_row("j / k", "Down / up in the tree and tables")
        keys.add_row("enter", "Open a folder, or jump to a finding's file")
        keys.add_row("ctrl+p", "Command palette: every action by name")
        codes = Table.grid(padding=(0, 2))
        codes.add_column(style="bold", no_wrap=True)
        codes.add_column()
        for k, v in FINDING_HELP.items():
            codes.add_row(k, v)
        with Vertical():
            yield Static("ckpt-tui — keys", classes="title")
            with VerticalScroll():
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
