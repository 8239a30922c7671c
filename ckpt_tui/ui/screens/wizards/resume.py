"""The "Resume under torch FSDP2" wizard (key `m`): a DeepSpeed ZeRO checkpoint -> a torch DCP folder
(``ckpt-tui convert --to torch-dcp``): why, where to write it, the plan; the app runs the conversion as
a job and shows the load code at the end (ui/job_kinds.py); it returns the core's TorchDcpPlan."""

from __future__ import annotations

from pathlib import Path

from ....core.convert.torch_dcp.plan import TorchDcpPlan
from ....core.facts import DeepSpeedZeroFacts
from .tag import TagConversionWizard


class ResumeWizard(TagConversionWizard[TorchDcpPlan]):
    TITLE = "Resume under torch FSDP2"
    READY = "Press enter to convert (written and verified in the background). The plan:"
    OUT_HELP = "The torch DCP folder (outside the run, beside it):"

    def why(self, f: DeepSpeedZeroFacts) -> str:
        return (
            f"`{self.report.inventory.shown(self.tag_path, slash=True)}` is a DeepSpeed ZeRO-"
            f"{f.get('zero_stage', '?')} checkpoint saved by {f.get('world_size', '?')} ranks.\n\n"
            "To continue this run under torch FSDP2 (fully_shard) or DDP, at any number of ranks, ckpt-tui "
            "writes a torch.distributed.checkpoint folder holding the model (the run's fp32 masters), the "
            "optimizer (torch AdamW: exp_avg, exp_avg_sq and step of every parameter) and the step, in the form "
            "torch's get_state_dict/set_state_dict use. Every tensor is read back with torch's dcp.load and "
            "compared bit-exact before the folder gets its name. The source is not modified.\n\n"
            "At the end it shows the code that loads it."
        )

    def default_out(self, tag_dir: Path) -> Path:
        from ....core.convert.torch_dcp import default_out

        return default_out(tag_dir)

    def make_plan(self, src: str, out: Path) -> TorchDcpPlan:
        from ....core.convert.torch_dcp import torch_dcp_plan

        return torch_dcp_plan(src, out)
