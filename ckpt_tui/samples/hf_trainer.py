"""transformers.Trainer checkpoints on CPU: DeepSpeed ZeRO-1/2/3 and (patched) FSDP1/FSDP2 sharded.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.hf_trainer OUTDIR [variants]
Each variant directory is a Trainer output_dir containing checkpoint-2/.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from ckpt_tui.samples._common import (
    TINY_LLAMA,
    batch,
    init_deepspeed,
    run_variants,
    seed_all,
)

# name -> (kind, zero stage or fsdp version, tied, frozen embedding)
VARIANTS: dict[str, tuple[str, int, bool, bool]] = {
    "hf-ds-zero1": ("ds", 1, False, False),
    "hf-ds-zero2": ("ds", 2, False, False),
    "hf-ds-zero3": ("ds", 3, False, False),
    "hf-ds-zero2-tied-frozen": ("ds", 2, True, True),
    "hf-fsdp1": ("fsdp", 1, False, False),
    "hf-fsdp2": ("fsdp", 2, False, False),
}
STEPS = 2


def hf_ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 10**9,
        "bf16": {"enabled": "auto"},
        "optimizer": {
            "type": "Adam",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto", "torch_adam": True},
        },
        "zero_optimization": {"stage": stage},
    }


class TokenData(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        self.rows = [batch(i, 0, bs=1, seq=16)[0] for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


def cpu_fsdp_trainer_cls():
    from transformers import Trainer

    class CpuFsdpTrainer(Trainer):
        """Accelerate silently falls back to DDP on CPU; force its FSDP path (FIXTURES.md)."""

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            from accelerate.state import AcceleratorState, PartialState
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            for shared in (PartialState._shared_state, AcceleratorState._shared_state):
                shared["distributed_type"] = DistributedType.FSDP
                shared["device"] = torch.device("cpu")
            AcceleratorState._shared_state["fsdp_plugin"] = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            self.is_fsdp_enabled = True

    return CpuFsdpTrainer


def reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def run_variant(out: Path, kind: str, n: int, tied: bool, frozen: bool) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

    seed_all()
    common = dict(
        output_dir=str(out),
        per_device_train_batch_size=2,
        max_steps=STEPS,
        save_steps=STEPS,
        save_strategy="steps",
        logging_steps=1,
        learning_rate=1e-3,
        bf16=True,
        use_cpu=True,
        report_to=[],
        seed=1234,
        data_seed=1234,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if kind == "ds":
        args = TrainingArguments(deepspeed=hf_ds_config(n), **common)
        trainer_cls = Trainer
    else:
        args = TrainingArguments(
            fsdp="full_shard",
            fsdp_config={
                "version": n,
                "state_dict_type": "SHARDED_STATE_DICT",
                "sync_module_states": False,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            },
            **common,
        )
        trainer_cls = cpu_fsdp_trainer_cls()
    config = LlamaConfig(**TINY_LLAMA, tie_word_embeddings=tied)
    model = AutoModelForCausalLM.from_config(config)
    if frozen:
        model.get_input_embeddings().weight.requires_grad_(False)
    trainer = trainer_cls(model=model, args=args, train_dataset=TokenData())
    trainer.train()
    if kind == "ds":
        trainer.deepspeed.destroy()
    del trainer, model
    gc.collect()
    reset_accelerate()
    if kind == "ds":
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()


def main() -> None:
    import os

    def make(name: str, out: Path) -> None:
        env = dict(os.environ)
        run_variant(out, *VARIANTS[name])
        # TrainingArguments exports ACCELERATE_USE_DEEPSPEED / ACCELERATE_USE_FSDP ...; undo for the next variant
        os.environ.clear()
        os.environ.update(env)

    run_variants(VARIANTS, make, setup=init_deepspeed)


if __name__ == "__main__":
    main()
