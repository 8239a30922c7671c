"""All findings of the tree, most severe first. Enter jumps to the file; x starts its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ...core.present import GLYPH
from ...core.types import SEVERITY_RANK, Finding
from ..format import plain, plain_text


@dataclass(frozen=True)
class FindingChoice:
    """What the findings screen returns: the finding to go to, and whether to start its fix (x)."""

    finding: Finding
    fix: bool = False


class FindingsScreen(ModalScreen[Optional[FindingChoice]]):
    DEFAULT_CSS = """
    FindingsScreen { align: center middle; }
    FindingsScreen > Vertical { width: 96%; height: 90%; border: thick $primary; background: $surface; }
    FindingsScreen DataTable { height: 1fr; min-height: 4; }
    FindingsScreen #finding-message { height: auto; max-height: 14; padding: 0 1; border-top: solid $primary; }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("f", "close", "Close", show=False),
        Binding("x", "fix", "Fix"),
        Binding("j", "down", "Down", show=False),
        Binding("k", "up", "Up", show=False),
    ]

    def __init__(self, findings: Iterable[Finding]) -> None:
        super().__init__()
        self.findings = sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.path, f.code))

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(plain(f" Findings ({len(self.findings)}) — enter: go to the file · x: fix · esc: close"))
            yield DataTable(cursor_type="row", id="findings-table")
            yield Static("", id="finding-message")

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("", "severity", "code", "path", "fix")
        for i, f in enumerate(self.findings):
            # the path as a Text: a DataTable parses a str cell as markup, and a path is the file's name (the
            # glyph, severity, code and fix id are the registry's own words)
            t.add_row(GLYPH[f.severity], f.severity, f.code, plain_text(f.path), f.fix or "", key=str(i))
        t.focus()
        self._show(0)

    def _show(self, i: int) -> None:
        if self.findings:
            self.query_one("#finding-message", Static).update(plain(self.findings[i].message))  # never markup

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(FindingChoice(self.findings[event.cursor_row]))

    def action_fix(self) -> None:
        t = self.query_one(DataTable)
        if self.findings:
            self.dismiss(FindingChoice(self.findings[t.cursor_row], fix=True))

    def action_down(self) -> None:
        self.query_one(DataTable).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(DataTable).action_cursor_up()

    def action_close(self) -> None:
        self.dismiss(None)
