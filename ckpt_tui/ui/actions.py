"""One registry of actions: it feeds the key bindings, the footer, the help screen and the
command palette, so they never disagree. Each has a stable ``id`` users can remap.

Whether an action can run now is the action's own question: ``Action.why_not(screen)`` asks its
``checks`` in order; the main screen's ``check_action`` dims it in the footer while one answers, the
help screen and the palette say that answer, and ``needs`` says it in the tooltip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from textual.binding import Binding, BindingType

from ..core.storage import is_url
from ..core.types import MODEL_ROLES
from .host import Host

# why an action cannot run on the main screen now, or None when this check lets it
Check = Callable[[Host], Optional[str]]


def scanned(screen: Host) -> Optional[str]:
    return "still scanning" if screen.report is None else None


def local(screen: Host) -> Optional[str]:
    """It writes beside the checkpoint: not one in object storage."""
    if screen.report is not None and is_url(screen.report.inventory.given):
        return "the checkpoint is in object storage: this writes beside it (export reads it)"
    return None


def deepspeed_tag(screen: Host) -> Optional[str]:
    tag, why = screen.universal_choice()
    return why if tag is None else None


def fixable(screen: Host) -> Optional[str]:
    return None if screen.fixable() else "nothing here has a fix"


def model_component(screen: Host) -> Optional[str]:
    comp = screen.component_for(screen.selected)[0] if screen.selected is not None else None
    if comp is None:
        return "select a component with tensors"
    if comp.role not in MODEL_ROLES:
        return "statistics are of model weights: select the model component"
    return None


def export_names(screen: Host) -> Optional[str]:
    """Statistics are named as export writes the tensors: the table must show those names to hold them."""
    return "the table shows the stored keys: press S for the names export writes" if screen.stored_names else None


def run_view(screen: Host) -> Optional[str]:
    """Prune works on a run folder: the run view shows (the run's own line is selected)."""
    if screen.run_view is None:
        return "open a run folder (its checkpoints' run view)"
    if screen.selected is None or screen.selected.path != ".":
        return "select the run's own line (the tree's top): its run view"
    return None


def running_job(screen: Host) -> Optional[str]:
    return None if screen.running_jobs() else "no job is running"


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
    checks: tuple[Check, ...] = ()  # asked in order by why_not

    def why_not(self, screen: Host) -> Optional[str]:
        """Why this action cannot run on ``screen`` now, or None when it can."""
        for check in self.checks:
            why = check(screen)
            if why:
                return why
        return None


ACTIONS = (
    Action(
        "export",
        "e",
        "export",
        "Export",
        "Export the model weights to safetensors (wizard)",
        needs="a finished scan",
        checks=(scanned,),
    ),
    Action(
        "universal",
        "u",
        "universal",
        "Universal",
        "Convert a DeepSpeed checkpoint to a universal checkpoint (wizard)",
        needs="a finished scan that found a DeepSpeed ZeRO checkpoint",
        checks=(scanned, local, deepspeed_tag),
    ),
    Action(
        "resume",
        "m",
        "resume_fsdp2",
        "FSDP2",
        "Resume a DeepSpeed run under torch FSDP2: convert it to a torch DCP at any world size (wizard)",
        show=False,  # 80 columns hold e u x f s c ? q
        needs="a finished scan that found a DeepSpeed ZeRO checkpoint",
        checks=(scanned, local, deepspeed_tag),
    ),
    Action(
        "fix",
        "x",
        "fix",
        "Fix",
        "Repair the most severe fixable finding, the highlighted node's first (wizard)",
        needs="a finished scan with a fixable finding",
        checks=(scanned, local, fixable),
    ),
    Action(
        "findings",
        "f",
        "findings",
        "Findings",
        "All findings of the tree, most severe first",
        needs="a finished scan",
        checks=(scanned,),
    ),
    Action(
        "stats",
        "s",
        "stats",
        "Stats",
        "Compute min/max/NaN of every tensor of the selected component",
        needs="a finished scan and a selected component with tensors, listed under the names export writes",
        checks=(scanned, model_component, export_names),
    ),
    Action(
        "prune",
        "p",
        "prune",
        "Prune",
        "Prune the run: remove older checkpoints' optimizer state, or older checkpoints, by a plan (wizard)",
        show=False,  # 80 columns hold e u x f s c ? q
        needs="a finished scan of a run folder, its run view shown",
        checks=(scanned, local, run_view),
    ),
    Action(
        "filter", "slash", "filter", "Filter", "Filter the tensor table by name", key_display="/", show=False
    ),  # 80 columns hold e u x f s c ? q
    Action(
        "stored",
        "S",
        "toggle_stored",
        "Stored keys",
        "Tensor table: the keys as stored (a DCP's optimizer state too), or back to the names export writes",
        show=False,  # 80 columns hold e u x f s c ? q
    ),
    Action(
        "cancel",
        "c",
        "cancel_job",
        "Cancel",
        "Cancel the running job (asks first)",
        needs="a running job",
        checks=(running_job,),
    ),
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


BY_ACTION = {a.action: a for a in ACTIONS}  # the Textual action name (what check_action is asked) -> its Action


def bindings(*, app: bool) -> list[BindingType]:
    """The bindings of the App (``app=True``) or of the main screen."""
    return [
        Binding(a.key, a.action, a.label, show=a.show, key_display=a.key_display, tooltip=tooltip(a), id=f"ckpt.{a.id}")
        for a in ACTIONS
        if a.app == app
    ]
