"""Right pane: the selected node's facts, its findings (with the key that fixes each), and a
tensor table that filters as you type."""

from __future__ import annotations

import time
from typing import Any, Optional

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import DataTable, Input, Static

from ...core.analysis import TensorStats
from ...core.codes import fix_key
from ...core.present import GLYPH, shape_text, short_dtype, size
from ...core.types import TensorInfo
from ..format import SEV_STYLE, distinct_cuts, fact_rows, plain_text, visible

MAX_ROWS = 100


# the caption of a listing whose weights were saved empty (weights-empty): its empty rows are marked too
EMPTY_MARK = "✖ weights-empty"
# the caption's word on the view `S` shows: every entry under its stored key (`ckpt-tui tensors --stored`)
STORED_VIEW = "stored keys (S: export names)"


class Facts(Static):
    """The selected node's name, then the findings it is given (the caller orders them, errors first; one
    about another file names it), then the node's facts."""

    def show(self, node, findings, adapter=None) -> None:
        if node is None:
            self.update("")
            return
        t = Table.grid(padding=(0, 1))
        t.add_column(style="dim", no_wrap=True)
        t.add_column()
        for k, v in fact_rows(node, adapter):
            t.add_row(k, plain_text(v))  # a fact's value may come from the file: never markup
        parts: list[Text | Table] = [plain_text(node.path if node.path != "." else node.abspath.name, "bold")]
        for f in findings:  # what is wrong comes first
            line = Text()
            line.append(f"{GLYPH[f.severity]} {f.severity} ", style=SEV_STYLE[f.severity])
            line.append(visible(f.code), style="bold")
            if f.path != node.path:
                line.append(f" in {visible(f.path)}", style="bold")
            if f.fix:
                line.append(f"  press {fix_key(f.fix)}: {f.fix}", style="reverse")
            parts.append(line)
            parts.append(plain_text(f.message, lines=True))
            parts.append(Text(""))
        parts.append(t)
        self.update(Group(*parts))


class TensorTable(Vertical):
    """Rows are kept in memory and only the first MAX_ROWS matches are drawn, so a keystroke
    costs the same at 100,000 tensors as at 10.

    Column widths follow the table's width (recomputed on resize): every column but the name is as wide as
    its widest cell, and the name gets the rest, cut in the middle if it must be (``middle_ellipsis`` keeps
    the layer index and the leaf). Where the name would get fewer than ``NAME_ROOM`` cells, the size column
    goes, then the dtype; the shape stays."""

    DEFAULT_CSS = """
    TensorTable { height: 1fr; }
    TensorTable Input { height: 3; display: none; }
    TensorTable Input.visible { display: block; }
    TensorTable #tensor-count { height: 1; color: $text-muted; }
    TensorTable DataTable { height: 1fr; scrollbar-gutter: stable; scrollbar-size-vertical: 1; }
    """
    NAME_ROOM = 30  # `model.layers.10…q_proj.weight` and a cell to spare
    filter: reactive[str] = reactive("", init=False)  # what the rows are filtered by (the input's text)
    DROP_ORDER = ("size", "dtype")  # least useful first: bytes follow from dtype and shape

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.rows: list = []
        self.stats: dict[str, TensorStats] = {}
        self.last_filter_ms = 0.0
        self._shown: list = []  # the rows drawn (at most MAX_ROWS matches)
        self._with_stats = False
        self._drawn_width = -1
        self.stored = False  # the rows are the stored keys (`S`), not the names export writes

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter tensors by name…", id="tensor-filter")
        yield Static("", id="tensor-count")
        table: DataTable[Any] = DataTable(id="tensor-table", cursor_type="row", zebra_stripes=False)
        yield table

    def on_mount(self) -> None:
        self._draw()

    @property
    def columns(self) -> list[str]:
        """The columns drawn now (narrow tables drop some, see DROP_ORDER)."""
        return list(getattr(self, "_drawn_columns", []))

    def _cells(self, r) -> dict:
        dtype = short_dtype(r.dtype) + (f"↑{short_dtype(r.upcast_from)}" if r.upcast_from else "")  # fp32↑bf16
        cells = {
            "name": visible(r.name),
            "size": Text(size(r.nbytes)),
            "dtype": plain_text(dtype),
            "shape": plain_text(shape_text(r.shape)),
        }
        if not r.numel and getattr(self, "note", "").startswith(EMPTY_MARK):  # weights saved without gathering
            cells["shape"] = Text(f"✖ {shape_text(r.shape)}", style="bold red")
        if self._with_stats:
            st = self.stats.get(r.name)
            fmt = lambda v: "" if v is None else f"{v:.3g}"
            bad = 0 if st is None else st.nan + st.inf
            cells.update(
                {
                    "min": fmt(getattr(st, "min", None)),
                    "max": fmt(getattr(st, "max", None)),
                    "NaN/Inf": Text(f"✖ {bad}", style="bold red") if bad else ("" if st is None else "0"),
                }
            )
        return cells

    def _fit(self, cells: list[dict], room: Optional[int]) -> dict[str, int]:
        """Column -> width for ``room`` cells of table (None: unknown yet, every column as wide as its cells)."""
        cols = ["name", "size", "dtype", "shape"] + (["min", "max", "NaN/Inf"] if self._with_stats else [])
        natural = {c: max([cell_len(c)] + [cell_len(_plain(row[c])) for row in cells]) for c in cols}
        if room is None:
            return natural
        pad = 2 * self.query_one(DataTable).cell_padding

        def name_room(shown):
            return room - sum(natural[c] + pad for c in shown if c != "name") - pad

        for drop in self.DROP_ORDER:
            if name_room(cols) >= min(natural["name"], self.NAME_ROOM):
                break
            cols.remove(drop)
        widths = {c: natural[c] for c in cols}
        widths["name"] = max(cell_len("name"), min(natural["name"], name_room(cols)))
        return widths

    def _draw(self) -> None:
        """Columns and rows for the table's width now. Widths are set explicitly: a DataTable that measures
        its columns itself does so when idle, and a frame drawn before that (a loaded machine) kept a stale
        header row."""
        table = self.query_one(DataTable)
        width = self.content_size.width
        room = width - table.styles.scrollbar_size_vertical if width > 0 else None  # the bar's gutter is kept
        self._drawn_width = width
        cells = [self._cells(r) for r in self._shown]
        widths = self._fit(cells, room)
        self._drawn_columns = list(widths)
        cursor = table.cursor_row
        table.clear(columns=True)
        for c, w in widths.items():
            table.add_column(c, width=w, key=c)
        shown = distinct_cuts([row["name"] for row in cells], widths["name"])
        table.add_rows([[Text(cut) if c == "name" else row[c] for c in widths] for row, cut in zip(cells, shown)])
        if 0 < cursor < table.row_count:
            table.move_cursor(row=cursor, animate=False)

    def is_drawn(self) -> bool:
        """The table shows the current matches at its current width (what tests and snapshots wait for)."""
        return self._drawn_width == self.content_size.width > 0 and self.query_one(DataTable).row_count == len(
            self._shown
        )

    def on_resize(self) -> None:
        if self.content_size.width != self._drawn_width:
            self._draw()

    def set_rows(self, rows, note: str = "", *, stored: bool = False) -> None:
        """``stored``: the rows are every entry under its stored key (the caption says so), not the names export
        writes."""
        self.rows = list(rows)
        self._lower = [r.name.lower() for r in self.rows]
        self.note = note
        self.stored = stored
        if self.stats:
            self.stats = {}
            self._with_stats = False
        self.refilter()

    def set_stats(self, stats) -> None:
        self.stats = {s.listed_as: s for s in stats}  # the core names them as the listing does
        self._with_stats = True
        self.refilter()

    def watch_filter(self, text: str) -> None:
        self.refilter()

    def refilter(self) -> None:
        t0 = time.perf_counter()
        text = self.filter.strip().lower()
        shown: list[TensorInfo] = []
        matches = 0
        lower = getattr(self, "_lower", [])
        for r, low in zip(self.rows, lower):
            if text and text not in low:
                continue
            matches += 1
            if len(shown) < MAX_ROWS:
                shown.append(r)
        self._shown = shown
        self._draw()
        note = getattr(self, "note", "")
        count = f"{matches:,}/{len(self.rows):,} match '{text}'" if text else f"{matches:,} tensors"
        if matches > len(shown):
            count += f" ({len(shown)} shown)"
        if self.stored:
            count += f", {STORED_VIEW}"
        caption = plain_text(count + (f" — {note}" if note else ""))
        if note.startswith(EMPTY_MARK):
            caption.stylize("bold red")
        self.query_one("#tensor-count", Static).update(caption)
        self.last_filter_ms = (time.perf_counter() - t0) * 1000

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter = event.value  # the watcher redraws

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()

    def open_filter(self) -> None:
        inp = self.query_one(Input)
        inp.add_class("visible")
        inp.focus()


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


class Details(VerticalScroll):
    DEFAULT_CSS = """
    Details { height: 1fr; }
    Details Facts { height: auto; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Facts(id="facts")
