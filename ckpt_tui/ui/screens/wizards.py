"""Guided wizards: keyboard-only modal steps; Esc goes back (or closes on the first step); every
step says what will happen. They return what to run; the app runs it as a job."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, cast

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, ContentSwitcher, Input, OptionList, Static
from textual.widgets.option_list import Option

from ...core.facts import DeepSpeedZeroFacts
from ...core.fsutil import OutputError, check_output_folder, free_bytes
from ...core.storage import is_url
from ...core.types import user_path
from ..format import plain, size, visible
from ..widgets.safe_input import SafeInput


class Wizard(ModalScreen):
    CSS_PATH = Path(__file__).with_name("wizards.tcss")  # type selectors on Wizard: every subclass
    STEPS: tuple[str, ...] = ()
    TITLE = ""
    BINDINGS = [Binding("escape", "back", "Back"), Binding("ctrl+n", "next", "Next", show=False)]

    def __init__(self):
        super().__init__()
        self.step = 0

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.TITLE, classes="title")
            yield Static("", id="step-label", classes="step")
            with ContentSwitcher(initial=self.STEPS[0]):
                yield from self.panes()
            with Horizontal(classes="buttons"):
                yield Button("Back (esc)", id="back")
                yield Button("Next (enter)", id="next", variant="primary")

    def panes(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.show_step()

    def show_step(self) -> None:
        name = self.STEPS[self.step]
        self.query_one(ContentSwitcher).current = name
        self.query_one("#step-label", Static).update(
            f"Step {self.step + 1} of {len(self.STEPS)}: {self.step_titles()[self.step]}"
        )
        last = self.step == len(self.STEPS) - 1
        nxt = self.query_one("#next", Button)
        nxt.label = (self.run_label() if last else "Next") + " (enter)"
        # a Button ignores enter for 0.2 s after a press (its "-active" effect); that press belongs to the
        # previous step, so end it: enter on the next step's button must not be lost
        nxt.remove_class("-active")
        self.query_one("#back", Button).label = "Cancel (esc)" if self.step == 0 else "Back (esc)"
        nxt.disabled = not self.can_run() if last else False
        self.enter_step(name)
        self.focus_step(name)

    def step_titles(self) -> list[str]:
        return list(self.STEPS)

    def run_label(self) -> str:
        return "Run"

    def can_run(self) -> bool:
        """Whether the last step's button runs: False while there is nothing valid to run."""
        return True

    def enter_step(self, name: str) -> None:
        pass

    def focus_step(self, name: str) -> None:
        pane = self.query_one(f"#{name}")
        for w in pane.query("Input, OptionList, Select"):
            w.focus()
            return
        nxt = self.query_one("#next", Button)
        (self.query_one("#back", Button) if nxt.disabled else nxt).focus()

    def validate_step(self, name: str) -> Optional[str]:
        return None

    def action_back(self) -> None:
        if self.step == 0:
            self.dismiss(None)
        else:
            self.step -= 1
            self.show_step()

    def action_next(self) -> None:
        err = self.validate_step(self.STEPS[self.step])
        if err:
            self.notify(visible(err), severity="error", markup=False)  # it may name a path
            return
        if self.step == len(self.STEPS) - 1:
            self.dismiss(self.result())
        else:
            self.step += 1
            self.show_step()

    def result(self):
        raise NotImplementedError

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "next":
            self.action_next()
        else:
            self.action_back()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_next()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_next()


class PlannedWizard(Wizard):
    """A wizard whose last step ("confirm") shows a plan made in a worker from the values of the
    earlier steps; it returns {"plan": plan} for the app to run."""

    READY = ""  # said above the plan once it is ready
    FAILED = ""  # prefix of the reason when it cannot be planned

    def __init__(self):
        super().__init__()
        self.plan = None
        self.plan_error = ""

    def confirm_pane(self) -> ComposeResult:
        with Vertical(id="confirm", classes="pane"):
            yield Static("", id="plan-head", classes="explain")
            with VerticalScroll():
                yield Static("Planning…", id="plan-text")

    def plan_inputs(self):
        """The earlier steps' values, read on the UI thread."""
        raise NotImplementedError

    def build_plan(self, inputs) -> tuple[object, str]:
        """(plan, its text) — runs in a worker thread: no widget access."""
        raise NotImplementedError

    def enter_step(self, name: str) -> None:
        if name == "confirm":
            self.plan, self.plan_error = None, ""
            self.query_one("#plan-head", Static).update("")
            self.query_one("#plan-text", Static).update("Planning (reading headers)…")
            self._plan_worker(self.plan_inputs())

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _plan_worker(self, inputs) -> None:
        try:
            plan, text = self.build_plan(inputs)
            self.app.call_from_thread(self._planned, plan, text, "")
        except Exception as e:  # shown in the wizard, never a traceback
            self.app.call_from_thread(self._planned, None, "", str(e))

    def _planned(self, plan, text, err) -> None:
        self.plan, self.plan_error = plan, err
        self.query_one("#plan-head", Static).update(plain(self.READY if plan else f"{self.FAILED}: {err}"))
        self.query_one("#plan-text", Static).update(plain(text if plan else ""))  # a plan names files: never markup
        nxt = self.query_one("#next", Button)
        nxt.disabled = not self.can_run()
        if plan is None:
            self.query_one("#back", Button).focus()  # the run button is disabled: esc/back is what is left
        elif self.step == len(self.STEPS) - 1:
            nxt.focus()

    def can_run(self) -> bool:
        return self.plan is not None

    def validate_step(self, name: str) -> Optional[str]:
        if name == "confirm" and self.plan is None:
            return self.plan_error or "the plan is not ready yet"
        return None

    def result(self):
        return {"plan": self.plan}


OPTIMIZER, BOTH = "::optimizer", "::both"  # the export wizard's choices beside the model candidates


class ExportWizard(PlannedWizard):
    STEPS = ("source", "output", "dtype", "shards", "confirm")
    TITLE = "Export to safetensors"
    READY = "Press enter to export (then verify every tensor). The plan:"
    FAILED = "Cannot export"

    def __init__(self, report, selected_path: Optional[str] = None):
        from ...core.export.api import optimizer_exportable

        super().__init__()
        self.report = report
        inv = report.inventory
        self.candidates = inv.export_candidates()
        self.model_default = self.candidates[0][0] if self.candidates else "."
        # the core decides whether this checkpoint has an optimizer state it exports; the wizard only asks
        self.optimizer_at = optimizer_exportable(report)
        if self.optimizer_at is not None:
            where = inv.shown(self.optimizer_at, slash=inv.node(self.optimizer_at).is_dir)
            self.candidates = self.candidates + [
                (OPTIMIZER, f"the optimizer state ({where}): exp_avg, exp_avg_sq per parameter"),
                (BOTH, "both: the model weights and the optimizer state, side by side in one folder"),
            ]
        self.default = (
            selected_path
            if selected_path in [c[0] for c in self.candidates]
            else (self.candidates[0][0] if self.candidates else ".")
        )
        self.output_bytes: dict[str, object] = {}  # source -> bytes the export writes, or why it cannot say

    def step_titles(self):
        return ["what to export", "where to write it", "output dtype", "shard size", "check the plan and run"]

    def run_label(self):
        return "Export"

    def panes(self) -> ComposeResult:
        inv = self.report.inventory
        with Vertical(id="source", classes="pane"):
            yield Static(
                "The model weights to export. ckpt-tui picked the model component of this checkpoint;"
                " pick another if you want."
                + (
                    " Or its optimizer state (optimizer.safetensors + optimizer_config.json), or both."
                    if self.optimizer_at is not None
                    else ""
                ),
                classes="explain",
            )
            ol = OptionList(
                *[
                    Option(plain(desc if p in (OPTIMIZER, BOTH) else f"{p}  —  {desc}"), id=p)
                    for p, desc in self.candidates
                ],
                id="source-list",
            )
            yield ol
        with Vertical(id="output", classes="pane"):
            yield Static(
                "A new folder. Files are written to a hidden temp folder beside it and moved into place "
                "only when complete and verified; the checkpoint is never modified.",
                classes="explain",
            )
            yield SafeInput(value=inv.user_form(_default_out(inv)), id="out")
            yield Static("", id="space")
        with Vertical(id="dtype", classes="pane"):
            yield Static("", id="dtype-note", classes="explain")
            yield OptionList(
                Option("keep (as stored)", id="keep"),
                Option("fp32", id="fp32"),
                Option("bf16", id="bf16"),
                Option("fp16", id="fp16"),
                id="dtype-list",
            )
        with Vertical(id="shards", classes="pane"):
            yield Static(
                "Max shard size: above it the weights are split into model-0000k-of-0000n.safetensors "
                "plus model.safetensors.index.json (50GB is save_pretrained's default).",
                classes="explain",
            )
            yield Input(value="50GB", id="shard")
        yield from self.confirm_pane()

    def on_mount(self) -> None:
        ol = self.query_one("#source-list", OptionList)
        for i, (p, _) in enumerate(self.candidates):
            if p == self.default:
                ol.highlighted = i
        self.query_one("#dtype-list", OptionList).highlighted = 0
        super().on_mount()

    def enter_step(self, name: str) -> None:
        if name == "output":
            self._space()
        elif name == "dtype":
            self.query_one("#dtype-note", Static).update(
                f"Output dtype of floating-point tensors: {self._dtype_note()}."
            )
        super().enter_step(name)

    def _dtype_note(self) -> str:
        """What --dtype does to what is being exported (the dtype step's text)."""
        if self.component() == "optimizer":
            return (
                "the optimizer state's masters and Adam moments are fp32: keep writes them as stored; "
                "bf16/fp16 lose the precision a resumed run needs"
            )
        node = self.report.inventory.node(self.model_source())
        note = "keep writes the tensors as stored"
        if node is not None and node.format == "deepspeed-zero":
            note = "DeepSpeed keeps fp32 master weights: keep writes fp32"
            td = node.facts.get("train_dtype")
            if td in ("bfloat16", "float16"):
                short = "bf16" if td == "bfloat16" else "fp16"
                note += f"; the run trained in {short}, so --dtype {short} halves the size"
        if self.component() == "both":
            note += " (the model's; the optimizer state is written as stored: a resumed run needs its precision)"
        return note

    def _space(self) -> None:
        out = Path(self.query_one("#out", Input).value).expanduser()
        parent = out.parent if out.parent.exists() else Path.cwd()
        line = self.query_one("#space", Static)
        try:
            free = free_bytes(parent)
        except OSError as e:
            line.update(plain(f"Cannot check free space: {e.strerror}"))
            return
        src = self.source()
        need = self.output_bytes.get(src)
        if need is None:
            line.update(plain(f"Free in {self.report.inventory.user_form(parent)}: {size(free)} — sizing the export…"))
            self._size_worker(src)
        elif isinstance(need, str):
            line.update(plain(f"Free in {self.report.inventory.user_form(parent)}: {size(free)} — {need}"))
        else:
            ok = "enough" if free > need else "NOT ENOUGH"
            line.update(
                plain(
                    f"Free in {self.report.inventory.user_form(parent)}: {size(free)} — the export writes "
                    f"about {size(need)} ({ok})."
                )
            )

    @work(thread=True, exclusive=True, group="sizing", exit_on_error=False)
    def _size_worker(self, src: str) -> None:
        """The bytes the export writes (model tensors as stored, plus copied files; the optimizer state where
        it is chosen), as the core's ``export_needs`` counts them for ``export``'s own free-space check."""
        from ...core.export.api import export_needs

        try:
            node = self.report.inventory.node(self.model_default if src in (OPTIMIZER, BOTH) else src)
            need: object = 0
            if src != OPTIMIZER:
                need = export_needs(self.report, node, dtype="keep")
            if src in (OPTIMIZER, BOTH):
                need = cast(int, need) + export_needs(self.report, node, dtype="keep", component="optimizer")
        except Exception as e:  # the plan step says it in full
            need = f"cannot size the export: {(str(e).splitlines() or [''])[0]}"
        self.app.call_from_thread(self._sized, src, need)

    def _sized(self, src: str, need) -> None:
        self.output_bytes[src] = need
        if self.is_mounted:
            self._space()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "out":
            self._space()

    def source(self) -> str:
        ol = self.query_one("#source-list", OptionList)
        if ol.highlighted is None or not self.candidates:
            return self.default
        return self.candidates[ol.highlighted][0]

    def model_source(self) -> str:
        """The model candidate the export reads (the core's pick where the optimizer or both is chosen)."""
        src = self.source()
        return self.model_default if src in (OPTIMIZER, BOTH) else src

    def component(self) -> str:
        return {OPTIMIZER: "optimizer", BOTH: "both"}.get(self.source(), "model")

    def options(self) -> dict:
        comp = self.component()
        src = _typed(self.report, ".") if comp != "model" else _typed(self.report, self.source())
        return {
            "src": src,
            "out": self.query_one("#out", Input).value,
            "component": comp,
            "dtype": self.dtype(),
            "max_shard_size": self.query_one("#shard", Input).value,
        }

    def dtype(self) -> str:
        ol = self.query_one("#dtype-list", OptionList)
        return ["keep", "fp32", "bf16", "fp16"][ol.highlighted or 0]

    def validate_step(self, name: str) -> Optional[str]:
        if name == "output":
            out = Path(self.query_one("#out", Input).value).expanduser()
            if not out.parent.exists():
                return f"{out.parent} does not exist"
            try:
                check_output_folder(out)
            except OutputError:
                return f"{out} exists and is not empty: choose another folder"
        if name == "shards":
            from ...core.export.plan import parse_size

            try:
                parse_size(self.query_one("#shard", Input).value)
            except ValueError as e:
                return str(e)
        return super().validate_step(name)

    def plan_inputs(self):
        return self.options()

    def build_plan(self, o):
        from ...core.export.api import plan_export

        out = Path(o["out"]).expanduser()
        kw = {"dtype": o["dtype"], "max_shard_size": o["max_shard_size"]}
        if o["component"] != "both":
            plan, said = plan_export(o["src"], out, component=o["component"], **kw)
            return plan, "\n".join(said + [plan.to_plan().describe()])
        # both: the two plans of one checkpoint, written side by side into OUT (core.export.both)
        pm, said_m = plan_export(o["src"], out, **kw)
        # the optimizer state as stored, whatever the model's dtype: bf16 moments would not resume the run
        po, said_o = plan_export(o["src"], out, component="optimizer", dtype="keep", max_shard_size=o["max_shard_size"])
        return (pm, po), "\n".join(
            [
                "Both into one folder: each export is written and verified into a hidden folder beside it, then the "
                "optimizer's files join the model's and the folder is renamed into place.",
                "",
                "The model:",
            ]
            + said_m
            + [pm.to_plan().describe(), "", "The optimizer state:"]
            + said_o
            + [po.to_plan().describe()]
        )


class TagConversionWizard(PlannedWizard):
    """Convert a DeepSpeed ZeRO tag (``tag_path``) into a new folder: why, where to write it (``#out``,
    ``default_out`` of the tag's folder), then the plan ``make_plan`` makes of the tag as the user
    would type it and that folder."""

    STEPS = ("why", "output", "confirm")
    FAILED = "Cannot convert"
    OUT_HELP = ""  # said above the output folder's input

    def __init__(self, report, tag_path: str):
        super().__init__()
        self.report = report
        self.tag_path = tag_path

    def step_titles(self):
        return ["why", "where to write it", "check the plan and run"]

    def run_label(self):
        return "Convert"

    def why(self, f: DeepSpeedZeroFacts) -> str:
        """The first step's text, from the tag's facts."""
        raise NotImplementedError

    def default_out(self, tag_dir: Path) -> Path:
        raise NotImplementedError

    def make_plan(self, src: str, out: Path):
        """The core's plan (runs in the worker)."""
        raise NotImplementedError

    def panes(self) -> ComposeResult:
        node = self.report.inventory.node(self.tag_path)
        f = cast(DeepSpeedZeroFacts, node.facts) if node else DeepSpeedZeroFacts()
        why = self.why(f)
        out = self.default_out(_abs(self.report, self.tag_path))
        with Vertical(id="why", classes="pane"):
            yield Static(plain(why), classes="explain")  # it quotes the tag's path
        with Vertical(id="output", classes="pane"):
            yield Static(self.OUT_HELP, classes="explain")
            yield SafeInput(value=self.report.inventory.user_form(out), id="out")
        yield from self.confirm_pane()

    def plan_inputs(self):
        return self.query_one("#out", Input).value

    def build_plan(self, out):
        plan = self.make_plan(_typed(self.report, self.tag_path), Path(out).expanduser())
        return plan, plan.to_plan().describe()


class UniversalWizard(TagConversionWizard):
    TITLE = "Convert to a DeepSpeed universal checkpoint"
    READY = "Press enter to convert (DeepSpeed's converter runs in the background). The plan:"
    OUT_HELP = (
        "The universal checkpoint's folder (beside the tag, so load_checkpoint finds it through `latest_universal`):"
    )

    def why(self, f: DeepSpeedZeroFacts) -> str:
        why = (
            f"`{self.report.inventory.shown(self.tag_path, slash=True)}` is a ZeRO-{f.get('zero_stage', '?')} checkpoint saved by "
            f"{f.get('world_size', '?')} ranks. To resume with a different number of ranks, DeepSpeed needs a "
            "universal checkpoint (per-parameter fp32 weights and optimizer state).\n\n"
        )
        if f.get("universal_checkpoint_info") is False:
            why += (
                "Its mp_rank_00_model_states.pt has no `universal_checkpoint_info`, so DeepSpeed's "
                'ds_to_universal stops with "Required universal_checkpoint_info state is missing". ckpt-tui '
                "runs DeepSpeed's own converter and supplies that info in memory: the source is not modified."
            )
        else:
            why += "ckpt-tui runs DeepSpeed's own converter (ds_to_universal) in the background."
        if f.get("frozen_params"):
            why += (
                "\n\nThis run has frozen parameters: a universal checkpoint restores only optimizer-tracked "
                "parameters, so ckpt-tui will also write their weights to frozen_params.safetensors and show "
                "how to load them."
            )
        return why

    def default_out(self, tag_dir: Path) -> Path:
        from ...core.convert.universal.plan import default_out

        return default_out(tag_dir)

    def make_plan(self, src: str, out: Path):
        from ...core.convert.universal import universal_plan

        return universal_plan(src, out)


class RepairWizard(Wizard):
    STEPS = ("diff", "confirm")
    TITLE = "Repair"

    def __init__(self, repair):
        super().__init__()
        self.repair = repair

    def step_titles(self):
        return ["what will change (dry run)", "confirm"]

    def run_label(self):
        return "Repair"

    def panes(self) -> ComposeResult:
        with Vertical(id="diff", classes="pane"):
            with VerticalScroll():  # the plan's description begins with the repair's title
                yield Static(plain(self.repair.plan.describe()))  # it quotes the file: never markup
        with Vertical(id="confirm", classes="pane"):
            yield Static(
                "The original is kept as a backup (named in the plan above); the new file is written to a "
                "temp name, fsynced and moved into place. Afterwards ckpt-tui re-inspects the checkpoint."
                "\n\nPress enter to repair.",
                classes="explain",
            )

    def result(self):
        return {"repair": self.repair}


def _typed(report, rel: str) -> str:
    """Node ``rel`` as the user would type it (relative to their folder if they opened a relative path):
    what the plans and results the core prints then name."""
    inv = report.inventory
    return user_path(inv.given or str(inv.root.abspath), rel)


def _abs(report, rel: str) -> Path:
    node = report.inventory.node(rel)
    return node.abspath if node is not None else report.inventory.root.abspath


def _default_out(inv) -> Path:
    root = inv.root.abspath
    base = root if root.is_dir() else root.parent
    if is_url(root):  # a checkpoint in object storage: the export goes to the current folder
        return Path.cwd() / f"{base.name}-safetensors"
    return base.parent / f"{base.name}-safetensors"
