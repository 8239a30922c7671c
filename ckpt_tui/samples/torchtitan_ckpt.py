"""torchtitan checkpoints, written by torchtitan's own ``CheckpointManager`` (torchtitan 0.3.0).

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.torchtitan_ckpt OUTDIR [variants]

Runs in the cached venv ``megatron-torchtitan`` (torchtitan 0.3.0 + triton, which its import needs; torch 2.13.0 held).
torchtitan's train entry (``torchtitan.train`` / ``Trainer``) needs CUDA; its ``CheckpointManager`` does not, so
this module does what ``Trainer.__init__`` does for the checkpoint, on CPU, with torchtitan's own pieces:
a tiny ``Llama3Model`` (torchtitan's Llama3 config with dim 64, 2 layers, 4 heads, vocab 256, fused QKV, as its
``debugmodel`` but smaller) built on the meta device and initialised with its own ``init_weights``, FSDP2
``fully_shard`` per block and on the whole model over a CPU mesh named ("dp_shard",) (gloo), torchtitan's
``OptimizersContainer`` (``default_adamw``, ``implementation="for-loop"``: its default "fused" is CUDA-only),
``LRSchedulersContainer`` (warmup 1, linear decay), a ``ParallelAwareDataloader`` over a small synthetic
token dataset, and ``CheckpointManager.Config(enable=True, interval=1, last_save_model_only=True,
export_dtype="bfloat16", keep_latest_k=0).build(...)`` with ``states={"train_state": ...}``.

What was bypassed on CPU, and nothing else: the ``Trainer`` itself (the ``train_state`` object is a small
Stateful with the Trainer's own ``state_dict``: ``{"step", "ntokens_seen"}``), and its forward/loss: one
training step per save is a plain cross-entropy on the model's output; and the inner attention is torchtitan's
own causal ``ScaledDotProductAttention`` instead of the ``FlexAttention`` its Llama3 configs name, whose backward
is not implemented on CPU (the inner attention holds no parameters: the checkpoint's names and shapes are the same).

Writes ``torchtitan/checkpoint/step-1/`` (full: model + optimizer + lr_scheduler + dataloader + train_state,
``save(curr_step=1)``) and ``torchtitan/checkpoint/step-2/`` (model only in bf16: ``save(curr_step=2,
last_step=True)``), as a torchtitan run does. The oracle for both is torch's own ``dcp_to_torch_save`` (no
framework needed: the test venv has torch).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from ckpt_tui.samples._common import run_variants

VARIANTS = ["torchtitan"]
VOCAB, DIM, SEQ = 256, 64, 16


class Tokens(IterableDataset):
    """Synthetic token rows, the same on every run (seeded per data-parallel rank)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self):
        g = torch.Generator().manual_seed(1000 + self.rank)
        while True:
            yield torch.randint(0, VOCAB, (SEQ,), generator=g)


class TrainState(Stateful):
    """What torchtitan's Trainer saves as ``train_state`` (Trainer.state_dict / load_state_dict)."""

    def __init__(self) -> None:
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict) -> None:  # pragma: no cover - not loaded here
        self.step = state_dict["step"]
        self.ntokens_seen = state_dict["ntokens_seen"]


def _model_config():
    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common import (
        ComplexRoPE,
        Embedding,
        Linear,
        RMSNorm,
        ScaledDotProductAttention,
        compute_ffn_hidden_dim,
    )
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )

    # FlexAttention has no backward on CPU: torchtitan's own causal SDPA inner attention instead (no parameters)
    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()
    return Llama3Model.Config(
        dim=DIM,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)),
        layers=_build_llama3_layers(
            fuse_qkv=True,
            n_layers=2,
            dim=DIM,
            n_heads=4,
            hidden_dim=compute_ffn_hidden_dim(DIM, multiple_of=64),
            rope=ComplexRoPE.Config(dim=DIM // 4, max_seq_len=64, theta=500000, scaling="llama"),
            attn_backend="flex",
        ),
    )


def v_torchtitan(out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(1234)
    with torch.device("meta"):
        model = _model_config().build()
    for block in model.layers.values() if hasattr(model.layers, "values") else model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))

    opt_cfg = default_adamw(lr=8e-4)
    opt_cfg.implementation = "for-loop"
    optimizers = opt_cfg.build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1, decay_type="linear").build(
        optimizers=optimizers, training_steps=4
    )
    dataloader = ParallelAwareDataloader(Tokens(rank), dp_rank=rank, dp_world_size=world, batch_size=2)
    train_state = TrainState()
    ckpt = CheckpointManager.Config(
        enable=True,
        folder="checkpoint",
        interval=1,
        last_save_model_only=True,
        export_dtype="bfloat16",
        keep_latest_k=0,
    ).build(
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=str(out),
    )

    batches = iter(dataloader)
    for step in (1, 2):
        tokens = next(batches)
        inputs = tokens[:, :-1]
        logits = model(inputs)  # one causal document per row
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        lr_schedulers.step()
        train_state.step = step
        train_state.ntokens_seen += tokens.numel() * world
        ckpt.save(curr_step=step, last_step=(step == 2))
    ckpt.close()


FUNCS = {"torchtitan": v_torchtitan}


def main() -> None:
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out))


if __name__ == "__main__":
    main()
