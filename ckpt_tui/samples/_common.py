"""Shared helpers for the sample-checkpoint generators.

Imported only inside generator processes (torch is imported at module level here,
but this module is never imported by ``ckpt_tui.samples`` itself).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ckpt_tui.samples import STEP_PREFIX

SEED = 1234

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=256,
    max_position_embeddings=64,
)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding + 2 blocks + LayerNorm + lm_head (optionally tied) + a buffer."""

    def __init__(self, vocab: int = 256, dim: int = 64, n_layers: int = 2, tied: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("position_scale", torch.linspace(0.5, 1.5, dim))

    def forward(self, ids):
        x = self.embed_tokens(ids) * self.position_scale.to(self.embed_tokens.weight.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def lm_loss(logits, ids):
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def batch(step: int, rank: int, bs: int = 2, seq: int = 16, vocab: int = 256):
    g = torch.Generator().manual_seed(SEED + 1000 * step + rank)
    return torch.randint(0, vocab, (bs, seq), generator=g)


def seed_all(seed: int = SEED) -> None:
    import random

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)


def init_dist(deepspeed: bool = False) -> tuple[int, int]:
    """Initialise gloo from the torchrun environment (or a 1-rank group when run bare).

    ``deepspeed=True`` for a process that will start DeepSpeed: it then skips building DeepSpeed's CPU
    shared-memory communication op. On CPU, DeepSpeed compiles that op with g++ the first time any process group
    starts (about 30 s, silently), yet it only serves ``inference_all_reduce`` (tensor-parallel inference
    kernels); training, ``save_checkpoint`` and ``load_checkpoint`` go through gloo all the same, so the
    checkpoints written are the same bytes with or without it.
    """
    torch.set_num_threads(1)
    if deepspeed:
        import importlib

        # not `import deepspeed.comm.torch as m`: that binds the attribute deepspeed.comm.torch, which is torch
        setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish() -> None:
    """End a generator rank: wait for the others, then leave without the interpreter's teardown.

    Every file is written and closed by now; the teardown only runs C++ destructors of gloo/DeepSpeed threads,
    which now and then abort ("terminate called without an active exception") after all the work is done and
    turn a complete launch into a failed one.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def parse_args(all_variants: list[str]) -> tuple[Path, list[str]]:
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    if not argv:
        raise SystemExit(f"usage: OUTDIR [variants...]; variants: {' '.join(all_variants)}")
    out = Path(argv[0])
    variants = argv[1:] or list(all_variants)
    unknown = sorted(set(variants) - set(all_variants))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {all_variants}")
    return out, variants


def init_deepspeed() -> None:
    """A generator rank that trains under DeepSpeed: gloo, then DeepSpeed's own view of the group."""
    init_dist(deepspeed=True)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")


def run_variants(names, make, *, setup=init_dist, teardown=None) -> None:
    """A generator's main: parse ``OUTDIR [variants...]`` (``names``: every variant, in order), ``setup()`` the
    rank (default: a gloo group; None for a single process), ``make(name, outdir / name)`` each variant asked
    for, ranks in step between variants, then ``teardown()`` and :func:`finish`."""
    outdir, variants = parse_args(list(names))
    if setup is None:
        torch.set_num_threads(1)
    else:
        setup()
    for name in variants:
        log(f"{name} ...")
        make(name, outdir / name)
        if dist.is_initialized():
            dist.barrier()
    if teardown is not None:
        teardown()
    finish()


def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{STEP_PREFIX}{msg}", flush=True)
