"""The TUI's styling of what core/present.py spells: severity styles, badge colours, node labels, fact rows.
Severity is a glyph as well as a colour."""

from __future__ import annotations

from rich.text import Text

from ..core.present import GLYPH, MAIN_ROLES, SEVERITY_COLOR, param_count, role_badge, short_dtype, size, worst

__all__ = ["GLYPH", "SEV_STYLE", "BADGE_STYLE", "node_label", "fact_rows", "size", "worst"]

SEV_STYLE = {sev: color if sev == "info" else f"bold {color}" for sev, color in SEVERITY_COLOR.items()}
BADGE_STYLE = {"model": "bold black on green", "optimizer": "bold black on magenta",
               "model+optimizer": "bold black on green"}


def node_label(node, findings=()) -> Text:
    name = (node.abspath.name if node.path == "." else node.name) + ("/" if node.is_dir else "")
    t = Text()
    sev = worst(findings)
    if sev:
        t.append(GLYPH[sev] + " ", style=SEV_STYLE[sev])
    badge = role_badge(node.role)
    main = node.role in MAIN_ROLES
    if badge and main:  # model/optimizer first, in capitals: never cut
        t.append(badge.upper(), style=BADGE_STYLE.get(node.role, "reverse"))
        t.append("\u00a0")
    t.append(name, style="bold" if node.is_dir else "")
    if badge and not main:
        t.append("\u00a0")
        t.append(badge, style="dim reverse")
    if node.size:
        t.append(f"\u00a0{size(node.size)}", style="dim")
    return t


def fact_rows(node) -> list[tuple[str, str]]:
    f = node.facts
    rows = []
    if node.framework:
        rows.append(("framework", node.framework))
    rows.append(("format", node.format))
    rows.append(("role", node.role))
    if f.get("zero_stage") is not None:
        rows.append(("ZeRO stage", str(f["zero_stage"])))
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
