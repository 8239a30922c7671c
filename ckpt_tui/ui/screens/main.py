"""The main screen: the checkpoint tree (left), the selected node's findings and facts over its tensors
(right), the jobs panel and the footer.

Its state is reactive and each watcher repaints one thing: ``report`` (the scan's result), ``selected`` (the
highlighted node), ``listing`` (the tensor table's rows and note), ``stored_names`` (the table's view: the names
export writes, or with `S` the keys as stored), ``stats`` and ``tree_width``. Bindings that
cannot run now are dimmed by ``check_action``; ``why_not`` says why (help screen, palette). Every job is a
Textual worker over a core function (ui/jobs.py) of a registered kind (ui/job_kinds.py): the keys open the
kinds' wizards and ``on_worker_state_changed`` hands every end to the job's kind."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from textual import on
from textual.app import ComposeResult
from textual.clock import Clock
from textual.containers import Horizontal, Vertical
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static, Tree
from textual.worker import Worker

from ...core.export.plan import ExportPlan
from ...core.formats.registry import format_of
from ...core.present import GLYPH
from ...core.progress import Progress
from ...core.report import Report
from ...core.types import Finding, Inventory, Node, Parsed, TensorInfo
from ..actions import BY_ACTION, bindings
from ..format import plain
from ..host import TensorRows
from ..job_kinds import EXPORT, JOB_KINDS, PRUNE, REPAIR, RESUME, SCAN, STATS, TENSORS, UNIVERSAL, by_severity
from ..jobs import PROGRESS_EVERY, JobFn, JobInfo, JobProgress, error_text, outcome, request_cancel, run_job
from ..widgets.details import Details, Facts, TensorTable
from ..widgets.jobs_panel import JobsPanel, progress_text
from ..widgets.run_view import RunPanel
from ..widgets.tree import CheckpointTree
from .dialogs import ConfirmDialog, MessageDialog

Listing = tuple[tuple[TensorInfo, ...], str, bool]  # the tensor table's rows, note and view (stored keys?)
if TYPE_CHECKING:
    from ...core.analysis import TensorStats
    from ...core.progress import OnProgress
    from ...core.run_view import RunView
    from ...core.scan import ScanEvent
    from ...core.storage import Location

# seconds after the walk's end at which the tree is shown while the files are still being analysed: a scan that
# ends before shows its tree once, with its findings (drawing it twice took the GIL from a run folder's scan)
EARLY_TREE_AFTER = 1.0
TREE_WIDTHS = (20, 30, 40, 50, 60, 70)  # the tree pane's share of the width, in percent; `<` / `>` step through


class TreeReady(Message):
    def __init__(self, root: Node) -> None:
        super().__init__()
        self.root = root


class MainScreen(Screen[None]):
    CSS_PATH = Path(__file__).with_name("main.tcss")
    BINDINGS = bindings(app=False)

    report: reactive[Optional[Report]] = reactive(None, init=False, bindings=True)
    selected: reactive[Optional[Node]] = reactive(None, init=False, bindings=True, always_update=True)
    listing: reactive[Listing] = reactive(((), "", False), init=False)  # (rows, note, view) of the shown component
    # the table's view (`S`): the keys as stored (`ckpt-tui tensors --stored`), not the names export writes
    stored_names: reactive[bool] = reactive(False, init=False, bindings=True)
    stats: reactive[tuple[TensorStats, ...]] = reactive((), init=False)  # of the shown component, after `s`
    tree_width: reactive[int] = reactive(0, init=False)  # 0: by content (CheckpointTree); else % set by < / >

    def __init__(self, path: Location, *, clock: Optional[Clock] = None, trust_pickles: bool = False) -> None:
        super().__init__()
        self.path = path
        self.clock = clock
        self.trust_pickles = trust_pickles
        self.jobs: dict[Worker[Any], JobInfo] = {}  # every job started, in order; the worker holds its state
        self._tensor_cache: dict[tuple[bool, str], Listing] = {}  # (stored keys?, component) -> its listing
        self.shown_component: Optional[str] = None  # the key of the component the table shows (None: not yet)
        self._shown_stored = False  # the view the table shows shown_component in
        self._early_root: Optional[Node] = None
        self.run_view: Optional[RunView] = None  # a run folder's (core/run_view.py), made by the scan's worker
        self._scan_worker: Optional[Worker[Report]] = None  # the latest scan (a rescan replaces it)
        self._tree_timer: Optional[Timer] = None  # shows the walked tree while a slow analysis goes on

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static(plain(f"Scanning {self.path} …"), id="summary")
        with Horizontal(id="main"):
            yield CheckpointTree(id="tree")
            with Vertical(id="right"):
                yield RunPanel(id="run")
                yield Details()
                yield Static("", id="stats-summary")
                yield TensorTable()
        yield JobsPanel(clock=self.clock, id="jobs")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(CheckpointTree).focus()
        self.call_after_refresh(self.start_scan)  # after the first paint, which the scan's thread would slow

    # ------------------------------------------------------------------ what can run now
    def why_not(self, action: str) -> Optional[str]:
        """Why the action named ``action`` cannot run now (the action's own checks: ui/actions.py), or None."""
        a = BY_ACTION.get(action)
        return a.why_not(self) if a is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return None if self.why_not(action) else True  # None: shown dimmed in the footer

    _bindings_asked = False  # a refresh of the bindings is asked for and not yet published

    def refresh_bindings(self) -> None:
        """Once per screen refresh, however often asked: the footer mounts every key anew on each, and a scan's
        start and end ask eight times in a row (each job's start and state, ``report`` and ``selected``)."""
        if self._bindings_asked:
            return
        self._bindings_asked = True
        if not self.call_after_refresh(self._publish_bindings):  # not running (yet, or any more)
            self._publish_bindings()

    def _publish_bindings(self) -> None:
        self._bindings_asked = False
        super().refresh_bindings()

    # ------------------------------------------------------------------ jobs
    def start_job(self, info: JobInfo, fn: JobFn, *, exclusive: bool = False) -> Worker[Any]:
        """Run ``fn`` as a job of kind ``info.kind`` (a name in JOB_KINDS)."""
        worker = run_job(self, info, fn, exclusive=exclusive)
        self.jobs[worker] = info
        if JOB_KINDS[info.kind].listed:  # only a listed job changes what the keys can do (actions.running_job)
            self.query_one(JobsPanel).add_job(worker, info)
            self.refresh_bindings()
        return worker

    def running_jobs(self) -> list[Worker[Any]]:
        return [w for w, info in self.jobs.items() if JOB_KINDS[info.kind].listed and outcome(w) == "running"]

    def on_job_progress(self, msg: JobProgress) -> None:
        self._show_progress(msg.worker, msg.progress)  # read first, always (ui/jobs.py: then again, paced)
        self.set_timer(PROGRESS_EVERY, lambda: self._progress_again(msg))

    def _progress_again(self, msg: JobProgress) -> None:
        p = msg.again()
        if p is not None:
            self._show_progress(msg.worker, p)
            self.set_timer(PROGRESS_EVERY, lambda: self._progress_again(msg))

    def _show_progress(self, worker: Worker[Any], progress: Progress) -> None:
        info = self.jobs.get(worker)
        if info is not None and info.kind == SCAN.name:
            # the scan's own progress, in the summary line until the facts replace it: the files analysed, then
            # (a 200 MB DCP .metadata takes seconds) the bytes of the metadata read and folded
            if self.report is None and worker is self._scan_worker:
                summary = self.query_one("#summary", Static)
                text = plain(f"Scanning {self.path} … {progress_text(progress)}")
                # a line that stays a line is repainted alone: a layout of the whole screen 10 times a second took
                # the GIL from the scan's thread
                room = summary.content_size.width
                one_line = 0 < room and text.cell_length <= room and summary.content_size.height == 1
                summary.update(text, layout=not one_line)
            return
        row = self.query_one(JobsPanel).row(worker)
        if row is not None:
            row.progress = progress

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        info = self.jobs.get(worker)
        if info is None:
            return  # not a job (a wizard's planner reports to its own screen)
        end = outcome(worker)
        row = self.query_one(JobsPanel).row(worker)
        if row is not None:
            row.outcome = end
        if JOB_KINDS[info.kind].listed:  # the footer's keys mount anew on each refresh: not for the scan's states
            self.refresh_bindings()
        if end != "running":
            JOB_KINDS[info.kind].ended(self, worker, info, end)

    def action_cancel_job(self) -> None:
        running = self.running_jobs()
        if not running:
            return
        worker = running[-1]
        info = self.jobs[worker]

        def answer(yes: bool | None) -> None:
            if yes and outcome(worker) == "running":
                request_cancel(worker)
                row = self.query_one(JobsPanel).row(worker)
                if row is not None:
                    row.outcome = "cancelling"

        self.app.push_screen(
            ConfirmDialog(f"Cancel {info.title}?", info.cleanup_note, yes="Cancel job", no="Keep running"), answer
        )

    # ------------------------------------------------------------------ scanning
    def start_scan(self) -> None:
        from ...core.report import inspect

        self._early_root = None
        sent = [False]

        def scan(on_progress: Optional[OnProgress], cancel: threading.Event) -> Report:
            def on_node(ev: ScanEvent) -> None:
                if self._early_root is None:
                    self._early_root = ev.node  # the walk reports the root first
                if ev.kind == "analyzed" and not sent[0]:
                    sent[0] = True  # the walk is complete: the whole tree can be drawn at once
                    self.post_message(TreeReady(self._early_root))

            rep = inspect(
                self.path, on_node=on_node, on_progress=on_progress, cancel=cancel, trust_pickles=self.trust_pickles
            )
            inv = rep.inventory
            self.run_view = rep.run_view() if inv.layout == "run-folder" and inv.checkpoints else None
            return rep

        self._scan_worker = SCAN.start(self, JobInfo(SCAN.name, f"scan {self.path.name}"), scan, exclusive=True)

    def on_tree_ready(self, msg: TreeReady) -> None:
        """The walk's tree, drawn only if the analysis is still going EARLY_TREE_AFTER later."""
        if self._tree_timer is not None:
            self._tree_timer.stop()
        worker = self._scan_worker

        def show() -> None:
            self._tree_timer = None
            if (
                self.report is None
                and msg.root is not None
                and worker is not None
                and worker is self._scan_worker
                and outcome(worker) == "running"
            ):
                self.query_one(CheckpointTree).load(msg.root, {})

        self._tree_timer = self.set_timer(EARLY_TREE_AFTER, show)

    def scan_ended(self, worker: Worker[Report], end: str) -> None:
        """The scan's end (job_kinds.ScanJob): its report, or why the path cannot be opened."""
        if end == "failed":
            self.query_one("#summary", Static).update(plain(f"✖ {error_text(worker)}"))
            self.app.push_screen(MessageDialog("Cannot open this path", error_text(worker), error=True))
        elif end == "done":
            # the inventory is long-lived: move it out of the GC's way, so later collections (which run
            # on the UI thread) do not walk hundreds of thousands of nodes between two key presses
            gc.freeze()
            self.report = worker.result

    def watch_report(self, report: Optional[Report]) -> None:
        self._tensor_cache = {}
        self.shown_component = None
        if report is None:
            self.query_one("#summary", Static).update(plain(f"Scanning {self.path} …"))
            return
        inv = report.inventory
        by_path: dict[str, list[Finding]] = {}
        for f in report.findings:
            by_path.setdefault(f.path, []).append(f)
        counts = {s: sum(1 for f in report.findings if f.severity == s) for s in GLYPH}
        marks = "  ".join(f"{g} {counts[s]}" for s, g in GLYPH.items() if counts[s])
        self.query_one("#summary", Static).update(
            plain(inv.summary + (f"   [{marks}]" if marks else "   ✔ no problems"))
        )
        tree = self.query_one(CheckpointTree)
        tree.load(inv.root, by_path, inv.adapter.node.path if inv.adapter is not None else None)
        target = inv.model_path()
        if inv.layout == "run-folder" and inv.checkpoints:
            target = inv.checkpoints[0]["path"]
        if self.run_view is not None:
            # a run folder's first screen is its run view: the run's own line selected, the newest checkpoint its
            # table's (and the chart's) highlighted row
            panel = self.query_one(RunPanel)
            panel.set_view(self.run_view, self._run_panel_size(tree))
            panel.select(target or None)
            target = "."
        if target:
            tree.select_path(target)
        self.selected = inv.node(target) if target else inv.root

    def _run_panel_size(self, tree: CheckpointTree) -> Size:
        """The size the run view's panel will get when the run's line is selected: the main area less the tree
        beside the run view (``RUN_ROOM``)."""
        main = self.query_one("#main").size
        return Size(max(0, main.width - tree.pane_width(main, tree.RUN_ROOM)), main.height)

    @on(DataTable.RowHighlighted, "#run-table")
    def _run_row(self, event: DataTable.RowHighlighted) -> None:
        """A row of the run view moved to: its step highlighted in the chart."""
        self.query_one(RunPanel).select(event.row_key.value)

    def action_rescan(self) -> None:
        self.report = None
        self.call_after_refresh(self.start_scan)  # "Scanning" painted first

    # ------------------------------------------------------------------ details
    @on(Tree.NodeHighlighted)
    def _highlighted(self, event: Tree.NodeHighlighted[Node]) -> None:
        # the scan's tree.select_path posts this; it can arrive after the app removed the screen's widgets
        if isinstance(event.node.data, Node) and self.query(Facts):
            self.selected = event.node.data

    def watch_selected(self, node: Optional[Node]) -> None:
        if node is None:
            return
        # a run folder: its run view while the run itself is selected (the tree's top line), else the node's details
        view = self.run_view if self.report is not None else None
        on_run = view is not None and node.path == "."
        self.query_one("#right").set_class(on_run, "run")
        tree = self.query_one(CheckpointTree)
        room = tree.RUN_ROOM if on_run else tree.RIGHT_ROOM
        if tree.right_room != room:
            tree.right_room = room
            tree.refresh(layout=True)
        if view is not None:
            panel = self.query_one(RunPanel)
            panel.select(node.path if view.row(node.path) is not None else panel.selected_path())
        findings = self.report.findings if self.report else []
        # its own findings, and the checkpoint's errors elsewhere: errors lead, whichever node is selected
        mine = [f for f in findings if f.path == node.path]
        elsewhere = [f for f in findings if f.severity == "error" and f.path != node.path]
        adapter = self.report.inventory.adapter if self.report else None
        self.query_one(Facts).show(
            node, by_severity(elsewhere + mine, node), adapter if adapter is not None and adapter.node is node else None
        )
        if self.report is not None and not on_run:  # the run view hides the tensor table: none listed for it
            self.load_tensors(node)

    def component_for(self, node: Node) -> tuple[Optional[Node], str]:
        """Which node's tensors the table shows for ``node``: the core decides (as for `ckpt-tui tensors`)."""
        if self.report is None:
            return None, ""
        from ...core.tensors import listable

        return listable(self.report.inventory, node)

    def load_tensors(self, node: Node) -> None:
        comp, note = self.component_for(node)
        key = comp.path if comp is not None else "\0" + note  # nothing to list: the note says why
        stored = self.stored_names
        if key == self.shown_component and stored == self._shown_stored:
            return  # moving inside the same component: the table is already right
        self.shown_component, self._shown_stored = key, stored
        if comp is None:
            self.listing = ((), note, stored)
            return
        cached = self._tensor_cache.get((stored, key))
        if cached is not None:
            self.listing = cached
            return
        parsed = self.report.inventory.parsed if self.report is not None else None
        inv = self.report.inventory if self.report is not None else None
        TENSORS.start(
            self,
            JobInfo(TENSORS.name, f"tensors {comp.name}"),
            lambda on_progress, cancel: self.tensors_of(node.path, comp, note, parsed, inv, stored=stored),
            exclusive=True,
        )

    @staticmethod
    def tensors_of(
        path: str,
        comp: Node,
        note: str,
        parsed: Optional[Parsed],
        inv: Optional[Inventory] = None,
        *,
        stored: bool = False,
    ) -> TensorRows:
        """The rows the table shows for ``comp`` (runs in a worker): the one place that asks the core. As
        `ckpt-tui tensors`: the names export writes, or (``stored``, `--stored`) every entry under its stored key."""
        from ...core.tensors import list_tensors
        from ...core.whole import empty_weights
        from ..widgets.details import EMPTY_MARK

        rows: tuple[TensorInfo, ...] = ()
        try:
            rows = tuple(list_tensors(comp, parsed, stored=stored))
            why = empty_weights(comp, inv)
            if why:
                note = f"{EMPTY_MARK}: {why}; see its finding" + (f" ({note})" if note else "")
        except Exception as e:  # a broken file: say so in the table's caption
            note = f"cannot list tensors: {e}"
        return path, comp.path, rows, note, stored

    def tensors_done(self, result: TensorRows) -> None:
        """A tensors job's rows (job_kinds.TensorsJob): cached, and shown if their node is still selected and
        their view still the table's."""
        path, component, rows, note, stored = result
        gc.freeze()  # the listing is long-lived too (see _scan_done)
        self._tensor_cache[(stored, component)] = (rows, note, stored)
        if self.selected is not None and self.selected.path == path and stored == self.stored_names:
            self.listing = (rows, note, stored)

    def watch_listing(self, listing: Listing) -> None:
        rows, note, stored = listing
        self.stats = ()  # statistics belong to the rows they were computed for
        self.query_one(TensorTable).set_rows(rows, note, stored=stored)

    def action_toggle_stored(self) -> None:
        """`S`: the table lists the keys as stored, or again the names export writes."""
        self.stored_names = not self.stored_names

    def watch_stored_names(self, stored: bool) -> None:
        if self.selected is not None and self.report is not None:
            self.load_tensors(self.selected)  # from the cache, else in a worker, as on a move in the tree

    def show_stats(self, component: str, stats: tuple[TensorStats, ...]) -> None:
        """A stats job's result (job_kinds.StatsJob): shown if its component is still the table's, under the names
        export writes (the statistics' names; `S` pressed while they ran shows the stored keys)."""
        if component == self.shown_component and not self.stored_names:
            self.stats = stats

    def watch_stats(self, stats: tuple[TensorStats, ...]) -> None:
        line = self.query_one("#stats-summary", Static)
        line.set_class(bool(stats), "shown")
        if not stats:
            line.update("")
            line.remove_class("bad")
            return
        self.query_one(TensorTable).set_stats(stats)
        nan = sum(1 for s in stats if s.nan)
        inf = sum(1 for s in stats if s.inf)
        bad = [f"{nan} tensor{'s' if nan != 1 else ''} with NaN"] * bool(nan) + [
            f"{inf} tensor{'s' if inf != 1 else ''} with Inf"
        ] * bool(inf)
        line.update(f"✖ {', '.join(bad)} (of {len(stats)})" if bad else f"✔ {len(stats)} tensors, no NaN/Inf")
        line.set_class(bool(bad), "bad")

    # ------------------------------------------------------------------ layout keys
    def _tree_share(self) -> int:
        """The tree pane's share of the width now, in percent (what `<` / `>` step from)."""
        if self.tree_width:
            return self.tree_width
        total = max(1, self.query_one("#main").size.width)
        return round(100 * self.query_one(CheckpointTree).size.width / total)

    def action_tree_narrower(self) -> None:
        now = self._tree_share()
        self.tree_width = max([w for w in TREE_WIDTHS if w < now] or [TREE_WIDTHS[0]])

    def action_tree_wider(self) -> None:
        now = self._tree_share()
        self.tree_width = min([w for w in TREE_WIDTHS if w > now] or [TREE_WIDTHS[-1]])

    def watch_tree_width(self, width: int) -> None:
        self.query_one(CheckpointTree).styles.width = f"{width}%" if width else "auto"

    def action_findings(self) -> None:
        from .findings import FindingChoice, FindingsScreen

        def done(choice: Optional[FindingChoice]) -> None:
            if choice is None or self.report is None:
                return
            self.query_one(CheckpointTree).select_path(choice.finding.path)
            self.selected = self.report.inventory.node(choice.finding.path)
            if choice.fix:
                self.start_fix(choice.finding)

        if self.report is not None:
            self.app.push_screen(FindingsScreen(self.report.findings), done)

    def action_filter(self) -> None:
        self.query_one(TensorTable).open_filter()

    # ------------------------------------------------------------------ the keys that start work (job_kinds.py)
    def fixable(self) -> list[Finding]:
        """Fixable findings, errors first, the selected node's first within a severity."""
        if self.report is None:
            return []
        return by_severity([f for f in self.report.findings if f.fix], self.selected)

    def action_fix(self) -> None:
        pick = self.fixable()
        if pick:
            self.start_fix(pick[0])

    def start_fix(self, finding: Finding) -> None:
        REPAIR.open(self, finding)

    def action_export(self) -> None:
        EXPORT.open(self)

    def run_export(self, plan: ExportPlan, optimizer: Optional[ExportPlan] = None) -> Worker[Any]:
        """Export ``plan`` (with ``optimizer``: both, side by side in one folder) as a job; for scripts and tests."""
        return EXPORT.run(self, plan, optimizer)

    def universal_choice(self) -> tuple[Optional[Node], str]:
        """The DeepSpeed tag `u` converts -- the selected tag folder, else the one the core picks for
        `ckpt-tui universal` (`latest`, the newest complete checkpoint) -- or None and why not."""
        if self.report is None:
            return None, "still scanning"
        if self.selected is not None and format_of(self.selected).tag:
            return self.selected, ""
        if not self.report.inventory.deepspeed_tags():
            return None, "no DeepSpeed ZeRO checkpoint here"
        from ...core.export.api import resolve
        from ...core.export.write import ExportError

        try:
            node, _ = resolve(self.report, None, verb="converting")
        except ExportError as e:  # a dangling `latest`: the user picks the tag in the tree
            return None, (str(e).splitlines() or [""])[0] + " (select a tag folder)"
        if not format_of(node).tag:  # e.g. a run folder whose newest checkpoint is not DeepSpeed
            tags = self.report.inventory.deepspeed_tags()
            return None, (
                f"the model here is not a DeepSpeed tag: select one "
                f"({', '.join(self.report.inventory.shown(t.path) for t in tags[:2])})"
            )
        return node, ""

    def universal_tag(self) -> Optional[Node]:
        return self.universal_choice()[0]

    def action_universal(self) -> None:
        UNIVERSAL.open(self)

    def action_prune(self) -> None:
        PRUNE.open(self)

    def action_resume_fsdp2(self) -> None:
        RESUME.open(self)

    def action_stats(self) -> None:
        STATS.open(self)
