"""Single-process checkpoints: Accelerate save_state, HF save_pretrained, Megatron legacy, plain torch.save.

python -m torch.distributed.run --standalone --nproc_per_node 1 -m ckpt_tui.samples.single OUTDIR [variants]
(also runs as plain ``python -m ckpt_tui.samples.single OUTDIR``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ckpt_tui.samples._common import (
    TINY_LLAMA,
    TinyLM,
    batch,
    lm_loss,
    run_variants,
    seed_all,
)

VARIANTS = [
    "accelerate-save-state",
    "hf-model-sharded",
    "hf-model-bin",
    "megatron-legacy",
    "plain-pt",
    "plain-pt-optim",
    "plain-pt-optim-groups",
    "lightning-file-optim",
]


def _tiny_llama(tied: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    seed_all()
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, tie_word_embeddings=tied))


def v_accelerate_save_state(out: Path) -> None:
    from accelerate import Accelerator

    seed_all()
    acc = Accelerator(cpu=True)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 10)
    model, opt, sched = acc.prepare(model, opt, sched)
    for step in range(2):
        ids = batch(step, 0)
        acc.backward(lm_loss(model(ids), ids))
        opt.step()
        sched.step()
        opt.zero_grad()
    acc.save_state(str(out))
    acc.end_training()


def v_hf_model_sharded(out: Path) -> None:
    _tiny_llama().save_pretrained(out, max_shard_size="100KB")


def v_hf_model_bin(out: Path) -> None:
    """pytorch_model.bin + config.json.

    transformers 5 always writes safetensors: ``save_pretrained(safe_serialization=False)`` is silently
    ignored. Write the .bin the way transformers 4.x did (torch.save of the state dict, config beside it).
    """
    model = _tiny_llama()
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    torch.save(model.state_dict(), out / "pytorch_model.bin")


def v_megatron_legacy(out: Path) -> None:
    """Megatron-LM legacy layout: iter_XXXXXXX/mp_rank_00/model_optim_rng.pt (torch.save)."""
    import random

    import numpy as np

    seed_all()
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = batch(0, 0)
    lm_loss(model(ids), ids).backward()
    opt.step()
    args = argparse.Namespace(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        padded_vocab_size=256,
        seq_length=16,
        max_position_embeddings=64,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        bf16=False,
        fp16=False,
        iteration=10,
        consumed_train_samples=20,
    )
    state = {
        "args": args,
        "checkpoint_version": 3.0,
        "iteration": 10,
        "model": {"language_model": model.state_dict()},
        "optimizer": opt.state_dict(),
        "opt_param_scheduler": {"max_lr": 1e-3, "min_lr": 0.0, "num_steps": 20},
        "rng_state": [
            {
                "random_rng_state": random.getstate(),
                "np_rng_state": np.random.get_state(),
                "torch_rng_state": torch.get_rng_state(),
            }
        ],
    }
    d = out / "iter_0000010" / "mp_rank_00"
    d.mkdir(parents=True, exist_ok=True)
    torch.save(state, d / "model_optim_rng.pt")
    (out / "latest_checkpointed_iteration.txt").write_text("10")


def v_plain_pt(out: Path) -> None:
    seed_all()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(TinyLM().state_dict(), out / "model.pt")


def _train_adamw(model, groups, steps: int = 2):
    """The real torch.optim.AdamW over ``groups``, ``steps`` steps of the tiny LM loss."""
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(steps):
        ids = batch(step, 0)
        lm_loss(model(ids), ids).backward()
        opt.step()
        opt.zero_grad()
    return opt


def v_plain_pt_optim(out: Path) -> None:
    """torch.save({"model": ..., "optimizer": opt.state_dict()}): one param group over model.parameters(),
    so the index-keyed optimizer state lines up with the model's parameters."""
    seed_all()
    model = TinyLM()
    opt = _train_adamw(model, model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 2}, out / "checkpoint.pt")


def v_plain_pt_optim_groups(out: Path) -> None:
    """The usual decay / no-decay split: two param groups whose concatenated order is not the model's,
    so index-keyed state cannot be named by the model's parameters."""
    seed_all()
    model = TinyLM()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = _train_adamw(model, [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}])
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, out / "checkpoint.pt")


def v_lightning_file_optim(out: Path) -> None:
    """A single-file Lightning .ckpt (the real Trainer on CPU, AdamW): `state_dict` + `optimizer_states`."""
    import lightning as L

    from ckpt_tui.samples.lightning_ckpt import module_cls

    seed_all()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(out),
    )
    data = torch.utils.data.DataLoader([batch(i, 0, bs=1)[0] for i in range(4)], batch_size=2)
    trainer.fit(module_cls()(), data)
    trainer.save_checkpoint(out / "last.ckpt")


FUNCS = {
    "accelerate-save-state": v_accelerate_save_state,
    "hf-model-sharded": v_hf_model_sharded,
    "hf-model-bin": v_hf_model_bin,
    "megatron-legacy": v_megatron_legacy,
    "plain-pt": v_plain_pt,
    "plain-pt-optim": v_plain_pt_optim,
    "plain-pt-optim-groups": v_plain_pt_optim_groups,
    "lightning-file-optim": v_lightning_file_optim,
}


def main() -> None:
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out), setup=None)


if __name__ == "__main__":
    main()
