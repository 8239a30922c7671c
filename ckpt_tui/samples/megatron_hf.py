"""Megatron-Core ``torch_dist`` saves of a tiny Llama-family ``GPTModel``, with megatron's own logits as the oracle
of ``export --to hf``.

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.megatron_hf OUTDIR [variants]

Runs in the cached venv ``megatron-019`` (megatron-core 0.19.2) or ``megatron-torchtitan`` (0.16.x): the group picks
it. The model is what a Llama run configures in Megatron-LM (``--normalization RMSNorm --swiglu
--position-embedding-type rope --group-query-attention --disable-bias-linear --untie-embeddings-and-output-weights``):
2 layers, hidden 64, 4 heads in 2 query groups (GQA), ffn 96 with a gated linear unit and SiLU, rotary embeddings
(halves, ``rotary_interleaved=False``, base 10000), RMSNorm eps 1e-5, vocab 256, fp32 params, the local layer spec
(no Transformer Engine), ``use_cpu_initialization=True``, weights drawn with std 0.1 (0.02 leaves attention almost
uniform) and every RMSNorm weight set to its own random values (all at 1.0, swapping two norms would change nothing).
Saved as megatron_dist.py saves (the dict Megatron-LM's ``save_checkpoint`` hands to ``dist_checkpointing.save``,
with Megatron-LM's ``args``), on 2 ranks at tensor-parallel 1 (2 data-parallel replicas) and 2, and at
pipeline-parallel 2 (a layer per stage); one tied variant (``share_embeddings_and_output_weights=True``, no output
layer in the checkpoint).

The oracle, in a fresh 1-rank process (tensor- and pipeline-parallel 1: the pipeline schedule allocates on CUDA, so a
PP=2 save is loaded whole into one stage, by megatron's own resharding load): megatron-core's ``dist_checkpointing.load`` into a fresh
model, then ``model(ids, position_ids, attention_mask)`` on a fixed batch of 2 x 40 tokens, in fp32:
``oracle/logits.pt`` ({"ids": [2, 40] int64, "logits": [2, 40, 256] float32}). CPU stubs as in megatron_dist.py;
the causal mask is given (megatron's default one is made on CUDA) and attention's fork of the CUDA RNG tracker
(around its dropout, a no-op in eval) is a no-op (``_no_rng_fork``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ckpt_tui.samples._common import finish, init_dist, run_variants

VARIANTS = ["megatron-hf-tp1", "megatron-hf-tp2", "megatron-hf-tied", "megatron-hf-pp2", "megatron-hf-tp2-016"]
ITERATION = 10
LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB, SEQ = 2, 64, 4, 2, 96, 256, 40
EPS, THETA = 1e-5, 10000
BATCH = (2, SEQ)


def _cpu_stubs() -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def _end_children() -> None:
    import multiprocessing

    for p in multiprocessing.active_children():
        p.terminate()
        p.join(10)


def _model(tp: int, tied: bool, pp: int = 1):
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(1234)  # the same master weights on every rank: each takes its own slice of them
    cfg = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        ffn_hidden_size=FFN,
        normalization="RMSNorm",
        layernorm_epsilon=EPS,
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=False,
        add_bias_linear=False,
        apply_rope_fusion=False,
        init_method_std=0.1,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        attention_softmax_in_fp32=True,
    )
    model = GPTModel(
        cfg,
        get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=VOCAB,
        max_sequence_length=64,
        position_embedding_type="rope",
        rotary_base=THETA,
        share_embeddings_and_output_weights=tied,
        pre_process=parallel_state.is_pipeline_first_stage(),  # stage 0 holds the embedding
        post_process=parallel_state.is_pipeline_last_stage(),  # the last the output layer
    )
    g = torch.Generator().manual_seed(99)  # the same on every rank: norm weights are replicated
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
    return model


def _args(tp: int, tied: bool, pp: int = 1) -> argparse.Namespace:
    """Megatron-LM's args of such a run, as its parser and validate_args leave them (the ones a conversion reads)."""
    from megatron.core.transformer.enums import AttnBackend

    return argparse.Namespace(
        params_dtype=torch.float32,
        attention_backend=AttnBackend.auto,
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        ffn_hidden_size=FFN,
        num_attention_heads=HEADS,
        group_query_attention=True,
        num_query_groups=GROUPS,
        kv_channels=HIDDEN // HEADS,
        padded_vocab_size=VOCAB,
        make_vocab_size_divisible_by=128,
        max_position_embeddings=64,
        seq_length=SEQ,
        position_embedding_type="rope",
        rotary_base=THETA,
        rotary_percent=1.0,
        rotary_interleaved=False,
        use_rope_scaling=False,
        rope_scaling_factor=8.0,
        normalization="RMSNorm",
        norm_epsilon=EPS,
        swiglu=True,
        squared_relu=False,
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=False,
        num_experts=None,
        multi_latent_attention=False,
        untie_embeddings_and_output_weights=not tied,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        bf16=False,
        fp16=False,
        ckpt_format="torch_dist",
        iteration=ITERATION,
    )


def v_save(out: Path, tp: int, tied: bool, pp: int = 1) -> None:
    from megatron.core import dist_checkpointing

    model = _model(tp, tied, pp)
    it_dir = out / "checkpoints" / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        it_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = {
        "model": model.sharded_state_dict(),
        "iteration": ITERATION,
        "checkpoint_version": 3.0,
        "args": _args(tp, tied, pp),
    }
    dist_checkpointing.save(state, str(it_dir))
    dist.barrier()
    if dist.get_rank() == 0:
        (it_dir.parent / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TORCHELASTIC_", "GROUP_", "ROLE_", "LOCAL_", "MASTER_"))
            and k not in ("RANK", "WORLD_SIZE")
        }
        cmd = [sys.executable, "-m", "ckpt_tui.samples.megatron_hf", "--oracle", str(it_dir), str(out / "oracle")]
        subprocess.run(cmd + (["--tied"] if tied else []), env=env, check=True)


def oracle(ckpt: Path, dest: Path, tied: bool) -> None:
    """megatron's own load on one rank (TP=1) and its forward on a fixed batch: fp32 logits."""
    from megatron.core import dist_checkpointing

    init_dist()
    _cpu_stubs()
    model = _model(1, tied)
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt))
    model.load_state_dict(loaded["model"], strict=False)  # the _extra_state entries aside
    model.eval()
    _no_rng_fork()
    ids = torch.randint(0, VOCAB, BATCH, generator=torch.Generator().manual_seed(7))
    pos = torch.arange(SEQ).unsqueeze(0).expand(BATCH[0], SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        logits = model(ids, pos, mask)
    assert tuple(logits.shape) == (*BATCH, VOCAB), logits.shape
    dest.mkdir(parents=True, exist_ok=True)
    torch.save({"ids": ids, "logits": logits.float().contiguous()}, dest / "logits.pt")
    _end_children()
    finish()


def _no_rng_fork() -> None:
    """Attention forks megatron's CUDA RNG tracker around its dropout (a no-op in eval): a tracker with no states,
    whose fork changes nothing, stands in for it on CPU."""
    import contextlib

    from megatron.core import tensor_parallel

    class _Tracker:
        def fork(self, *a, **k):
            return contextlib.nullcontext()

    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: _Tracker()


FUNCS = {
    "megatron-hf-tp1": lambda out: v_save(out, 1, False),
    "megatron-hf-tp2": lambda out: v_save(out, 2, False),
    "megatron-hf-tied": lambda out: v_save(out, 2, True),
    "megatron-hf-pp2": lambda out: v_save(out, 1, False, pp=2),  # each stage saves its layer at its global index
    "megatron-hf-tp2-016": lambda out: v_save(out, 2, False),
}


def _setup() -> None:
    init_dist()
    _cpu_stubs()


def main() -> None:
    if sys.argv[1:2] == ["--oracle"]:
        oracle(Path(sys.argv[2]), Path(sys.argv[3]), "--tied" in sys.argv[4:])
        return
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out), setup=_setup, teardown=_end_children)


if __name__ == "__main__":
    main()
