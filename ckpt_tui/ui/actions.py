"""One registry of actions: it feeds the key bindings, the footer, the help screen and the
command palette, so they never disagree. Each has a stable ``id`` users can remap.

``needs`` says when an action can run; the main screen's ``check_action`` dims it in the footer
otherwise, and its tooltip and the help screen say why."""

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
    needs: str = ""  # when it can run, said in its tooltip ("" = always)
    app: bool = False  # bound on the App (works over every screen) rather than the main screen


ACTIONS = (
    Action(
        "export", "e", "export", "Export", "Export the model weights to safetensors (wizard)", needs="a finished scan"
    ),
    Action(
        "universal",
        "u",
        "universal",
        "Universal",
        "Convert a DeepSpeed checkpoint to a universal checkpoint (wizard)",
        needs="a finished scan that found a DeepSpeed ZeRO checkpoint",
    ),
    Action(
        "resume",
        "m",
        "resume_fsdp2",
        "FSDP2",
        "Resume a DeepSpeed run under torch FSDP2: convert it to a torch DCP at any world size (wizard)",
        show=False,  # 80 columns hold e u x f s c ? q
        needs="a finished scan that found a DeepSpeed ZeRO checkpoint",
    ),
    Action(
        "fix",
        "x",
        "fix",
        "Fix",
        "Repair the most severe fixable finding, the highlighted node's first (wizard)",
        needs="a finished scan with a fixable finding",
    ),
    Action(
        "findings", "f", "findings", "Findings", "All findings of the tree, most severe first", needs="a finished scan"
    ),
    Action(
        "stats",
        "s",
        "stats",
        "Stats",
        "Compute min/max/NaN of every tensor of the selected component",
        needs="a finished scan and a selected component with tensors",
    ),
    Action(
        "filter", "slash", "filter", "Filter", "Filter the tensor table by name", key_display="/", show=False
    ),  # 80 columns hold e u x f s c ? q
    Action("cancel", "c", "cancel_job", "Cancel", "Cancel the running job (asks first)", needs="a running job"),
    Action(
        "narrow",
        "less_than_sign",
        "tree_narrower",
        "Tree",
        "Narrow the tree pane (the details widen)",
        show=False,
        key_display="<",
    ),
    Action(
        "widen",
        "greater_than_sign",
        "tree_wider",
        "Tree",
        "Widen the tree pane (the details narrow)",
        show=False,
        key_display=">",
    ),
    Action("rescan", "r", "rescan", "Rescan", "Scan the checkpoint again", show=False),
    Action("theme", "t", "toggle_theme", "Theme", "Switch between the dark and the light theme", show=False, app=True),
    Action("help", "question_mark", "help", "Help", "Keys and what each finding means", key_display="?", app=True),
    Action("quit", "q", "quit_app", "Quit", "Quit (asks if a job is running)", app=True),
)


def tooltip(a: Action) -> str:
    return a.help + (f". Needs {a.needs}: dimmed until then." if a.needs else "")


def bindings(*, app: bool) -> list[Binding]:
    """The bindings of the App (``app=True``) or of the main screen."""
    return [
        Binding(a.key, a.action, a.label, show=a.show, key_display=a.key_display, tooltip=tooltip(a), id=f"ckpt.{a.id}")
        for a in ACTIONS
        if a.app == app
    ]
