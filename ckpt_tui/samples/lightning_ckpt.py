"""Lightning checkpoints on CPU: DeepSpeed ZeRO-2/3 (patched strategy) and FSDP sharded (patched strategy).

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.lightning_ckpt OUTDIR [variants]
Each variant directory is a run folder; the checkpoint is ``checkpoints/epoch=0-step=2.ckpt/``.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from ckpt_tui.samples._common import (
    TinyLM,
    batch,
    init_dist,
    lm_loss,
    run_variants,
    seed_all,
)

VARIANTS = {
    "lightning-ds-zero2": ("ds", 2),
    "lightning-ds-zero3": ("ds", 3),
    "lightning-fsdp": ("fsdp", 0),
}
STEPS = 2


def _strategies():
    from lightning.fabric.utilities.seed import reset_seed
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

    class CpuDeepSpeedStrategy(DeepSpeedStrategy):
        """DeepSpeedStrategy refuses CPU; the engine underneath works (FIXTURES.md)."""

        def setup_environment(self) -> None:
            DDPStrategy.setup_environment(self)

        def setup_distributed(self) -> None:
            reset_seed()
            self.set_world_ranks()
            self._init_deepspeed_distributed()

        @property
        def root_device(self) -> torch.device:
            return torch.device("cpu", 0)

    class CpuFSDPStrategy(FSDPStrategy):
        """FSDPStrategy passes device_id=root_device.index (None on CPU), which FSDP1 rejects."""

        @property
        def root_device(self) -> torch.device:
            return torch.device("cpu")

        def _setup_model(self, model):
            from torch.distributed.fsdp import FullyShardedDataParallel

            return FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            )

    return CpuDeepSpeedStrategy, CpuFSDPStrategy


def module_cls():
    import lightning as L

    class LitLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = TinyLM()

        def training_step(self, ids, idx):
            return lm_loss(self.model(ids), ids)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return LitLM


class _Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i):
        return batch(i, 0, bs=1)[0]


def run_variant(out: Path, kind: str, stage: int) -> None:
    import lightning as L

    seed_all()
    ds_cls, fsdp_cls = _strategies()
    if kind == "ds":
        strategy = ds_cls(
            config={
                "steps_per_print": 10**9,
                "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
                "zero_optimization": {"stage": stage},
                "bf16": {"enabled": True},
            },
            process_group_backend="gloo",
        )
        precision = "bf16-mixed"
    else:
        strategy = fsdp_cls(state_dict_type="sharded", process_group_backend="gloo")
        precision = "32-true"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("WORLD_SIZE", "1")),
        strategy=strategy,
        precision=precision,
        max_epochs=1,
        limit_train_batches=STEPS,
        default_root_dir=str(out),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=str(out / "checkpoints"))],
    )
    trainer.fit(module_cls()(), torch.utils.data.DataLoader(_Data(), batch_size=2))
    del trainer
    gc.collect()


def main() -> None:
    run_variants(VARIANTS, lambda name, out: run_variant(out, *VARIANTS[name]), setup=lambda: init_dist(deepspeed=True))


if __name__ == "__main__":
    main()
