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
layer in the checkpoint); two with linear biases at TP=2: ``megatron-hf-qkvbias`` (``add_qkv_bias``: linear_qkv's
only, as Qwen2) and ``megatron-hf-bias`` (``add_bias_linear``: linear_qkv, linear_proj, linear_fc1, linear_fc2),
each bias given random values (megatron starts them at zero, where a misplaced bias changes nothing).

The oracle: megatron-core's ``dist_checkpointing.load`` into a fresh model drawn from another seed (every parameter
must change in the load: one that did nothing is caught), then its forward on a fixed batch of 2 x 40 tokens, in
fp32: ``oracle/logits.pt`` ({"ids": [2, 40] int64, "logits": [2, 40, 256] float32}).

- TP=1 and TP=2 saves: a TP=1 model on the 2 ranks that saved (data-parallel replicas; megatron's resharding load
  joins a TP=2 save) and rank 0's ``model(ids, position_ids, attention_mask)``.
- PP=2 saves, stage by stage on the 2 ranks that saved (megatron's pipeline schedule allocates on CUDA): a fresh
  PP=2 model (``pre_process``/``post_process`` per stage) loaded at PP=2; stage 0's forward gives the hidden states,
  sent to stage 1 by gloo ``dist.send``/``recv``, where ``model.set_input_tensor`` takes them before its forward
  gives the logits.

CPU stubs as in megatron_dist.py; the causal mask is given (megatron's default one is made on CUDA) and attention's
fork of the CUDA RNG tracker (around its dropout, a no-op in eval) is a no-op (``_no_rng_fork``).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from ckpt_tui.samples._common import init_dist, run_variants

VARIANTS = [
    "megatron-hf-tp1",
    "megatron-hf-tp2",
    "megatron-hf-tied",
    "megatron-hf-pp2",
    "megatron-hf-qkvbias",
    "megatron-hf-bias",
    "megatron-hf-tp2-016",
    "megatron-hf-tp1-016",
    "megatron-hf-pp2-016",
]
ITERATION = 10
LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB, SEQ = 2, 64, 4, 2, 96, 256, 40
EPS, THETA = 1e-5, 10000
BATCH = (2, SEQ)
SEED, ORACLE_SEED = 1234, 4321  # the saved model's draws; the oracle's fresh model's (a load that did nothing shows)
BIASES = ("none", "qkv", "all")  # none; add_qkv_bias (Qwen2: linear_qkv only); add_bias_linear (all four)


def _cpu_stubs() -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def _end_children() -> None:
    import multiprocessing

    for p in multiprocessing.active_children():
        p.terminate()
        p.join(10)


def _model(tp: int, tied: bool, pp: int = 1, bias: str = "none", seed: int = SEED):
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    assert bias in BIASES, bias
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(seed)  # the same master weights on every rank: each takes its own slice of them
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
        add_bias_linear=bias == "all",
        add_qkv_bias=bias == "qkv",
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
    g = torch.Generator().manual_seed(seed + 99)  # the same on every rank: norm weights are replicated
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
        # megatron starts biases at zero, where a misplaced one changes nothing: random values, each its own; a
        # split one's (its tensor-parallel slice) drawn per rank, a replicated one's (linear_proj's, linear_fc2's)
        # the same on each
        replicated = torch.Generator().manual_seed(seed + 7)
        split = torch.Generator().manual_seed(seed + 8 + 1000 * tp_rank)
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                gb = split if getattr(p, "tensor_model_parallel", False) else replicated
                p.copy_(0.5 * torch.randn(p.shape, generator=gb))
    return model


def _args(tp: int, tied: bool, pp: int = 1, bias: str = "none") -> argparse.Namespace:
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
        add_bias_linear=bias == "all",
        add_qkv_bias=bias == "qkv",
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


def v_save(out: Path, tp: int, tied: bool, pp: int = 1, bias: str = "none") -> None:
    from megatron.core import dist_checkpointing

    model = _model(tp, tied, pp, bias)
    it_dir = out / "checkpoints" / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        it_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = {
        "model": model.sharded_state_dict(),
        "iteration": ITERATION,
        "checkpoint_version": 3.0,
        "args": _args(tp, tied, pp, bias),
    }
    dist_checkpointing.save(state, str(it_dir))
    dist.barrier()
    if dist.get_rank() == 0:
        (it_dir.parent / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    if pp > 1:
        oracle_stages(it_dir, out / "oracle", tied, bias)
    else:
        oracle(it_dir, out / "oracle", tied, bias)
    dist.barrier()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fixed batch: token ids [2, 40], their positions, the causal mask (True: masked)."""
    ids = torch.randint(0, VOCAB, BATCH, generator=torch.Generator().manual_seed(7))
    pos = torch.arange(SEQ).unsqueeze(0).expand(BATCH[0], SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]
    return ids, pos, mask


def _load(model, ckpt: Path) -> None:
    """megatron's own load into ``model`` (a fresh one, drawn from ORACLE_SEED): every parameter must change."""
    from megatron.core import dist_checkpointing

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt))
    model.load_state_dict(loaded["model"], strict=False)  # the _extra_state entries aside
    same = [n for n, p in model.named_parameters() if torch.equal(before[n], p.detach())]
    assert not same, f"the load left these as the fresh model drew them: {same}"
    model.eval()


def _save_logits(dest: Path, ids: torch.Tensor, logits: torch.Tensor) -> None:
    assert tuple(logits.shape) == (*BATCH, VOCAB), logits.shape
    dest.mkdir(parents=True, exist_ok=True)
    torch.save({"ids": ids, "logits": logits.float().contiguous()}, dest / "logits.pt")


def oracle(ckpt: Path, dest: Path, tied: bool, bias: str) -> None:
    """megatron's own load into a TP=1 model (PP=1: the 2 ranks its data-parallel replicas, each loading the whole
    model) and rank 0's forward on a fixed batch: fp32 logits."""
    model = _model(1, tied, bias=bias, seed=ORACLE_SEED)
    _load(model, ckpt)
    if dist.get_rank() == 0:
        ids, pos, mask = _batch()
        with _no_rng_fork(), torch.no_grad():
            _save_logits(dest, ids, model(ids, pos, mask))


def oracle_stages(ckpt: Path, dest: Path, tied: bool, bias: str) -> None:
    """A PP=2 save's oracle on its own 2 ranks, stage by stage (megatron's pipeline schedule allocates on CUDA): a
    fresh PP=2 model (stage 0 the embedding and layer 0, stage 1 layer 1, the final norm and the output layer),
    loaded by ``dist_checkpointing.load`` at PP=2; stage 0's forward gives the hidden states, sent to stage 1
    (gloo), whose ``set_input_tensor`` takes them before its forward gives the logits."""
    from megatron.core import parallel_state

    model = _model(1, tied, pp=2, bias=bias, seed=ORACLE_SEED)
    _load(model, ckpt)
    ids, pos, mask = _batch()
    with _no_rng_fork(), torch.no_grad():
        if parallel_state.is_pipeline_first_stage():
            hidden = model(ids, pos, mask)  # [seq, batch, hidden]: no output layer on this stage
            assert tuple(hidden.shape) == (SEQ, BATCH[0], HIDDEN), hidden.shape
            dist.send(hidden.contiguous(), parallel_state.get_pipeline_model_parallel_next_rank())
        else:
            hidden = torch.empty(SEQ, BATCH[0], HIDDEN)
            dist.recv(hidden, parallel_state.get_pipeline_model_parallel_prev_rank())
            model.set_input_tensor(hidden)
            _save_logits(dest, ids, model(ids, pos, mask))


@contextlib.contextmanager
def _no_rng_fork() -> Iterator[None]:
    """Attention forks megatron's CUDA RNG tracker around its dropout (a no-op in eval): a tracker with no states,
    whose fork changes nothing, stands in for it on CPU."""
    from megatron.core import tensor_parallel

    class _Tracker:
        def fork(self, *a, **k):
            return contextlib.nullcontext()

    real = tensor_parallel.get_cuda_rng_tracker
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: _Tracker()
    try:
        yield
    finally:
        tensor_parallel.get_cuda_rng_tracker = real


FUNCS = {
    "megatron-hf-tp1": lambda out: v_save(out, 1, False),
    "megatron-hf-tp2": lambda out: v_save(out, 2, False),
    "megatron-hf-tied": lambda out: v_save(out, 2, True),
    "megatron-hf-pp2": lambda out: v_save(out, 1, False, pp=2),  # each stage saves its layer at its global index
    "megatron-hf-qkvbias": lambda out: v_save(out, 2, False, bias="qkv"),
    "megatron-hf-bias": lambda out: v_save(out, 2, False, bias="all"),
    "megatron-hf-tp2-016": lambda out: v_save(out, 2, False),
    "megatron-hf-tp1-016": lambda out: v_save(out, 1, False),
    "megatron-hf-pp2-016": lambda out: v_save(out, 1, False, pp=2),
}


def _setup() -> None:
    init_dist()
    _cpu_stubs()


def main() -> None:
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out), setup=_setup, teardown=_end_children)


if __name__ == "__main__":
    main()
