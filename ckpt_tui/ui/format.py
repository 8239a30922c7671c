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

from ..core.formats.deepspeed.moe import experts_words
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
    "distinct_cuts",
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
    "adapter": "bold black on cyan",
}


# The space between two parts of a label is styled italic, which no part uses and nothing shows on a space: a
# style of its own keeps it from merging into the part after it. SVG renderers (rsvg) draw a segment that begins
# with a space without it (the screenshots showed `MODELpytorch_model.bin`), and a space alone as a gap.
GAP = Style(italic=True)


def node_label(node, findings=(), *, adapter: bool = False) -> Text:
    """``▲ MODEL name/ 1.6 MB`` or ``name badge 1.6 MB``: one plain space between the parts, each part a
    styled span of one Text (a tree line never wraps: no non-breaking spaces). ``adapter``: the node holds a
    LoRA adapter (its badge says ADAPTER, not MODEL)."""
    name = visible(node.abspath.name if node.path == "." else node.name) + ("/" if node.is_dir else "")
    sev = worst(findings)
    badge = "adapter" if adapter else role_badge(node.role)
    main = adapter or node.role in MAIN_ROLES
    parts: list[tuple[str, str]] = []
    if sev:
        parts.append((GLYPH[sev], SEV_STYLE[sev]))
    if badge and main:  # model/optimizer first, in capitals: never cut
        parts.append((badge.upper(), BADGE_STYLE.get("adapter" if adapter else node.role, "reverse")))
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


# container prefixes wrappers put before a model's own names (PEFT, DDP/DeepSpeed, torch.compile, FSDP, DCP of a
# Trainer): a name that must be cut loses these first
WRAPPERS = ("base_model.model.", "module.", "_orig_mod.", "_fsdp_wrapped_module.", "model.base_model.model.")


def _unwrapped(name: str) -> str:
    for w in sorted(WRAPPERS, key=len, reverse=True):
        if name.startswith(w) and len(name) > len(w):
            return name[len(w) :]
    return name


def middle_ellipsis(name: str, width: int, sep: str = ".") -> str:
    """``name`` in at most ``width`` cells (:func:`_middle`); a wrapper's prefix (``base_model.model.``) gives way
    first, shown as a leading ``…``."""
    if cell_len(name) <= width:
        return name
    bare = _unwrapped(name)
    if bare != name and width >= 12:
        return "…" + _middle(bare, width - 1, sep)
    return _middle(name, width, sep)


def distinct_cuts(names: list[str], width: int, sep: str = ".") -> list[str]:
    """Each of ``names`` cut to ``width`` cells (:func:`middle_ellipsis`) so that names that differ read
    differently: where two cuts of different names agree, each keeps the component where they part (the
    ``q_proj`` of one and the ``v_proj`` of the other) and as much after it as fits."""
    cuts = [middle_ellipsis(n, width, sep) for n in names]
    groups: dict[str, set[str]] = {}
    for n, c in zip(names, cuts):
        groups.setdefault(c, set()).add(n)
    clashing = {c: sorted(g) for c, g in groups.items() if len(g) > 1}
    if not clashing or width < 8:
        return cuts
    for i, (n, c) in enumerate(zip(names, cuts)):
        group = clashing.get(c)
        if group is None:
            continue
        parts = n.split(sep)
        others = [o.split(sep) for o in group if o != n]
        # from the end, the component where this name has parted from every other of its group
        d = max(
            (
                next((k for k in range(1, len(parts) + 1) if k > len(o) or parts[-k] != o[-k]), len(parts))
                for o in others
            ),
        )
        keep = sep.join(parts[len(parts) - d :])  # the parting component and everything after it
        head = parts[: len(parts) - d]
        start = sep.join(head)
        idx = next((k for k in range(1, len(head)) if head[k].isdigit()), 0)  # the layer index, if any
        layer = sep.join(head[idx - 1 : idx + 1]) if idx else ""  # `layers.0`
        num = head[idx] if idx else ""
        room = width - cell_len(keep) - 1  # the start and what joins it to ``keep``
        cut = middle_ellipsis(start, room, sep) if room >= 2 else ""
        # most to least of the name; once a layer index is there, no form drops it
        options = [
            start + sep + keep if start else keep,
            cut + "…" + keep if cut and (not layer or layer in cut) else "",
            "…" + layer + "…" + keep if layer else "",
            "…" + num + sep + keep if num and idx == len(head) - 1 else "",
            "…" + num + "…" + keep if num else "",
            num + "…" + keep if num else "",
            "…" + keep if not num else "",
            num + "…" + _cells_from_end(keep, width - cell_len(num) - 1) if num and width > cell_len(num) + 4 else "",
        ]
        cuts[i] = next((o for o in options if o and cell_len(o) <= width), "…" + _cells_from_end(n, width - 1))
    return cuts


def _middle(name: str, width: int, sep: str = ".") -> str:
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


def adapter_rows(info) -> list[tuple[str, str]]:
    """The facts of a LoRA adapter (core.adapters.found.AdapterInfo): what it is and where its base is."""
    rows = [("adapter", info.what())]
    cfg, base = info.config, info.base
    if cfg is None:
        rows.append(("config", "no adapter_config.json: an export needs --adapter-config"))
    elif base is None or base.recorded is None:
        rows.append(("base", "not recorded: --merge needs --base"))
    elif base.found is not None:
        rows.append(("base", f"{base.recorded} (found at {info.shown(base.found)})"))
    else:
        rows.append(("base", f"{base.recorded} (not found: --merge needs --base)"))
    return rows


def fact_rows(node, adapter=None) -> list[tuple[str, str]]:
    """The facts shown for ``node``; ``adapter``: the LoRA adapter it holds (AdapterInfo), if it holds one."""
    f = node.facts
    rows = []
    if node.framework:
        rows.append(("framework", node.framework))
    rows.append(("format", node.format))
    rows.append(("role", node.role))
    if adapter is not None:
        rows += adapter_rows(adapter)
    if f.get("zero_stage") is not None:
        rows.append(("ZeRO stage", str(f["zero_stage"])))
    if f.get("ds_layout") in ("zero-0", "bf16-optimizer", "pipeline"):
        rows.append(("layout", deepspeed_layout(f) or ""))
    if f.get("num_experts"):
        rows.append(("experts", experts_words(f) or ""))
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
    if f.get("model_tensor_count") and f.get("tensor_count"):  # the model's, as listed and exported; then the rest
        rows.append(("tensors", f"{f['model_tensor_count']:,} of the model ({f['tensor_count']:,} entries in all)"))
    elif f.get("tensor_count"):
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
