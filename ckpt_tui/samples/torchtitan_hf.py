"""torchtitan saves of a tiny GQA Llama3 with distinct norm weights, and torchtitan's own answers as the oracle of
``export --to hf``: its ``Llama3StateDictAdapter.to_hf`` tensors and its model's logits.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.torchtitan_hf OUTDIR [variants]

Runs in the cached venv ``megatron-torchtitan`` (torchtitan 0.3.0). The run is torchtitan_ckpt.py's (torchtitan's
own ``CheckpointManager``, FSDP2 over a CPU mesh, one cross-entropy step per save, step-1 full and step-2 model-only
in bf16 via ``last_save_model_only`` / ``export_dtype="bfloat16"``), with another model: torchtitan's
``Llama3Model.Config`` with dim 64, 2 layers, 4 heads in 2 key/value heads (GQA), fused-QKV module
(``qkv_linear.wq/wk/wv``), ffn 192, vocab 256, rope theta 500000 with Llama 3.1 scaling (``scaling="llama"``),
RMSNorm eps 1e-5; built on CPU, ``init_weights``, then every linear/embedding weight redrawn with std 0.1 (0.02
leaves attention almost uniform) and every RMSNorm weight its own random values (all at 1.0, swapping two norms
would change nothing), before ``fully_shard``. The inner attention is torchtitan's causal SDPA (FlexAttention has no
CPU backward; it holds no parameters).

The job config: what torchtitan's ``Trainer.Config.to_dict()`` writes for ``--debug.save_config_file
job_config.json`` (``model_spec``: name, flavor and ``model.to_dict()``; ``debug``; ``checkpoint``), in the dump
folder as the trainer writes it: ``torchtitan/job_config.json`` (the Trainer itself needs CUDA: this is its
``model_spec`` part, serialised by torchtitan's own ``to_dict``).

The oracle, in a fresh 1-process run per step: a fresh non-sharded model (its state dict in bf16 for the bf16 step), torch DCP's
``load`` of the model's ``state_dict`` (what CheckpointManager.load does for the model), then
``oracle/to_hf-step-N.safetensors`` (``Llama3StateDictAdapter(config, None).to_hf(state_dict)``) and
``oracle/logits-step-N.pt`` ({"ids": [2, 40], "logits": [2, 40, 256] float32}: the model in fp32 on a fixed batch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ckpt_tui.samples._common import run_variants
from ckpt_tui.samples.torchtitan_ckpt import Tokens, TrainState

VARIANTS = ["torchtitan-hf"]
VOCAB, DIM, LAYERS, HEADS, KV_HEADS, SEQ = 256, 64, 2, 4, 2, 16
BATCH = (2, 40)


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

    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()
    return Llama3Model.Config(
        dim=DIM,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)),
        layers=_build_llama3_layers(
            fuse_qkv=True,
            n_layers=LAYERS,
            dim=DIM,
            n_heads=HEADS,
            n_kv_heads=KV_HEADS,
            hidden_dim=compute_ffn_hidden_dim(DIM, multiple_of=64),
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=64, theta=500000, scaling="llama"),
            attn_backend="flex",
        ),
    )


def _redraw(model) -> None:
    g = torch.Generator().manual_seed(99)  # the same on every rank
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def v_torchtitan_hf(out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(1234)
    cfg = _model_config()
    model = cfg.build()
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    _redraw(model)
    for block in model.layers.values() if hasattr(model.layers, "values") else model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)

    opt_cfg = default_adamw(lr=8e-4)
    opt_cfg.implementation = "for-loop"
    optimizers = opt_cfg.build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1, decay_type="linear").build(
        optimizers=optimizers, training_steps=4
    )
    dataloader = ParallelAwareDataloader(Tokens(rank), dp_rank=rank, dp_world_size=world, batch_size=2)
    train_state = TrainState()
    ckpt_cfg = CheckpointManager.Config(
        enable=True,
        folder="checkpoint",
        interval=1,
        last_save_model_only=True,
        export_dtype="bfloat16",
        keep_latest_k=0,
    )
    ckpt = ckpt_cfg.build(
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=str(out),
    )
    if rank == 0:
        job = {
            "model_spec": {"name": "llama3", "flavor": "tiny-gqa", "model": cfg.to_dict()},
            "dump_folder": str(out),
            "debug": {"save_config_file": "job_config.json", "print_config": False},
            "checkpoint": {"enable": True, "folder": "checkpoint", "interval": 1, "export_dtype": "bfloat16"},
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / "job_config.json").write_text(json.dumps(job, indent=2))
    batches = iter(dataloader)
    for step in (1, 2):
        tokens = next(batches)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        lr_schedulers.step()
        train_state.step = step
        train_state.ntokens_seen += tokens.numel() * world
        ckpt.save(curr_step=step, last_step=(step == 2))
    ckpt.close()
    dist.barrier()
    if rank == 0:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_", "LOCAL_", "MASTER_"))
            and k not in ("RANK", "WORLD_SIZE")
        }
        for step in (1, 2):
            cmd = [sys.executable, "-m", "ckpt_tui.samples.torchtitan_hf", "--oracle", str(out), str(step)]
            subprocess.run(cmd, env=env, check=True)


def oracle(out: Path, step: int) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

    torch.set_num_threads(1)
    cfg = _model_config()
    model = cfg.build()
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    sd = model.state_dict()
    if step == 2:  # the model-only export in bf16: its values as saved (the model stays fp32: its rope cache too)
        sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    dcp.load(sd, checkpoint_id=str(out / "checkpoint" / f"step-{step}"))
    model.load_state_dict(sd)
    hf = Llama3StateDictAdapter(cfg, None).to_hf(dict(sd))
    dest = out / "oracle"
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in hf.items()}, str(dest / f"to_hf-step-{step}.safetensors"))
    model = model.eval()
    ids = torch.randint(0, VOCAB, BATCH, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(ids)
    assert tuple(logits.shape) == (*BATCH, VOCAB), logits.shape
    torch.save({"ids": ids, "logits": logits.float().contiguous()}, dest / f"logits-step-{step}.pt")


FUNCS = {"torchtitan-hf": v_torchtitan_hf}


def main() -> None:
    if sys.argv[1:2] == ["--oracle"]:
        oracle(Path(sys.argv[2]), int(sys.argv[3]))
        return
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out))


if __name__ == "__main__":
    main()
