"""verl checkpoints (FSDP backend), written by verl's own ``FSDPCheckpointManager.save_checkpoint`` on CPU.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.verl_fsdp OUTDIR [variants]
run by the interpreter of the cached ``verl`` venv (``samples/venvs.py``: verl pulls ray and its own transformers).

Each variant writes ``OUTDIR/<variant>/checkpoints/global_step_1/actor/`` exactly as verl's actor worker does:
``model_world_size_2_rank_{0,1}.pt``, ``optim_world_size_2_rank_{0,1}.pt``, ``extra_state_world_size_2_rank_{0,1}.pt``,
``fsdp_config.json`` and ``huggingface/`` (config + tokenizer). The model is a tiny ``LlamaForCausalLM`` (FSDP2: sharded on a
CPU mesh ``init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))``, the name verl's merger insists on) and takes
one AdamW step before the save.

- ``verl-fsdp2``: ``fully_shard`` per decoder layer and the root; rank files hold DTensors (``Shard(0)`` on the mesh).
- ``verl-fsdp1``: ``FullyShardedDataParallel(device_id=cpu, use_orig_params=True)`` per decoder layer on the
  default group (given ``device_mesh=mesh``, FSDP1 writes DTensors like FSDP2; without one it writes the
  ShardedTensors older verl runs hold); verl saves under SHARDED_STATE_DICT, so the model files hold ShardedTensors and the optimizer files the
  flat 1-D pieces of each parameter that the rank owns.

What is bypassed: verl's trainer and its ray workers are not run; the model, mesh, optimizer (AdamW) and scheduler
(LambdaLR) are built here in a few lines, and verl's own ``FSDPCheckpointManager`` — the code that writes every file
above — runs unpatched (nothing of verl or torch is patched). No ``sync_module_states`` (every rank seeds the same
weights instead). ``"hf_model"`` is left out of ``save_contents`` (its full-state gather segfaults under FSDP1 on
CPU, as torch's own gather does below); the trainer's ``latest_checkpointed_iteration.txt`` is not written (the
trainer, not the manager, writes it).

The oracles, written beside the checkpoint under ``OUTDIR/<variant>/oracle/`` (never inside ``checkpoints/``):
``optim_full.pt`` — the full optimizer state torch itself gathers from the live sharded model right after the save
(``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` with ``full_state_dict=True``: FQN-keyed);
``model_full.pt`` — the full fp32 weights: for ``verl-fsdp2`` gathered the same way (``get_model_state_dict``); for
``verl-fsdp1``, where that gather segfaults on CPU, the saved rank files loaded by torch inside the 2-rank group (the
only place torch loads ShardedTensors) and placed at their ShardMetadata offsets; and for ``verl-fsdp2`` ``merged/``,
verl's own ``python -m verl.model_merger merge --backend fsdp`` run on the saved checkpoint (bf16 safetensors +
config + tokenizer). verl's merger cannot read FSDP1's ShardedTensors (torch refuses to load them outside a process
group of the saving size), so ``verl-fsdp1`` has no ``merged/``.

Not a patch, but a difference from a real run: the model is built from its config, not ``from_pretrained``, so the
config is given ``architectures=["LlamaForCausalLM"]`` (what a downloaded config has; verl's merger picks the auto
class from it) and has no ``name_or_path`` (verl then saves no ``generation_config.json``, as it does for such
models). The vocabulary is odd (255) so that rows split unevenly over the ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ckpt_tui.samples._common import (
    TINY_LLAMA,
    batch,
    run_variants,
    seed_all,
)

VARIANTS = ["verl-fsdp2", "verl-fsdp1"]
CKPT = "checkpoints/global_step_1/actor"
# odd: the embedding and lm_head rows split unevenly over the 2 ranks (128 + 127), as real vocabularies often do
VOCAB = 255


def tiny_tokenizer():
    """A word-level tokenizer of VOCAB ids, built offline (no hub download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {w: i for i, w in enumerate(special + [f"w{i}" for i in range(VOCAB - len(special))])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    seed_all()
    # architectures as a from_pretrained model's config has it (verl's merger picks the auto class from it)
    return LlamaForCausalLM(
        LlamaConfig(
            **(TINY_LLAMA | {"vocab_size": VOCAB}), tie_word_embeddings=False, architectures=["LlamaForCausalLM"]
        )
    )


def _build(version: int):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = _model()
    if version == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        # no device_mesh: FSDP1 given a mesh saves DTensors too; on the default group it saves ShardedTensors
        model = FSDP(
            model,
            device_id=torch.device("cpu"),
            use_orig_params=True,
            auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 10)
    ids = batch(0, dist.get_rank(), vocab=VOCAB)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    return model, opt, sched


def _save(out: Path, version: int) -> None:
    from omegaconf import OmegaConf
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model, opt, sched = _build(version)
    mgr = FSDPCheckpointManager(
        model,
        opt,
        sched,
        processing_class=tiny_tokenizer(),
        checkpoint_config=OmegaConf.create({"save_contents": ["model", "optimizer", "extra"]}),
    )
    mgr.save_checkpoint(str(out / CKPT), global_step=1)
    (out / "oracle").mkdir(parents=True, exist_ok=True)
    # the full state torch gathers from the live sharded model (collectives: every rank calls). Without cpu_offload:
    # with it, FSDP1's optimizer gather on CPU returns exp_avg and exp_avg_sq as one aliased buffer (both hold
    # exp_avg_sq); the tensors already live on the CPU, so nothing is offloaded anyway
    opts = StateDictOptions(full_state_dict=True)
    full_optim = get_optimizer_state_dict(model, opt, options=opts)
    if version == 2:
        full_model = get_model_state_dict(model, options=opts)
        if dist.get_rank() == 0:
            torch.save(full_model, out / "oracle" / "model_full.pt")
    else:
        _fsdp1_model_oracle(out)
    if dist.get_rank() == 0:
        torch.save(full_optim, out / "oracle" / "optim_full.pt")
    dist.barrier()


def _fsdp1_model_oracle(out: Path) -> None:
    """FSDP1 on CPU segfaults in torch's full model-state gather (rank 0, SIGSEGV, in the unshard before
    ``state_dict``; verl's ``hf_model`` save goes the same way); the optimizer's gather works. So every rank
    ``torch.load``s its own ShardedTensor file inside this 2-rank group (the only place torch loads it), and rank 0
    places each local shard at the offsets torch's ShardMetadata gives."""
    dist.barrier()
    rank, world = dist.get_rank(), dist.get_world_size()
    sd = torch.load(out / CKPT / f"model_world_size_{world}_rank_{rank}.pt", weights_only=False)
    pieces = {}
    for k, v in sd.items():
        if hasattr(v, "local_shards"):
            pieces[k] = (
                tuple(v.size()),
                str(v.dtype),
                [(tuple(s.metadata.shard_offsets), s.tensor.clone()) for s in v.local_shards()],
            )
        else:
            pieces[k] = (tuple(v.shape), str(v.dtype), [((0,) * v.dim(), v.clone())])
    gathered: list[Any] = [None] * world  # each rank's pieces, filled in by all_gather_object
    dist.all_gather_object(gathered, pieces)
    if rank == 0:
        full = {}
        for k, (shape, _dtype, _) in gathered[0].items():
            t = torch.empty(shape, dtype=gathered[0][k][2][0][1].dtype)
            for part in gathered:
                for offsets, piece in part[k][2]:
                    t[tuple(slice(o, o + n) for o, n in zip(offsets, piece.shape))] = piece
            full[k] = t
        torch.save(full, out / "oracle" / "model_full.pt")


def _merge(out: Path) -> None:
    """verl's own model merger on the saved checkpoint (rank 0; it runs on CPU)."""
    if dist.get_rank() == 0:
        cmd = [
            sys.executable,
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(out / CKPT),
            "--target_dir",
            str(out / "oracle" / "merged"),
        ]
        env = dict(os.environ)
        for k in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RUN_ID",
            "GROUP_RANK",
            "ROLE_RANK",
        ):
            env.pop(k, None)
        subprocess.run(cmd, check=True, env=env)
    dist.barrier()


def v_verl_fsdp2(out: Path) -> None:
    _save(out, 2)
    _merge(out)


def v_verl_fsdp1(out: Path) -> None:
    _save(out, 1)


FUNCS = {"verl-fsdp2": v_verl_fsdp2, "verl-fsdp1": v_verl_fsdp1}


def main() -> None:
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out))


if __name__ == "__main__":
    main()
