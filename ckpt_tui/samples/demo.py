"""The ``ckpt-tui demo`` run folder: the two user-report problems, made for real (torch + deepspeed only).

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.demo OUTDIR [demo]

OUTDIR/demo/
  fsdp-trainer-run/checkpoint-20/   HF-Trainer-style FSDP sharded checkpoint (accelerate's key layout):
      pytorch_model_fsdp_0/ (DCP, model.<fqn>), optimizer_0/ (DCP, optimizer.state.<fqn>.exp_avg ...),
      rng_state_{0,1}.pth, scheduler.pt, trainer_state.json    -- no .metadata at checkpoint-20/ itself
  deepspeed-zero2/                  DeepSpeed ZeRO-2 bf16 engine checkpoint without universal_checkpoint_info
      latest, zero_to_fp32.py, global_step3/{mp_rank_00_model_states.pt, bf16_zero_pp_rank_{0,1}_...}
"""

from __future__ import annotations

import torch.distributed as dist

from ckpt_tui.samples._common import finish, init_dist, log, parse_args

VARIANTS = ["demo"]
FSDP_STEPS = 20
DS_STEPS = 3


def main() -> None:
    outdir, _ = parse_args(VARIANTS)
    init_dist(deepspeed=True)
    from ckpt_tui.samples import ds_engine, torch_dcp

    root = outdir / "demo"
    ckpt = root / "fsdp-trainer-run" / f"checkpoint-{FSDP_STEPS}"
    log(f"torch FSDP: {FSDP_STEPS} training steps, then a sharded save as HF Trainer writes it")
    model, opt, sched = torch_dcp.fsdp1_model(steps=FSDP_STEPS, sched=True)
    torch_dcp.save_accelerate_fsdp_sharded(model, opt, ckpt)
    torch_dcp.save_trainer_extras(ckpt, sched, FSDP_STEPS, dist.get_world_size())
    dist.barrier()
    del model, opt, sched
    log(f"DeepSpeed ZeRO-2 (bf16): {DS_STEPS} training steps, then save_checkpoint")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    ds_engine.train_and_save(root / "deepspeed-zero2", stage=2, bf16=True, tied=False, frozen=False, steps=DS_STEPS)
    finish()


if __name__ == "__main__":
    main()
