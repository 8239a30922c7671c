"""The export wizard (key `e`): what to export (a model candidate, or where the core says the checkpoint has
one, its optimizer state or both), the output folder (its free space and whether it is empty, checked in a
worker), the dtype, the shard size, then the plan; it returns an ExportChoice for the main screen to run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.timer import Timer
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ....core.export.plan import ExportPlan
from ....core.formats.registry import format_of
from ....core.fsutil import OutputError, check_output_folder, free_bytes
from ....core.report import Report
from ....core.storage import Location, is_url
from ....core.types import Inventory, Node
from ...format import plain, size
from ...widgets.safe_input import SafeInput
from .base import PlannedWizard, typed

Component = Literal["model", "optimizer", "both", "adapter", "merged", "hf"]
CHECK_AFTER = 0.25  # seconds after the last keystroke in the output folder before the disk is asked


@dataclass(frozen=True)
class ExportSource:
    """An entry of the first step: a model candidate at ``path``, or (``component`` "optimizer" / "both") the
    optimizer state the core exports, with ``path`` the model candidate it is read with (the core's pick)."""

    component: Component
    path: str
    desc: str

    def label(self) -> str:
        return self.desc if self.component not in ("model", "adapter", "hf") else f"{self.path}  —  {self.desc}"


@dataclass(frozen=True)
class ExportChoice:
    """What the wizard returns: one export's plan or, for "both", the model's plan and the optimizer state's
    (``optimizer``), written side by side into the one folder (core.export.both)."""

    plan: ExportPlan
    optimizer: Optional[ExportPlan] = None


@dataclass(frozen=True)
class ExportInputs:
    """The earlier steps' values, read on the UI thread for the planner."""

    src: str  # the checkpoint or model candidate, as the user would type it
    out: str
    component: Component
    dtype: str
    max_shard_size: str
    base: str = ""  # "merged": the base model's folder as typed ("": where the adapter's record finds it)
    config: str = ""  # "hf": the model's Hugging Face config.json as typed ("": the checkpoint's own record)


@dataclass(frozen=True)
class OutputCheck:
    """What the disk says of the output folder as typed (``typed``): asked in a worker (on NFS or Lustre a
    statvfs or a listing can take seconds), never on the UI thread."""

    typed: str
    parent_shown: str  # where the free space was measured (the folder's parent, else the current folder)
    free: Optional[int]  # None: cannot say (free_error)
    free_error: str
    refusal: Optional[str]  # why it cannot be the output; None: it can


def check_output(typed_out: str, inv: Inventory) -> OutputCheck:
    """The free space beside ``typed_out`` and whether it can be the export's folder (runs in a worker)."""
    out = Path(typed_out).expanduser()
    parent_exists = out.parent.exists()
    parent = out.parent if parent_exists else Path.cwd()
    free: Optional[int] = None
    free_error = ""
    try:
        free = free_bytes(parent)
    except OSError as e:
        free_error = e.strerror or str(e)
    refusal: Optional[str] = None
    if not parent_exists:
        refusal = f"{out.parent} does not exist"
    else:
        try:
            check_output_folder(out)
        except OutputError:
            refusal = f"{out} exists and is not empty: choose another folder"
    return OutputCheck(typed_out, inv.user_form(parent), free, free_error, refusal)


class ExportWizard(PlannedWizard[ExportChoice]):
    STEPS: tuple[str, ...] = ("source", "output", "dtype", "shards", "confirm")
    TITLE = "Export to safetensors"
    READY = "Press enter to export (then verify every tensor). The plan:"
    FAILED = "Cannot export"

    def __init__(self, report: Report, selected_path: Optional[str] = None) -> None:
        from ....core.export.api import optimizer_exportable

        super().__init__()
        self.report = report
        inv = report.inventory
        self.candidates: list[ExportSource] = [ExportSource("model", p, d) for p, d in inv.export_candidates()]
        self.model_default = self.candidates[0].path if self.candidates else "."
        # a Llama-family Megatron-Core or torchtitan model: also as a Hugging Face model (export --to hf), each
        # right after its candidate; inspect decided it from the metadata (the to_hf fact)
        self.hf_needs_config: set[str] = set()  # its candidates whose checkpoint records no configuration
        with_hf: list[ExportSource] = []
        for c in self.candidates:
            with_hf.append(c)
            node = inv.node(c.path)
            offer = node.facts.get("to_hf") if node is not None else None
            if offer:
                with_hf.append(ExportSource("hf", c.path, "a Hugging Face model (--to hf): Llama/Qwen2 + config.json"))
                if offer == "config":
                    self.hf_needs_config.add(c.path)
        if any(c.component == "hf" for c in with_hf):
            self.candidates = with_hf
            self.STEPS = ("source", "config", "output", "dtype", "shards", "confirm")
        self.adapter = inv.adapter  # a LoRA adapter (core.adapters.found.AdapterInfo): two ways to export it
        if self.adapter is not None:
            self.STEPS = ("source", "base", "output", "dtype", "shards", "confirm")
            at = self.adapter.node.path
            self.candidates = [c for c in self.candidates if c.path != at]
            self.candidates[:0] = [
                ExportSource("merged", at, f"{self.adapter.what()}, merged into its base model: a Hugging Face folder"),
                ExportSource(
                    "adapter", at, "the adapter as PEFT saves it (adapter_model.safetensors + adapter_config.json)"
                ),
            ]
            self.model_default = at
        self._forward = True  # the way the last step change went: the base step is passed over unless merging
        # the core decides whether this checkpoint has an optimizer state it exports; the wizard only asks
        self.optimizer_at = optimizer_exportable(report)
        if self.optimizer_at is not None:
            node = inv.node(self.optimizer_at)
            where = inv.shown(self.optimizer_at, slash=node is not None and node.is_dir)
            self.candidates += [
                ExportSource(
                    "optimizer",
                    self.model_default,
                    f"the optimizer state ({where}): exp_avg, exp_avg_sq per parameter",
                ),
                ExportSource(
                    "both",
                    self.model_default,
                    "both: the model weights and the optimizer state, side by side in one folder",
                ),
            ]
        models = [c for c in self.candidates if c.component == "model"]
        self.default: ExportSource = next(
            (c for c in models if c.path == selected_path),
            self.candidates[0] if self.candidates else ExportSource("model", ".", ""),
        )
        # source -> bytes the export writes, or why it cannot say
        self.output_bytes: dict[ExportSource, Union[int, str]] = {}
        self.output_check: Optional[OutputCheck] = None  # the disk's answer for the output folder last asked
        self._check_timer: Optional[Timer] = None
        self._nexts_waiting = 0  # enter presses on the output step while the disk was asked (typed ahead)

    def step_titles(self) -> list[str]:
        titles = {
            "source": "what to export",
            "base": "the base model",
            "config": "the model's config.json",
            "output": "where to write it",
            "dtype": "output dtype",
            "shards": "shard size",
            "confirm": "check the plan and run",
        }
        return [titles[s] for s in self.STEPS]

    def show_step(self) -> None:
        if self.STEPS[self.step] == "base" and self.component() != "merged":
            self.step += 1 if self._forward else -1  # only a merge needs the base
        if self.STEPS[self.step] == "config" and not self._needs_config():
            self.step += 1 if self._forward else -1  # only --to hf of a checkpoint without a configuration
        super().show_step()

    def _needs_config(self) -> bool:
        src = self.source()
        return src.component == "hf" and src.path in self.hf_needs_config

    def action_back(self) -> None:
        self._forward = False
        super().action_back()

    def run_label(self) -> str:
        return "Export"

    def panes(self) -> ComposeResult:
        inv = self.report.inventory
        with Vertical(id="source", classes="pane"):
            yield Static(
                (
                    "This checkpoint holds a LoRA adapter: merged into its base model (what you deploy), or the"
                    " adapter as PEFT saves it (PeftModel.from_pretrained loads it)."
                    if self.adapter is not None
                    else "The model weights to export. ckpt-tui picked the model component of this checkpoint;"
                    " pick another if you want."
                )
                + (
                    " A Llama-family Megatron-Core or torchtitan model can also be written as a Hugging Face model"
                    " (--to hf: names mapped, fused tensors split, config.json), which from_pretrained loads."
                    if any(c.component == "hf" for c in self.candidates)
                    else ""
                )
                + (
                    " Or its optimizer state (optimizer.safetensors + optimizer_config.json), or both."
                    if self.optimizer_at is not None
                    else ""
                ),
                classes="explain",
            )
            yield OptionList(*[Option(plain(c.label())) for c in self.candidates], id="source-list")
        with Vertical(id="base", classes="pane"):
            yield Static(plain(self._base_explain()), classes="explain")
            yield SafeInput(value=self._base_default(), id="base-path")
        with Vertical(id="config", classes="pane"):
            yield Static(
                "This checkpoint records no model configuration, and --to hf needs what shapes cannot show: the "
                "heads and key/value heads, the activation, the norm's eps, rope. The model's Hugging Face "
                "config.json (a file, or the folder holding it; e.g. the one the run started from) gives them; "
                "it is trusted for those, and every value the shapes can check is checked.",
                classes="explain",
            )
            yield SafeInput(value="", id="config-path")
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

    def _base_explain(self) -> str:
        a = self.adapter
        base = a.base if a is not None else None
        text = "The base model the adapter is merged into: a folder with its config.json and weights."
        if base is not None and base.found is not None:
            return text + f" The adapter names `{base.recorded}`, found at {a.shown(base.found)}."
        if base is not None and base.recorded:
            return text + f" The adapter names `{base.recorded}`, which is not on this machine: type its folder."
        return text + " The adapter does not record it: type its folder."

    def _base_default(self) -> str:
        a = self.adapter
        if a is not None and a.base is not None and a.base.found is not None:
            return a.shown(a.base.found)
        return ""

    def on_mount(self) -> None:
        ol = self.query_one("#source-list", OptionList)
        for i, c in enumerate(self.candidates):
            if c == self.default:
                ol.highlighted = i
        self.query_one("#dtype-list", OptionList).highlighted = 0
        super().on_mount()

    def enter_step(self, name: str) -> None:
        if name == "output":
            self._ask_disk(after=0)
            src = self.source()
            if src not in self.output_bytes:
                self._size_worker(src)
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
        if node is not None and format_of(node).tag:
            note = "DeepSpeed keeps fp32 master weights: keep writes fp32"
            td = node.facts.get("train_dtype")
            if td in ("bfloat16", "float16"):
                short = "bf16" if td == "bfloat16" else "fp16"
                note += f"; the run trained in {short}, so --dtype {short} halves the size"
        if self.component() == "both":
            note += " (the model's; the optimizer state is written as stored: a resumed run needs its precision)"
        return note

    # ------------------------------------------------------------------ the output folder, asked in workers
    def _out_value(self) -> str:
        return self.query_one("#out", Input).value

    def current_check(self) -> Optional[OutputCheck]:
        """The disk's answer for the output folder as it is typed now, or None while it is being asked."""
        check = self.output_check
        return check if check is not None and check.typed == self._out_value() else None

    def _ask_disk(self, after: float = CHECK_AFTER) -> None:
        """Ask the disk about the output folder ``after`` seconds from now (a later keystroke restarts the
        wait); the answer for an older value is dropped when it arrives (_checked)."""
        if self._check_timer is not None:
            self._check_timer.stop()
            self._check_timer = None
        if after <= 0:
            self._check_worker(self._out_value())
        else:
            self._check_timer = self.set_timer(after, lambda: self._check_worker(self._out_value()))

    @work(thread=True, exclusive=True, group="output-check", exit_on_error=False)
    def _check_worker(self, typed_out: str) -> None:
        check = check_output(typed_out, self.report.inventory)
        self.app.call_from_thread(self._checked, check)

    def _checked(self, check: OutputCheck) -> None:
        if not self.is_mounted or check.typed != self._out_value():
            return  # an answer for what was typed before: the newer one is on its way
        self.output_check = check
        self._space()
        waiting, self._nexts_waiting = self._nexts_waiting, 0
        for _ in range(waiting if self.STEPS[self.step] == "output" else 0):
            step = self.step
            self.action_next()  # the presses typed ahead, in order, as if the answer had been there
            if self.step == step:
                break  # refused (it said why): the rest of them are dropped

    def _space(self) -> None:
        line = self.query_one("#space", Static)
        check = self.current_check()
        if check is None:
            line.update(plain("Checking the output folder…"))
            return
        if check.free is None:
            line.update(plain(f"Cannot check free space: {check.free_error}"))
            return
        free = check.free
        need = self.output_bytes.get(self.source())
        if need is None:
            line.update(plain(f"Free in {check.parent_shown}: {size(free)} — sizing the export…"))
        elif isinstance(need, str):
            line.update(plain(f"Free in {check.parent_shown}: {size(free)} — {need}"))
        else:
            ok = "enough" if free > need else "NOT ENOUGH"
            line.update(
                plain(f"Free in {check.parent_shown}: {size(free)} — the export writes about {size(need)} ({ok}).")
            )

    @work(thread=True, exclusive=True, group="sizing", exit_on_error=False)
    def _size_worker(self, src: ExportSource) -> None:
        """The bytes the export writes (model tensors as stored, plus copied files; the optimizer state where
        it is chosen), as the core's ``export_needs`` counts them for ``export``'s own free-space check."""
        from ....core.export.api import export_needs

        need: Union[int, str]
        try:
            node = self.report.inventory.node(src.path)
            if node is None:  # a candidate is a node of the inventory: not expected
                raise LookupError(f"{src.path} is not in the checkpoint")
            need = 0
            if src.component == "hf":
                need = self._hf_needs(node)
            elif src.component != "optimizer":
                need = export_needs(self.report, node, dtype="keep", merge=src.component == "merged")
            if src.component in ("optimizer", "both"):
                need += export_needs(self.report, node, dtype="keep", component="optimizer")
        except Exception as e:  # the plan step says it in full
            need = f"cannot size the export: {(str(e).splitlines() or [''])[0]}"
        self.app.call_from_thread(self._sized, src, need)

    def _hf_needs(self, node: Node) -> int:
        """What ``--to hf`` writes (its split tensors, config.json, the tokenizer it copies); a checkpoint that
        records no configuration is sized as the plain export (the same tensor bytes) until one is typed."""
        from ....core.export.api import export_needs
        from ....core.export.to_hf import NeedsConfig

        try:
            return export_needs(self.report, node, dtype="keep", to="hf")
        except NeedsConfig:
            return export_needs(self.report, node, dtype="keep")

    def _sized(self, src: ExportSource, need: Union[int, str]) -> None:
        self.output_bytes[src] = need
        if self.is_mounted:
            self._space()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "out":
            self._nexts_waiting = 0  # typing again: the user is not done with this step
            self._space()  # "checking…" until the disk answers for this value
            self._ask_disk()

    def action_next(self) -> None:
        self._forward = True
        if self.STEPS[self.step] == "output" and self.current_check() is None:
            self._nexts_waiting += 1  # go on (or say why not) when the disk has answered
            self._ask_disk(after=0)
            return
        super().action_next()

    # ------------------------------------------------------------------ the choices
    def source(self) -> ExportSource:
        ol = self.query_one("#source-list", OptionList)
        if ol.highlighted is None or not self.candidates:
            return self.default
        return self.candidates[ol.highlighted]

    def model_source(self) -> str:
        """The model candidate the export reads (the core's pick where the optimizer or both is chosen)."""
        return self.source().path

    def component(self) -> Component:
        return self.source().component

    def options(self) -> ExportInputs:
        comp = self.component()
        return ExportInputs(
            src=typed(self.report, "." if comp not in ("model", "hf") else self.source().path),
            out=self._out_value(),
            component=comp,
            dtype=self.dtype(),
            max_shard_size=self.query_one("#shard", Input).value,
            base=self.query_one("#base-path", Input).value.strip() if comp == "merged" else "",
            config=self.query_one("#config-path", Input).value.strip() if self._needs_config() else "",
        )

    def dtype(self) -> str:
        ol = self.query_one("#dtype-list", OptionList)
        return ["keep", "fp32", "bf16", "fp16"][ol.highlighted or 0]

    def validate_step(self, name: str) -> Optional[str]:
        if name == "base":
            from ....core.adapters.base import model_folder_problem

            typed_base = self.query_one("#base-path", Input).value.strip()
            if not typed_base:
                return "type the base model's folder (its config.json and weights)"
            problem = model_folder_problem(Path(typed_base).expanduser())  # a few stat calls, no reading
            if problem:
                return f"{typed_base}: {problem}"
        if name == "config":
            typed_cfg = self.query_one("#config-path", Input).value.strip()
            if not typed_cfg:
                return "type the model's Hugging Face config.json (or the folder holding it)"
            where = Path(typed_cfg).expanduser()
            if not (where / "config.json" if where.is_dir() else where).is_file():  # a stat or two, no reading
                return f"{typed_cfg}: no config.json there"
        if name == "output":
            check = self.current_check()  # action_next waits for it
            if check is not None and check.refusal:
                return check.refusal
        if name == "shards":
            from ....core.export.plan import parse_size

            try:
                parse_size(self.query_one("#shard", Input).value)
            except ValueError as e:
                return str(e)
        return super().validate_step(name)

    def plan_inputs(self) -> ExportInputs:
        return self.options()

    def build_plan(self, o: ExportInputs) -> tuple[ExportChoice, str]:
        from ....core.export.api import plan_export

        out = Path(o.out).expanduser()
        if o.component == "adapter":
            plan, said = plan_export(o.src, out, dtype=o.dtype)
            return ExportChoice(plan), "\n".join(said + [plan.to_plan().describe()])
        if o.component == "hf":
            config = Path(o.config).expanduser() if o.config else None
            plan, said = plan_export(o.src, out, to="hf", config=config, dtype=o.dtype, max_shard_size=o.max_shard_size)
            return ExportChoice(plan), "\n".join(said + [plan.to_plan().describe()])
        if o.component == "merged":
            base = Path(o.base).expanduser()
            plan, said = plan_export(o.src, out, merge=True, base=base, dtype=o.dtype, max_shard_size=o.max_shard_size)
            return ExportChoice(plan), "\n".join(said + [plan.to_plan().describe()])
        if o.component != "both":
            plan, said = plan_export(o.src, out, component=o.component, dtype=o.dtype, max_shard_size=o.max_shard_size)
            return ExportChoice(plan), "\n".join(said + [plan.to_plan().describe()])
        # both: the two plans of one checkpoint, written side by side into OUT (core.export.both)
        pm, said_m = plan_export(o.src, out, dtype=o.dtype, max_shard_size=o.max_shard_size)
        # the optimizer state as stored, whatever the model's dtype: bf16 moments would not resume the run
        po, said_o = plan_export(o.src, out, component="optimizer", dtype="keep", max_shard_size=o.max_shard_size)
        return ExportChoice(pm, po), "\n".join(
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


def _default_out(inv: Inventory) -> Location:
    """The output folder the wizard proposes, beside the checkpoint (from the scan: no disk access here)."""
    root = inv.root.abspath
    base = root if inv.root.is_dir else root.parent
    if is_url(root):  # a checkpoint in object storage: the export goes to the current folder
        return Path.cwd() / f"{base.name}-safetensors"
    return base.parent / f"{base.name}-safetensors"
