"""The "Resume under torch FSDP2" wizard (key `m`): a DeepSpeed ZeRO checkpoint -> a torch DCP folder
(``ckpt-tui convert --to torch-dcp``): why, where to write it, the plan; the app runs the conversion as
a job and shows the load code at the end (job_actions)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Static

from ...core.facts import DeepSpeedZeroFacts
from ...core.types import user_path
from .wizards import PlannedWizard


class ResumeWizard(PlannedWizard):
    STEPS = ("why", "output", "confirm")
    TITLE = "Resume under torch FSDP2"
    READY = "Press enter to convert (written and verified in the background). The plan:"
    FAILED = "Cannot convert"

    def __init__(self, report, tag_path: str):
        super().__init__()
        self.report = report
        self.tag_path = tag_path

    def step_titles(self):
        return ["why", "where to write it", "check the plan and run"]

    def run_label(self):
        return "Convert"

    def panes(self) -> ComposeResult:
        node = self.report.inventory.node(self.tag_path)
        f = cast(DeepSpeedZeroFacts, node.facts) if node else DeepSpeedZeroFacts()
        why = (f"`{self.report.inventory.shown(self.tag_path, slash=True)}` is a DeepSpeed ZeRO-"
               f"{f.get('zero_stage', '?')} checkpoint saved by {f.get('world_size', '?')} ranks.\n\n"
               "To continue this run under torch FSDP2 (fully_shard) or DDP, at any number of ranks, ckpt-tui "
               "writes a torch.distributed.checkpoint folder holding the model (the run's fp32 masters), the "
               "optimizer (torch AdamW: exp_avg, exp_avg_sq and step of every parameter) and the step, in the form "
               "torch's get_state_dict/set_state_dict use. Every tensor is read back with torch's dcp.load and "
               "compared bit-exact before the folder gets its name. The source is not modified.\n\n"
               "At the end it shows the code that loads it.")
        from ...core.convert.torch_dcp import default_out

        out = default_out(node.abspath if node is not None else self.report.inventory.root.abspath)
        with Vertical(id="why", classes="pane"):
            yield Static(why, classes="explain")
        with Vertical(id="output", classes="pane"):
            yield Static("The torch DCP folder (outside the run, beside it):", classes="explain")
            yield Input(value=self.report.inventory.user_form(out), id="out")
        yield from self.confirm_pane()

    def plan_inputs(self):
        return self.query_one("#out", Input).value

    def build_plan(self, out):
        from ...core.convert.torch_dcp import torch_dcp_plan

        inv = self.report.inventory  # the tag as the user would type it: what the plan and the code then name
        plan = torch_dcp_plan(user_path(inv.given or str(inv.root.abspath), self.tag_path), Path(out).expanduser())
        return plan, plan.to_plan().describe()
