"""ckpt-tui's terminal UI: browse, understand and fix a checkpoint from the keyboard."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Footer, Static, Tree

from ..core.present import GLYPH
from ..core.report import Report
from ..core.types import Node
from .actions import ACTIONS, bindings
from .job_actions import JobActions
from .jobs import Job, JobFinished, JobProgress, run_in_thread
from .screens.dialogs import ConfirmDialog, HelpScreen, MessageDialog
from .widgets.details import Details, Facts, TensorTable
from .widgets.jobs_panel import JobsPanel
from .widgets.tree import CheckpointTree


class TreeReady(Message):
    def __init__(self, root: Node) -> None:
        super().__init__()
        self.root = root


class TensorsReady(Message):
    def __init__(self, path: str, rows, note: str, component: str) -> None:
        super().__init__()
        self.path, self.rows, self.note, self.component = path, rows, note, component


class CkptApp(JobActions, App):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere keep it
    TITLE = "ckpt-tui"
    BINDINGS = bindings()

    def __init__(self, path: str | Path, *, clock=None, trust_pickles: bool = False):
        super().__init__()
        self.path = Path(path)
        self.report: Optional[Report] = None
        self.clock = clock
        self.trust_pickles = trust_pickles
        self.selected: Optional[Node] = None
        self.jobs: list[Job] = []
        self._scan_job: Optional[Job] = None
        self._tensor_cache: dict[str, tuple] = {}
        self.crash: Optional[BaseException] = None  # the first unhandled exception (see ui/run.py)
        self.show_tracebacks = False  # --debug: Textual prints its own traceback at exit

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static(f"Scanning {self.path} …", id="summary")
        with Horizontal(id="main"):
            yield CheckpointTree(id="tree")
            with Vertical(id="right"):
                yield Details()
                yield TensorTable()
        yield JobsPanel(clock=self.clock, id="jobs")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self._main(CheckpointTree).focus()
        self.start_scan()

    def _main(self, selector, expect=None):
        """Widgets of the main screen, even while a dialog or wizard is on top."""
        screen = self.screen_stack[0] if self.screen_stack else self.screen
        return screen.query_one(selector, expect) if expect is not None else screen.query_one(selector)

    # ------------------------------------------------------------------ scanning
    def start_scan(self) -> None:
        from ..core.report import inspect

        job = Job(f"scan {self.path.name}", "scan")
        self._scan_job = job
        state: dict = {"root": None, "sent": False}

        def fn(on_progress, cancel):
            def on_node(ev):
                if state["root"] is None:
                    state["root"] = ev.node  # the walk reports the root first
                if ev.kind == "analyzed" and not state["sent"]:
                    state["sent"] = True  # the walk is complete: draw the whole tree at once
                    self.post_message(TreeReady(state["root"]))

            return inspect(self.path, on_node=on_node, on_progress=on_progress, cancel=cancel,
                           trust_pickles=self.trust_pickles)

        self._start(job, fn, show=False)

    def on_tree_ready(self, msg: TreeReady) -> None:
        if self.screen_stack and self.report is None and msg.root is not None:
            self._main(CheckpointTree).load(msg.root, {})

    def _scan_done(self, job: Job) -> None:
        if job.state != "done":
            if job.state == "failed":
                self._main("#summary", Static).update(f"✖ {job.error}")
                self.push_screen(MessageDialog("Cannot open this path", job.error, error=True))
            return
        self.report = job.result
        # the inventory is long-lived: move it out of the GC's way, so later collections (which run
        # on the UI thread) do not walk hundreds of thousands of nodes between two key presses
        import gc

        gc.freeze()
        self._tensor_cache = {}
        self._shown_component = "unset"
        inv = self.report.inventory
        by_path: dict[str, list] = {}
        for f in self.report.findings:
            by_path.setdefault(f.path, []).append(f)
        counts = {s: sum(1 for f in self.report.findings if f.severity == s) for s in GLYPH}
        marks = "  ".join(f"{g} {counts[s]}" for s, g in GLYPH.items() if counts[s])
        self._main("#summary", Static).update(inv.summary + (f"   [{marks}]" if marks else "   ✔ no problems"))
        tree = self._main(CheckpointTree)
        tree.load(inv.root, by_path)
        target = inv.model_path()
        if inv.layout == "run-folder" and inv.checkpoints:
            target = inv.checkpoints[0]["path"]
        if target:
            tree.select_path(target)
        self.show_node(inv.node(target) if target else inv.root)

    # ------------------------------------------------------------------ details
    @on(Tree.NodeHighlighted)
    def _highlighted(self, event: Tree.NodeHighlighted) -> None:
        # the scan's tree.select_path posts this; it can arrive after the app began closing
        if self.screen_stack and isinstance(event.node.data, Node):
            self.show_node(event.node.data)

    def show_node(self, node: Optional[Node]) -> None:
        if node is None:
            return
        self.selected = node
        findings = [f for f in (self.report.findings if self.report else []) if f.path == node.path]
        self._main(Facts).show(node, findings)
        if self.report is not None:
            self.load_tensors(node)

    def _component_for(self, node: Node) -> tuple[Optional[Node], str]:
        if node.format in ("dcp", "deepspeed-zero", "deepspeed-universal", "safetensors",
                           "safetensors-sharded-index") or (node.format == "torch-zip" and node.facts.get("tensor_count")):
            return node, ""
        if self.report is None:
            return None, ""
        from ..core.layout import classify
        from ..core.types import model_component

        if node.is_dir:
            rel = model_component(classify(node)[1])
            if rel:
                sub = self.report.inventory.node(rel)
                if sub is not None:
                    return sub, f"model component `{rel}`"
        return None, ""

    def load_tensors(self, node: Node) -> None:
        comp, note = self._component_for(node)
        key = comp.path if comp is not None else None
        if key == getattr(self, "_shown_component", "unset"):
            return  # moving inside the same component: the table is already right
        self._shown_component = key
        if comp is None:
            self._main(TensorTable).set_rows([], "")
            return
        cached = self._tensor_cache.get(key)
        if cached is not None:
            self._main(TensorTable).set_rows(*cached)
            return
        self._list_tensors(node.path, comp, note, self.report.inventory.parsed)

    @work(thread=True, exclusive=True, group="tensors", exit_on_error=False)
    def _list_tensors(self, path: str, comp: Node, note: str, parsed) -> None:
        from ..core.tensors import list_tensors

        rows = []
        try:
            rows = list(list_tensors(comp, parsed))
        except Exception as e:  # a broken file: say so in the table's caption
            note = f"cannot list tensors: {e}"
        self.post_message(TensorsReady(path, rows, note, comp.path))  # the UI thread caches and shows it

    def on_tensors_ready(self, msg: TensorsReady) -> None:
        import gc

        gc.freeze()  # the listing is long-lived too (see _scan_done)
        self._tensor_cache[msg.component] = (msg.rows, msg.note)
        if self.screen_stack and self.selected is not None and self.selected.path == msg.path:
            self._main(TensorTable).set_rows(msg.rows, msg.note)

    # ------------------------------------------------------------------ jobs
    def _start(self, job: Job, fn, show: bool = True) -> None:
        self.jobs.append(job)
        if show:
            self._main(JobsPanel).add_job(job)
        run_in_thread(self, job, fn)

    def on_job_progress(self, msg: JobProgress) -> None:
        if self.screen_stack:
            self._main(JobsPanel).update_job(msg.job)

    def on_job_finished(self, msg: JobFinished) -> None:
        job = msg.job
        if not self.screen_stack:  # the app is closing
            return
        self._main(JobsPanel).update_job(job)
        if job.kind == "scan":
            self._scan_done(job)
            return
        if job.state == "failed":
            body = job.error + (f"\n\nLog: {job.log}" if job.log else "")
            self.push_screen(MessageDialog(f"{job.title} failed", body, error=True))
        elif job.state == "cancelled":
            self.notify(f"{job.title}: cancelled. {job.cleanup_note}".strip())
        elif job.state == "done":
            handler = getattr(self, f"_done_{job.kind}", None)
            if handler:
                handler(job)

    def running_jobs(self) -> list[Job]:
        return [j for j in self.jobs if j.state == "running" and j.kind != "scan"]

    def action_cancel_job(self) -> None:
        running = self.running_jobs()
        if not running:
            self.notify("No job is running.")
            return
        job = running[-1]

        def answer(yes: bool | None) -> None:
            if yes and job.state == "running":
                job.cancel.set()

        self.push_screen(ConfirmDialog(f"Cancel {job.title}?", job.cleanup_note or "", yes="Cancel job",
                                       no="Keep running"), answer)

    def action_quit_app(self) -> None:
        if self.running_jobs():
            def answer(yes: bool | None) -> None:
                if yes:
                    for j in self.running_jobs():
                        j.cancel.set()
                    self.exit()

            self.push_screen(ConfirmDialog("A job is running. Quit anyway?",
                                           "Running jobs are cancelled and their temp output removed.",
                                           yes="Quit", no="Stay"), answer)
        else:
            self.exit()

    # ------------------------------------------------------------------ actions
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_rescan(self) -> None:
        self.report = None
        self._main("#summary", Static).update(f"Scanning {self.path} …")
        self.start_scan()

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def action_filter(self) -> None:
        self._main(TensorTable).open_filter()

    def action_findings(self) -> None:
        if self.report is None:
            self.notify("Still scanning…")
            return
        from .screens.findings import FindingsScreen

        def done(res) -> None:
            if not res:
                return
            kind, finding = res
            self._main(CheckpointTree).select_path(finding.path)
            node = self.report.inventory.node(finding.path)
            self.show_node(node)
            if kind == "fix":
                self.start_fix(finding)

        self.push_screen(FindingsScreen(self.report.findings), done)

    # ------------------------------------------------------------------ crashes (ui/run.py reports them)
    def _handle_exception(self, error: Exception) -> None:
        if self.crash is None:
            self.crash = error
        super()._handle_exception(error)

    def _print_error_renderables(self) -> None:
        """Textual prints a full traceback after restoring the terminal; we print one line and a log
        file instead (ui/run.py), unless --debug asked for the traceback."""
        if self.show_tracebacks:
            super()._print_error_renderables()
        else:
            self._exit_renderables.clear()

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            if a.action != "noop":
                yield SystemCommand(a.label or a.id, a.help, getattr(self, f"action_{a.action}"))


def make_app(path, **kw) -> CkptApp:
    """The one factory used by the entry point, the tests and the screenshot script."""
    return CkptApp(path, **kw)
