"""Text the UI shows: badges, glyphs, humanized sizes. Severity is a glyph as well as a colour."""

from __future__ import annotations

import humanize
from rich.text import Text

from ..core.humanize_bytes import count
from ..core.dtypes import short_dtype

GLYPH = {"error": "✖", "warning": "▲", "info": "●"}
SEV_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "cyan"}
ROLE_BADGE = {"model": "MODEL", "optimizer": "OPTIM", "model+optimizer": "MODEL+OPTIM", "rng": "rng",
              "scheduler": "sched", "trainer-state": "state", "training-args": "args", "config": "config",
              "tokenizer": "tok", "script": "script", "data-loader": "data", "marker": "marker",
              "checkpoint": "ckpt", "run": "run", "scaler": "scaler"}
BADGE_STYLE = {"MODEL": "bold black on green", "OPTIM": "bold black on magenta", "MODEL+OPTIM": "bold black on green"}


def size(n: int | None) -> str:
    return humanize.naturalsize(n or 0, format="%.1f")


def worst(findings) -> str | None:
    order = {"error": 0, "warning": 1, "info": 2}
    return min((f.severity for f in findings), key=lambda s: order[s], default=None)


def node_label(node, findings=()) -> Text:
    name = (node.abspath.name if node.path == "." else node.name) + ("/" if node.is_dir else "")
    t = Text()
    sev = worst(findings)
    if sev:
        t.append(GLYPH[sev] + " ", style=SEV_STYLE[sev])
    badge = ROLE_BADGE.get(node.role)
    if badge and node.role not in ("shard", "metadata") and badge.isupper():  # model/optimizer first: never cut
        t.append(f"{badge}", style=BADGE_STYLE.get(badge, "reverse"))
        t.append("\u00a0")
    t.append(name, style="bold" if node.is_dir else "")
    if badge and node.role not in ("shard", "metadata") and not badge.isupper():
        t.append("\u00a0")
        t.append(f"{badge}", style="dim reverse")
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
        rows.append(("params", f"{count(f['param_count'])} ({f['param_count']:,})"))
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
