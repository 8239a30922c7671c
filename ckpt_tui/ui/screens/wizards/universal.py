"""The universal-checkpoint wizard (key `u`): a DeepSpeed ZeRO tag -> a universal checkpoint beside it
(``ckpt-tui universal``): why, where to write it, the plan; it returns the core's UniversalPlan."""

from __future__ import annotations

from pathlib import Path

from ....core.convert.universal.plan import UniversalPlan
from ....core.facts import DeepSpeedZeroFacts
from .tag import TagConversionWizard


class UniversalWizard(TagConversionWizard[UniversalPlan]):
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
        from ....core.convert.universal.plan import default_out

        return default_out(tag_dir)

    def make_plan(self, src: str, out: Path) -> UniversalPlan:
        from ....core.convert.universal import universal_plan

        return universal_plan(src, out)
