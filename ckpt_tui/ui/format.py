"""The TUI's styling of what core/present.py spells: severity styles, badge colours, node labels, fact rows.
Severity is a glyph as well as a colour.

Text from a checkpoint (names, paths, ``latest``, messages quoting them) is never parsed as Textual or Rich
markup, so no ``[@click=…]`` action and no link can come from a file: it is shown as :func:`plain` Content or a
:func:`plain_text` Text, its control characters as escapes (``core.safetext.visible``). Our own styling is spans
of those objects."""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.content import Content

from ..core.layout import deepspeed_layout
from ..core.present import GLYPH, MAIN_ROLES, SEVERITY_COLOR, param_count, role_badge, short_dtype, size, worst
from ..core.safetext import visible

__all__ = [
    "GLYPH",
    "SEV_STYLE",
    "BADGE_STYLE",
    "node_label",
    "fact_rows",
    "size",
    "worst",
    "middle_ellipsis",
    "plain",
    "plain_text",
    "visible",
]


def plain(text: object, *, lines: bool = True) -> Content:
    """``text`` as Content that is never markup, its control characters shown as escapes (newlines kept)."""
    return Content(visible(text, lines=lines))


def plain_text(text: object, style: str = "", *, lines: bool = False) -> Text:
    """``text`` as a Rich Text (never markup), its control characters shown as escapes."""
    return Text(visible(text, lines=lines), style=style)


SEV_STYLE = {sev: color if sev == "info" else f"bold {color}" for sev, color in SEVERITY_COLOR.items()}
BADGE_STYLE = {
    "model": "bold black on green",
    "optimizer": "bold black on magenta",
    "model+optimizer": "bold black on green",
}


# The space between two parts of a label is styled italic, which no part uses and nothing shows on a space: a
# style of its own keeps it from merging into the part after it. SVG renderers (rsvg) draw a segment that begins
# with a space without it (the screenshots showed `MODELpytorch_model.bin`), and a space alone as a gap.
GAP = Style(italic=True)


def node_label(node, findings=()) -> Text:
    """``▲ MODEL name/ 1.6 MB`` or ``name badge 1.6 MB``: one plain space between the parts, each part a
    styled span of one Text (a tree line never wraps: no non-breaking spaces)."""
    name = visible(node.abspath.name if node.path == "." else node.name) + ("/" if node.is_dir else "")
    sev = worst(findings)
    badge = role_badge(node.role)
    main = node.role in MAIN_ROLES
    parts: list[tuple[str, str]] = []
    if sev:
        parts.append((GLYPH[sev], SEV_STYLE[sev]))
    if badge and main:  # model/optimizer first, in capitals: never cut
        parts.append((badge.upper(), BADGE_STYLE.get(node.role, "reverse")))
    parts.append((name, "bold" if node.is_dir else ""))
    if badge and not main:
        parts.append((badge, "dim reverse"))
    if node.size:
        parts.append((size(node.size), "dim"))
    label = Text()
    for i, (text, style) in enumerate(parts):
        if i:
            label.append(" ", style=GAP)
        label.append(text, style=style)
    return label


def middle_ellipsis(name: str, width: int, sep: str = ".") -> str:
    """``name`` in at most ``width`` cells, cut in the middle where it must be: the start up to the first
    numeric component (the layer index) and the leaf are kept, then as many components before the leaf as
    fit, e.g. ``model.layers.10.self_attn.q_proj.weight`` in 29 cells is ``model.layers.10…q_proj.weight``.
    Left-over room shows the end of the next component after the cut. Narrower, the layer index stays
    whole and the leaf loses its start; narrower still, the name keeps as many characters of each end. A long
    start before the index (``model.model.layers.0``) gives way first: ``…layers.0…q_proj.weight``."""
    if cell_len(name) <= width:
        return name
    if width <= 1:
        return "…"[: max(width, 0)]
    parts = name.split(sep)
    index = next((i for i, p in enumerate(parts[1:-1], 1) if p.isdigit()), 0)
    head, tail = index + 1, 1  # components kept before and after the cut

    def cut(h: int, t: int) -> str:
        return sep.join(parts[:h]) + "…" + sep.join(parts[len(parts) - t :])

    if index >= 3 and len(parts) - head >= 2 and cell_len(cut(head, 2)) > width:
        # a long wrapper start (model.model.layers.0): keep the index's own name and the leaf's two parts
        short = "…" + sep.join(parts[index - 1 : head]) + "…" + sep.join(parts[-2:])
        if cell_len(short) <= width:
            return short
    if len(parts) < 3 or cell_len(cut(head, tail)) > width:
        start = sep.join(parts[:head])
        if index and cell_len(start) + 5 <= width:  # the layer index whole, the leaf's end
            return start + "…" + _cells_from_end(name, width - cell_len(start) - 1)
        left = width // 2  # characters: the start gets the odd one
        return _cells(name, left) + "…" + _cells_from_end(name, width - 1 - left)
    while head + tail < len(parts) and cell_len(cut(head, tail + 1)) <= width:
        tail += 1  # the leaf side grows (q_proj.weight): the start is kept only up to the layer index
    text = cut(head, tail)
    room = width - cell_len(text)
    if room >= 2 and head + tail < len(parts):  # the end of the next component, rather than blank cells
        after = _cells_from_end(parts[len(parts) - tail - 1] + sep, room)
        text = sep.join(parts[:head]) + "…" + after + sep.join(parts[len(parts) - tail :])
    return text


def _cells(text: str, n: int) -> str:
    out, used = [], 0
    for ch in text:
        w = cell_len(ch)
        if used + w > n:
            break
        out.append(ch)
        used += w
    return "".join(out)


def _cells_from_end(text: str, n: int) -> str:
    return _cells(text[::-1], n)[::-1]


def fact_rows(node) -> list[tuple[str, str]]:
    f = node.facts
    rows = []
    if node.framework:
        rows.append(("framework", node.framework))
    rows.append(("format", node.format))
    rows.append(("role", node.role))
    if f.get("zero_stage") is not None:
        rows.append(("ZeRO stage", str(f["zero_stage"])))
    if f.get("ds_layout") in ("zero-0", "bf16-optimizer", "pipeline"):
        rows.append(("layout", deepspeed_layout(f) or ""))
    if f.get("optimizer_class"):
        rows.append(("optimizer", f["optimizer_class"]))
    if f.get("world_size"):
        rows.append(("ranks", f"{f['world_size']} (present: {len(f.get('ranks_present') or [])})"))
    if f.get("train_dtype"):
        rows.append(("trained in", short_dtype(f["train_dtype"])))
    if f.get("dtypes"):
        rows.append(("dtype", ", ".join(short_dtype(d) for d in f["dtypes"])))
    if f.get("param_count"):
        rows.append(("params", f"{param_count(f['param_count'])} ({f['param_count']:,})"))
    if f.get("tensor_count"):
        rows.append(("tensors", f"{f['tensor_count']:,}"))
    rows.append(("size", size(node.size)))
    for k in ("global_step", "epoch"):
        if f.get(k) is not None:
            rows.append(("step" if k == "global_step" else k, str(f[k])))
    if "universal_checkpoint_info" in f:
        rows.append(("universal info", "present" if f["universal_checkpoint_info"] else "missing"))
    if f.get("names"):
        rows.append(("names", str(f["names"])[:60]))
    if f.get("error"):
        rows.append(("problem", str(f["error"])[:200]))
    return rows
