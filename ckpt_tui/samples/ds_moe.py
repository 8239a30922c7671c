"""DeepSpeed mixture-of-experts checkpoints on CPU: the real ``deepspeed.moe.layer.MoE`` (4 experts, top-1) in a
tiny model, its expert parameters in their own optimizer group (``split_params_into_different_moe_groups_for_optimizer``),
2 gloo ranks, 2 steps, ``engine.save_checkpoint``.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.ds_moe OUTDIR [variants]

DeepSpeed writes the experts apart: ``layer_{L}_expert_{E}_mp_rank_00_model_states.pt`` (each expert's module
weights, global expert ids) beside ``mp_rank_00_model_states.pt`` (everything else) and the ranks'
``*_optim_states.pt``, where the expert group is partitioned over the expert-data-parallel ranks only.
zero_to_fp32 and ds_to_universal both fail on it.

Each variant writes ``<variant>/checkpoint/`` and, outside it, ``<variant>/oracle/rank<r>.pt``: what a fresh
engine (other initial weights) holds after ``load_checkpoint`` -- ``safe_get_full_fp32_param`` (``masters``) and
``safe_get_full_optimizer_state`` (``optim``: ``<name>.exp_avg``, ``<name>.exp_avg_sq``) of every parameter of the
rank, the step and the module ``state_dict`` (``module``), all under GLOBAL expert names
(``...deepspeed_moe.experts.deepspeed_experts.{local id + ep_rank * num_local_experts}...``). Every rank writes its
own file (the experts of its expert-parallel rank); together they hold every expert.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import torch
from torch import nn

from ckpt_tui.samples._common import (
    SEED,
    Block,
    batch,
    init_deepspeed,
    lm_loss,
    run_variants,
    seed_all,
)

NUM_EXPERTS = 4
# name -> (expert-parallel size, ZeRO stage, bf16)
VARIANTS: dict[str, tuple[int, int, bool]] = {
    "ds-moe-ep2-zero2-bf16": (2, 2, True),
    "ds-moe-ep1-zero2-fp32": (1, 2, False),
    "ds-moe-ep2-zero1-bf16": (2, 1, True),
}
EXPERT_RE = re.compile(r"^(.*\.deepspeed_moe\.experts\.deepspeed_experts\.)(\d+)(\..*)$")


class Expert(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TinyMoE(nn.Module):
    """Embedding + a block + a DeepSpeed MoE layer (4 experts) + LayerNorm + lm_head + a buffer."""

    def __init__(self, ep_size: int, vocab: int = 256, dim: int = 64) -> None:
        from deepspeed.moe.layer import MoE

        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.block = Block(dim)
        self.moe = MoE(dim, expert=Expert(dim), num_experts=NUM_EXPERTS, ep_size=ep_size, k=1)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("position_scale", torch.linspace(0.5, 1.5, dim))

    def init_experts(self, ep_rank: int, seed: int) -> None:
        """MoE deep-copies one expert: give each its own weights, by global expert id (the same for any ep
        size), so an expert written under another's name cannot pass for it."""
        local = self.moe.num_local_experts
        with torch.no_grad():
            for i, expert in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
                g = torch.Generator().manual_seed(seed * 100 + ep_rank * local + i)
                for p in expert.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)

    def forward(self, ids):
        x = self.embed_tokens(ids) * self.position_scale.to(self.embed_tokens.weight.dtype)
        x = self.block(x)
        y, l_aux, _ = self.moe(x)
        return self.lm_head(self.norm(x + y)), l_aux


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


def build(variant: str, seed: int):
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.utils import groups

    ep, stage, bf16 = VARIANTS[variant]
    seed_all(seed)
    model = TinyMoE(ep)
    params = split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in model.parameters()], "name": "dense"}
    )
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(stage, bf16))
    ep_rank = groups._get_expert_parallel_rank(model.moe.expert_group_name)
    return engine, ep_rank


def global_name(name: str, ep_rank: int, num_local: int) -> str:
    m = EXPERT_RE.match(name)
    return f"{m.group(1)}{int(m.group(2)) + ep_rank * num_local}{m.group(3)}" if m else name


def oracle(engine, ep_rank: int) -> dict:
    """The loaded engine's fp32 masters, Adam state and step per parameter (global expert names), its module."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    local = engine.module.moe.num_local_experts
    opt = engine.optimizer
    opt._lazy_init_hp_params_optimizer_state()  # links each param's view of the Adam state (step() does it)
    masters, optim = {}, {}
    for n, p in engine.module.named_parameters():  # collective: every rank, the same order
        g = global_name(n, ep_rank, local)
        masters[g] = safe_get_full_fp32_param(p).clone()
        for key in ("exp_avg", "exp_avg_sq"):
            optim[f"{g}.{key}"] = safe_get_full_optimizer_state(p, key).clone()
    steps = {float(s["step"]) for s in opt.optimizer.state.values()}
    return {
        "optimizer_class": type(opt).__name__,
        "ep_rank": ep_rank,
        "ep_size": engine.module.moe.ep_size,
        "num_experts": engine.module.moe.num_experts,
        "masters": masters,
        "optim": optim,
        "step": steps.pop() if len(steps) == 1 else None,
        "module": {global_name(k, ep_rank, local): v.clone() for k, v in engine.module.state_dict().items()},
    }


def make(out: Path, variant: str, rank: int) -> None:
    import torch.distributed as dist

    engine, ep_rank = build(variant, SEED)
    engine.module.init_experts(ep_rank, SEED)
    for step in range(2):
        ids = batch(step, rank)
        logits, l_aux = engine(ids)
        engine.backward(lm_loss(logits, ids) + 0.01 * l_aux)
        engine.step()
    engine.save_checkpoint(str(out / "checkpoint"))
    engine.destroy()
    del engine
    gc.collect()
    fresh, ep_rank = build(variant, SEED + 99)  # other initial weights: what it holds after loading came from the files
    fresh.module.init_experts(ep_rank, SEED + 99)
    fresh.load_checkpoint(str(out / "checkpoint"))
    doc = oracle(fresh, ep_rank)
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
