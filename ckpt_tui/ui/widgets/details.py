"""Right pane: the selected node's facts, its findings (with the key that fixes each), and a
tensor table that filters as you type."""

from __future__ import annotations

import time

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Input, Static

from ...core.codes import fix_key
from ...core.present import GLYPH, shape_text, short_dtype, size
from ..format import SEV_STYLE, fact_rows

MAX_ROWS = 100
NAME_WIDTH = 26


class Facts(Static):
    """The selected node's name, then the findings it is given (the caller orders them, errors first; one
    about another file names it), then the node's facts."""

    def show(self, node, findings) -> None:
        if node is None:
            self.update("")
            return
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim", no_wrap=True)
        t.add_column()
        for k, v in fact_rows(node):
            t.add_row(k, v)
        parts = [Text(node.path if node.path != "." else node.abspath.name, style="bold")]
        for f in findings:  # what is wrong comes first
            line = Text()
            line.append(f"{GLYPH[f.severity]} {f.severity} ", style=SEV_STYLE[f.severity])
            line.append(f.code, style="bold")
            if f.path != node.path:
                line.append(f" in {f.path}", style="bold")
            if f.fix:
                line.append(f"  press {fix_key(f.fix)}: {f.fix}", style="reverse")
            parts.append(line)
            parts.append(Text(f.message))
            parts.append(Text(""))
        parts.append(t)
        self.update(Group(*parts))


class TensorTable(Vertical):
    """Rows are kept in memory and only the first MAX_ROWS matches are drawn, so a keystroke
    costs the same at 100,000 tensors as at 10."""

    DEFAULT_CSS = """
    TensorTable { height: 1fr; }
    TensorTable Input { height: 3; display: none; }
    TensorTable Input.visible { display: block; }
    TensorTable #tensor-count { height: 1; color: $text-muted; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rows: list = []
        self.stats: dict[str, object] = {}
        self.last_filter_ms = 0.0

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter tensors by name…", id="tensor-filter")
        yield Static("", id="tensor-count")
        table = DataTable(id="tensor-table", cursor_type="row", zebra_stripes=False)
        yield table

    def on_mount(self) -> None:
        self._columns(False)

    def _columns(self, with_stats: bool) -> None:
        self._with_stats = with_stats
        self._set_columns([])

    def _set_columns(self, rows: list) -> None:
        """Columns as wide as their widest cell shown, set explicitly: a DataTable that measures its columns
        itself does so when idle, and a frame drawn before that (a loaded machine) kept a stale header row."""
        table = self.query_one(DataTable)
        cols = ["name", "size", "dtype", "shape"] + (["min", "max", "NaN/Inf"] if self._with_stats else [])
        widths = [max([cell_len(c)] + [cell_len(str(r[i])) for r in rows]) for i, c in enumerate(cols)]
        table.clear(columns=True)
        for c, w in zip(cols, widths):
            table.add_column(c, width=w)

    def set_rows(self, rows, note: str = "") -> None:
        self.rows = list(rows)
        self._lower = [r.name.lower() for r in self.rows]
        self.note = note
        if self.stats:
            self.stats = {}
            self._columns(False)
        self.refilter()

    def set_stats(self, stats) -> None:
        self.stats = {s.name: s for s in stats}
        self._columns(True)
        self.refilter()

    def refilter(self) -> None:
        t0 = time.perf_counter()
        text = self.query_one(Input).value.strip().lower()
        table = self.query_one(DataTable)
        shown = 0
        rows = []
        matches = 0
        lower = getattr(self, "_lower", [])
        for r, low in zip(self.rows, lower):
            if text and text not in low:
                continue
            matches += 1
            if shown >= MAX_ROWS:
                continue
            name = r.name if len(r.name) <= NAME_WIDTH else "…" + r.name[-(NAME_WIDTH - 1):]
            dtype = short_dtype(r.dtype) + (f"↑{short_dtype(r.upcast_from)}" if r.upcast_from else "")  # fp32↑bf16
            cells = [Text(name), Text(size(r.nbytes)), Text(dtype),
                     Text(shape_text(r.shape))]
            if getattr(self, "_with_stats", False):
                st = self.stats.get(r.name)
                fmt = lambda v: "" if v is None else f"{v:.3g}"
                bad = 0 if st is None else st.nan + st.inf
                cells += [fmt(getattr(st, "min", None)), fmt(getattr(st, "max", None)),
                          Text(f"✖ {bad}", style="bold red") if bad else ("" if st is None else "0")]
            rows.append(cells)
            shown += 1
        self._set_columns(rows)
        table.add_rows(rows)
        note = getattr(self, "note", "")
        count = f"{matches:,}/{len(self.rows):,} match '{text}'" if text else f"{matches:,} tensors"
        if matches > shown:
            count += f" ({shown} shown)"
        self.query_one("#tensor-count", Static).update(Text(count + (f" — {note}" if note else "")))
        self.last_filter_ms = (time.perf_counter() - t0) * 1000

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refilter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def open_filter(self) -> None:
        inp = self.query_one(Input)
        inp.add_class("visible")
        inp.focus()


class Details(VerticalScroll):
    DEFAULT_CSS = """
    Details { height: 1fr; }
    Details Facts { height: auto; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Facts(id="facts")
