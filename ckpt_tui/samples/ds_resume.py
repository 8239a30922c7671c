"""DeepSpeed runs to resume under torch FSDP2 (``ckpt-tui convert --to torch-dcp``), with their reference step.

For each variant: train ``TinyLM`` under DeepSpeed ZeRO-2 or ZeRO-3 in fp32 with torch's AdamW
(``{"type": "AdamW", "params": {..., "torch_adam": true}}``) for ``STEPS`` steps and
``engine.save_checkpoint(<variant>/checkpoint)``; then take one more step under DeepSpeed on the fixed
global batch :func:`global_batch` (``GLOBAL_BATCH`` rows, split evenly over the ranks, mean loss) and
write the full parameters after it to ``<variant>/reference.pt`` (``{"batch", "params", "step"}``):
what a run converted from the saved checkpoint must reach after that same step.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.ds_resume OUTDIR [variants]
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from ckpt_tui.samples._common import (
    SEED,
    TinyLM,
    batch,
    init_deepspeed,
    lm_loss,
    run_variants,
    seed_all,
)

VARIANTS: dict[str, int] = {"ds-resume-zero2": 2, "ds-resume-zero3": 3}  # name -> ZeRO stage
STEPS = 2
GLOBAL_BATCH = 6  # divisible by 1, 2 and 3 ranks: the DeepSpeed run has 2, the test resumes at 1 and 3
SEQ = 16
# torch.optim.AdamW's hyper-parameters, the same on both sides (DeepSpeed builds torch.optim.AdamW from them)
ADAMW = {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def global_batch():
    g = torch.Generator().manual_seed(SEED + 777)
    return torch.randint(0, 256, (GLOBAL_BATCH, SEQ), generator=g)


def ds_config(stage: int, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {**ADAMW, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }


def run(out: Path, stage: int) -> None:
    import deepspeed
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    seed_all()
    model = TinyLM()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config(stage, world)
    )
    for step in range(STEPS):
        ids = batch(step, rank, bs=GLOBAL_BATCH // world, seq=SEQ)
        loss = lm_loss(engine(ids), ids)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out / "checkpoint"))
    # the reference step: this rank's even share of the global batch, mean loss
    g = global_batch()
    n = GLOBAL_BATCH // world
    ids = g[rank * n : (rank + 1) * n]
    loss = lm_loss(engine(ids), ids)
    engine.backward(loss)
    engine.step()
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
        full = {k: p.detach().clone().float() for k, p in engine.module.named_parameters()}
    if rank == 0:
        torch.save({"batch": g, "params": full, "step": STEPS + 1}, out / "reference.pt")
    dist.barrier()
    engine.destroy()
    del engine, model
    gc.collect()


def main() -> None:
    run_variants(VARIANTS, lambda name, out: run(out, VARIANTS[name]), setup=init_deepspeed)


if __name__ == "__main__":
    main()
