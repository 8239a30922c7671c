"""DeepSpeed engine checkpoints (``engine.save_checkpoint``) on CPU.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.ds_engine OUTDIR [variants]
"""

from __future__ import annotations

import gc
from pathlib import Path

from ckpt_tui.samples._common import (
    TinyLM,
    batch,
    init_deepspeed,
    lm_loss,
    run_variants,
    seed_all,
)

# name -> (zero stage, bf16, tied embeddings, frozen embedding)
VARIANTS: dict[str, tuple[int, bool, bool, bool]] = {
    "ds-zero1-bf16": (1, True, False, False),
    "ds-zero2-bf16": (2, True, False, False),
    "ds-zero3-bf16": (3, True, False, False),
    "ds-zero2-fp32": (2, False, False, False),
    "ds-zero2-tied": (2, True, True, False),
    "ds-zero1-frozen": (1, True, False, True),
    "ds-zero2-frozen": (2, True, False, True),
    "ds-zero3-frozen": (3, True, False, True),
    "ds-zero2-3ranks": (2, True, False, False),
    "ds-zero3-3ranks": (3, True, False, False),
    "demo-zero2": (2, True, False, False),
}


def ds_config(stage: int, bf16: bool) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def train_and_save(save_dir: Path, stage: int, bf16: bool, tied: bool, frozen: bool, steps: int = 2) -> None:
    import deepspeed

    rank = deepspeed.comm.get_rank() if deepspeed.comm.is_initialized() else 0
    seed_all()
    model = TinyLM(tied=tied)
    if frozen:
        model.embed_tokens.weight.requires_grad_(False)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config(stage, bf16),
    )
    for step in range(steps):
        ids = batch(step, rank)
        loss = lm_loss(engine(ids), ids)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(save_dir))
    engine.destroy()
    del engine, model
    gc.collect()


def main() -> None:
    run_variants(VARIANTS, lambda name, out: train_and_save(out, *VARIANTS[name]), setup=init_deepspeed)


if __name__ == "__main__":
    main()
