"""Megatron-Core ``torch_dist`` checkpoints, written by megatron-core's own ``dist_checkpointing.save``.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.megatron_dist OUTDIR [variants]

Runs in the cached venv ``megatron-torchtitan`` (megatron-core 0.16.x, the last for Python 3.11; torch 2.13.0 held),
or ``megatron-019`` (megatron-core 0.19.2) for the variants its groups name: the code is the same for both.
A tiny ``GPTModel`` (2 layers, hidden 64, 4 heads, vocab 256, bf16 params, the local layer spec: no Transformer
Engine) built with ``use_cpu_initialization=True`` on a tensor-parallel group of 2 (gloo), then
``dist_checkpointing.save({"model": model.sharded_state_dict(), "iteration": 10, "checkpoint_version": 3.0,
"args": Namespace(...)}, "checkpoints/iter_0000010")`` — the shape of the dict Megatron-LM's ``save_checkpoint``
hands to it (Megatron-LM's ``training`` package is not part of megatron-core: this module builds the dict, with
only these common entries and no rng state, and writes the one-line ``latest_checkpointed_iteration.txt`` tracker
that Megatron-LM writes beside it). No training step: the weights are the initialisation's.

What was bypassed on CPU, and nothing else:
- ``torch.cuda.synchronize`` and ``torch.cuda.current_device`` are stubbed (``lambda *a, **k: None``,
  ``lambda: "cpu"``): megatron's checkpoint writer calls them around its (here synchronous) write.
- the CUDA RNG tracker seeding (``model_parallel_cuda_manual_seed``) is not called: CPU initialisation draws from
  torch's CPU generator, seeded per rank below.
- no optimizer: megatron's optimizers (DistributedOptimizer, FP32Optimizer) need CUDA, so this is model only.
- after the save, the multiprocessing Manager megatron's writer starts (and never stops) is terminated, so that the
  launch ends (see ``_end_children``); the files are complete before that.

The oracle: ``oracle/model.pt`` beside the run's ``checkpoints/`` folder (not inside it), a ``torch.save`` of the full tensors that
megatron-core's own ``dist_checkpointing.load(model.sharded_state_dict(), ckpt)`` returns on ONE rank (a fresh
1-rank process, tensor-parallel 1): the model's per-layer names (``decoder.layers.0.self_attention…``) with the
layer stacks and tensor-parallel shards put back together by megatron itself; ``oracle/keys.json`` says which
checkpoint key (and which layer of a stacked one) each name was loaded from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ckpt_tui.samples._common import finish, init_dist, run_variants

# the same TP=2 save by 0.16 and 0.19 (-019: made in megatron-core 0.19's venv); pipeline-parallel 2 on 2 ranks and
# TP=2 x PP=2 on 4, by 0.19 and by 0.16 (-016: in 0.16's venv). The group picks the venv, so the version.
VARIANTS = [
    "megatron-dist",
    "megatron-dist-019",
    "megatron-pp2",
    "megatron-tp2pp2",
    "megatron-pp2-016",
    "megatron-tp2pp2-016",
]
ITERATION = 10
TP = 2


def _cpu_stubs() -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def _end_children() -> None:
    """End the multiprocessing Manager that megatron's writer starts for its results queue (a module global
    it never shuts down): ``finish()`` leaves with ``os._exit``, and an orphaned Manager would keep the
    launch's output pipe open, so the launcher would wait for it forever."""
    import multiprocessing

    for p in multiprocessing.active_children():
        p.terminate()
        p.join(10)


def _model(tp: int, pp: int = 1):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    if parallel_state.model_parallel_is_initialized():  # the variant before this one's groups
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(1234 + dist.get_rank())
    cfg = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        use_cpu_initialization=True,
        params_dtype=torch.bfloat16,
        bf16=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.bfloat16,
    )
    return GPTModel(
        cfg,
        get_gpt_layer_local_spec(),
        vocab_size=256,
        max_sequence_length=64,
        pre_process=parallel_state.is_pipeline_first_stage(),  # stage 0 holds the embedding
        post_process=parallel_state.is_pipeline_last_stage(),  # the last the output layer
    )


def _args(tp: int, pp: int = 1) -> argparse.Namespace:
    from megatron.core.transformer.enums import AttnBackend

    return argparse.Namespace(
        params_dtype=torch.bfloat16,  # as Megatron-LM's parser leaves them: a torch dtype and an enum
        attention_backend=AttnBackend.auto,
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        padded_vocab_size=256,
        max_position_embeddings=64,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        bf16=True,
        fp16=False,
        ckpt_format="torch_dist",
        iteration=ITERATION,
    )


def v_megatron_dist(out: Path, tp: int = TP, pp: int = 1) -> None:
    from megatron.core import dist_checkpointing

    model = _model(tp, pp)
    it_dir = out / "checkpoints" / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        it_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = {
        "model": model.sharded_state_dict(),
        "iteration": ITERATION,
        "checkpoint_version": 3.0,
        "args": _args(tp, pp),
    }
    dist_checkpointing.save(state, str(it_dir))
    dist.barrier()
    if dist.get_rank() == 0:
        (it_dir.parent / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
        # the oracle: megatron-core's own loader on one rank, in a fresh process of its own
        # (without torchrun's variables: TORCHELASTIC_USE_AGENT_STORE would make it join this launch's store)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_", "LOCAL_", "MASTER_"))
            and k not in ("RANK", "WORLD_SIZE")
        }
        subprocess.run(
            [sys.executable, "-m", "ckpt_tui.samples.megatron_dist", "--oracle", str(it_dir), str(out / "oracle")],
            env=env,
            check=True,
        )


def oracle(ckpt: Path, dest: Path) -> None:
    """One rank, tensor-parallel 1: megatron's dist_checkpointing.load gives the full tensors."""
    from megatron.core import dist_checkpointing

    init_dist()
    _cpu_stubs()
    model = _model(1)
    sharded = model.sharded_state_dict()
    loaded = dist_checkpointing.load({"model": sharded}, str(ckpt))
    full = {k: v.clone() for k, v in loaded["model"].items() if isinstance(v, torch.Tensor)}
    # which checkpoint key (and layer of a stacked one) each of the model's names was loaded from
    keys = {
        k: [sh.key, int(sh.global_offset[0]) if sh.prepend_axis_num else None] for k, sh in sharded.items() if k in full
    }
    dest.mkdir(parents=True, exist_ok=True)
    torch.save(full, dest / "model.pt")
    (dest / "keys.json").write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    _end_children()
    finish()


FUNCS = {
    "megatron-dist": v_megatron_dist,
    "megatron-dist-019": v_megatron_dist,
    "megatron-pp2": lambda out: v_megatron_dist(out, tp=1, pp=2),
    "megatron-tp2pp2": lambda out: v_megatron_dist(out, tp=2, pp=2),
    "megatron-pp2-016": lambda out: v_megatron_dist(out, tp=1, pp=2),
    "megatron-tp2pp2-016": lambda out: v_megatron_dist(out, tp=2, pp=2),
}


def _setup() -> None:
    init_dist()
    _cpu_stubs()


def main() -> None:
    if sys.argv[1:2] == ["--oracle"]:
        oracle(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out), setup=_setup, teardown=_end_children)


if __name__ == "__main__":
    main()
