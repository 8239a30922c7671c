"""One registry of actions: it feeds the key bindings, the footer, the help screen and the
command palette, so they never disagree. Each has a stable ``id`` users can remap."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Action:
    id: str
    key: str
    action: str
    label: str
    help: str
    show: bool = True
    key_display: str | None = None


ACTIONS = (
    Action("export", "e", "export", "Export", "Export the model weights to safetensors (wizard)"),
    Action("universal", "u", "universal", "Universal", "Convert a DeepSpeed checkpoint to a universal checkpoint (wizard)"),
    Action("fix", "x", "fix", "Fix", "Repair the highlighted or first fixable finding (wizard)"),
    Action("findings", "f", "findings", "Findings", "All findings of the tree, most severe first"),
    Action("filter", "slash", "filter", "Filter", "Filter the tensor table by name", key_display="/"),
    Action("stats", "s", "stats", "Stats", "Compute min/max/NaN of every tensor of the selected component",
           show=False),
    Action("jobs", "j_panel", "noop", "", "", show=False),
    Action("cancel", "c", "cancel_job", "Cancel", "Cancel the running job (asks first)"),
    Action("rescan", "r", "rescan", "Rescan", "Scan the checkpoint again", show=False),
    Action("theme", "t", "toggle_theme", "Theme", "Switch between the dark and the light theme", show=False),
    Action("help", "question_mark", "help", "Help", "Keys and what each finding means", key_display="?"),
    Action("quit", "q", "quit_app", "Quit", "Quit (asks if a job is running)"),
)


def bindings() -> list[Binding]:
    out = []
    for a in ACTIONS:
        if a.action == "noop":
            continue
        out.append(Binding(a.key, a.action, a.label, show=a.show, key_display=a.key_display, tooltip=a.help,
                           id=f"ckpt.{a.id}"))
    return out
