"""DeepSpeed engine checkpoints beyond ZeRO-1/2/3, on CPU: ZeRO stage 0 (bf16 and fp32), BF16_Optimizer
(ZeRO-1 + bf16 + fp32 gradient accumulation) and a 2-stage pipeline.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.ds_beyond OUTDIR [variants]

Each variant writes ``<variant>/checkpoint/`` (``engine.save_checkpoint``) and, outside it,
``<variant>/oracle/rank<r>.pt``: what DeepSpeed itself gives back -- a fresh engine (other initial weights)
``load_checkpoint`` of that checkpoint, then its fp32 master of each parameter (``masters``: the optimizer's
fp32 copy where there is one, else the module weight), its Adam state per parameter (``optim``:
``<name>.exp_avg``, ``<name>.exp_avg_sq``), the step, and the module's ``state_dict`` (``module``).
Rank 0 writes it (every rank the same) except for the pipeline, where each rank writes its own stage.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch
from torch import nn

from ckpt_tui.samples._common import (
    SEED,
    Block,
    TinyLM,
    batch,
    init_deepspeed,
    lm_loss,
    run_variants,
    seed_all,
)

VARIANTS = ("ds-zero0-bf16", "ds-zero0-fp32", "ds-bf16-optimizer", "ds-pipeline")


def ds_config(variant: str) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 0},
    }
    if variant == "ds-zero0-bf16":  # -> FP16_UnfusedOptimizer (fp32 masters in fp32_groups)
        cfg["bf16"] = {"enabled": True}
    elif variant == "ds-bf16-optimizer":  # ZeRO-1 + bf16 + fp32 grad accumulation -> BF16_Optimizer
        cfg["bf16"] = {"enabled": True}
        cfg["zero_optimization"] = {"stage": 1}
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    elif variant == "ds-pipeline":  # 2 stages, one per rank; fp32, plain Adam per stage
        cfg["gradient_accumulation_steps"] = 2
    return cfg


def pipeline_model():
    """TinyLM's layers as a 2-stage PipelineModule (no buffer: a pipeline passes one activation along)."""
    from deepspeed.pipe import LayerSpec, PipelineModule

    layers = [
        LayerSpec(nn.Embedding, 256, 64),
        LayerSpec(Block, 64),
        LayerSpec(Block, 64),
        LayerSpec(nn.LayerNorm, 64),
        LayerSpec(nn.Linear, 64, 256, bias=False),
    ]
    return PipelineModule(layers=layers, num_stages=2, loss_fn=lm_loss, partition_method="parameters")


def build(variant: str, seed: int):
    import deepspeed

    seed_all(seed)
    model = pipeline_model() if variant == "ds-pipeline" else TinyLM()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters()], config=ds_config(variant)
    )
    return engine


def train(engine, variant: str, rank: int, steps: int = 2) -> None:
    if variant == "ds-pipeline":
        for step in range(steps):
            data = iter([(batch(step, m), batch(step, m)) for m in range(2)])
            engine.train_batch(data_iter=data)
        return
    for step in range(steps):
        ids = batch(step, rank)
        loss = lm_loss(engine(ids), ids)
        engine.backward(loss)
        engine.step()


def oracle(engine, variant: str) -> dict:
    """The loaded engine's fp32 masters, Adam state and step per parameter name, and its module state_dict."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    names = {id(p): n for n, p in engine.module.named_parameters()}
    opt = engine.optimizer
    masters, optim, steps = {}, {}, set()
    kind = type(opt).__name__
    if kind == "BF16_Optimizer":
        opt._lazy_init_hp_params_optimizer_state()  # links each param's view of the Adam state (step() does it)
        for n, p in engine.module.named_parameters():
            masters[n] = safe_get_full_fp32_param(p).clone()
            for key in ("exp_avg", "exp_avg_sq"):
                optim[f"{n}.{key}"] = safe_get_full_optimizer_state(p, key).clone()
        for s in opt.optimizer.state.values():
            steps.add(float(s["step"]))
    else:
        if kind == "FP16_UnfusedOptimizer":  # fp32_groups[g][i] is the master of fp16_groups[g][i]
            pairs = [(names[id(lp)], hp) for lg, hg in zip(opt.fp16_groups, opt.fp32_groups) for lp, hp in zip(lg, hg)]
            inner = opt.optimizer
        else:  # no wrapper (fp32): the torch optimizer holds the module's parameters
            inner = getattr(opt, "optimizer", opt)
            pairs = [(names[id(p)], p) for g in inner.param_groups for p in g["params"]]
        for n, hp in pairs:
            masters[n] = hp.detach().clone()
            st = inner.state[hp]
            for key in ("exp_avg", "exp_avg_sq"):
                optim[f"{n}.{key}"] = st[key].clone()
            steps.add(float(st["step"]))
    return {
        "optimizer_class": kind,
        "masters": masters,
        "optim": optim,
        "step": steps.pop() if len(steps) == 1 else None,
        "module": {k: v.clone() for k, v in engine.module.state_dict().items()},
    }


def make(out: Path, variant: str, rank: int) -> None:
    import torch.distributed as dist

    engine = build(variant, SEED)
    train(engine, variant, rank)
    engine.save_checkpoint(str(out / "checkpoint"))
    engine.destroy()
    del engine
    gc.collect()
    fresh = build(variant, SEED + 99)  # other initial weights: what it holds after loading came from the files
    fresh.load_checkpoint(str(out / "checkpoint"))
    doc = oracle(fresh, variant)
    if variant == "ds-pipeline" or rank == 0:
        (out / "oracle").mkdir(parents=True, exist_ok=True)
        torch.save(doc, out / "oracle" / f"rank{rank}.pt")
    dist.barrier()
    fresh.destroy()
    del fresh
    gc.collect()


def main() -> None:
    import torch.distributed as dist

    run_variants(VARIANTS, lambda name, out: make(out, name, dist.get_rank()), setup=init_deepspeed)


if __name__ == "__main__":
    main()
