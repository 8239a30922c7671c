"""``export --to hf``: a Megatron-Core ``torch_dist`` GPT checkpoint of a Llama-family model as a Hugging Face
``LlamaForCausalLM`` folder (``Qwen2ForCausalLM`` where only ``linear_qkv`` has biases): names mapped, fused tensors
split, ``config.json`` from the run's own record.

Names (per layer ``i``; the checkpoint's keys, which megatron's local and Transformer Engine specs share)::

    embedding.word_embeddings.weight                      model.embed_tokens.weight
    decoder.layers.i.self_attention.linear_qkv.layer_norm_weight   model.layers.i.input_layernorm.weight
    decoder.layers.i.self_attention.linear_qkv.weight     q_proj / k_proj / v_proj (split by query group)
    decoder.layers.i.self_attention.linear_proj.weight    model.layers.i.self_attn.o_proj.weight
    decoder.layers.i.mlp.linear_fc1.layer_norm_weight     model.layers.i.post_attention_layernorm.weight
    decoder.layers.i.mlp.linear_fc1.weight                gate_proj (first half) / up_proj (second half)
    decoder.layers.i.mlp.linear_fc2.weight                model.layers.i.mlp.down_proj.weight
    decoder.final_layernorm.weight                        model.norm.weight
    output_layer.weight                                   lm_head.weight (absent: tied, written once)

Linear biases, where the run had them, as their weights (``linear_qkv.bias`` split by query group as its rows,
``linear_fc1.bias`` into gate/up halves): megatron's ``add_qkv_bias`` alone (biases on ``linear_qkv`` only) is
Qwen2's attention (q/k/v with biases, o and the MLP without): a ``Qwen2ForCausalLM`` folder; ``add_bias_linear``
(biases on ``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``) is Llama's ``attention_bias`` and
``mlp_bias``: ``o_proj.bias``, ``gate_proj``/``up_proj.bias``, ``down_proj.bias``. Any other set, and norms with a
bias (LayerNorm), are refused.

``linear_qkv``: megatron computes ``qkv.view(s, b, groups, (heads/groups + 2) * head_dim)`` and splits the last
dimension into the group's ``heads/groups`` query heads, then one key and one value head: the rows of group ``g``
are ``[q heads of g | k of g | v of g]``, each head ``head_dim`` rows. ``linear_fc1`` of a gated linear unit is
``[gate | up]`` in the checkpoint's global layout (megatron saves each tensor-parallel rank's local halves at their
global offsets). Every split is a selection of whole rows of the fused tensor: where the fused tensor is byte
ranges, so is each part (moved by offset, bit-exact, verified as any export); else it is loaded once (one layer's
fused tensor at a time) and its rows taken.

The config: Megatron-LM's ``args`` in the checkpoint's common state; without them an HF ``config.json``
(``--config PATH``), trusted for what shapes cannot show (activation, eps, rope); without either, refused, naming
the missing values. Every value shapes can check is checked before anything is written. Rope: ``rope_parameters``
(transformers 5) and, for transformers 4 (which ignores ``rope_parameters`` and would use theta 10000), the
legacy ``rope_theta`` (and ``rope_scaling`` when scaled) with the same values.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .errors import ExportError
from .hf_agree import check_config_agrees, megatron_values, read_config, refuse_model_type, torchtitan_values
from .sources import ByteRange, Source, SourceTensor, to_torch

LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# the per-layer keys of a Llama-family layer -> their role
LAYER_KEYS = {
    "self_attention.linear_qkv.layer_norm_weight": "input_norm",
    "input_layernorm.weight": "input_norm",  # a save whose norms are modules of their own
    "self_attention.linear_qkv.weight": "qkv",
    "self_attention.linear_proj.weight": "o",
    "mlp.linear_fc1.layer_norm_weight": "post_norm",
    "pre_mlp_layernorm.weight": "post_norm",
    "mlp.linear_fc1.weight": "fc1",
    "mlp.linear_fc2.weight": "fc2",
    # linear biases (add_qkv_bias: linear_qkv's only, Qwen2; add_bias_linear: all four, Llama's attention_bias and
    # mlp_bias)
    "self_attention.linear_qkv.bias": "qkv_bias",
    "self_attention.linear_proj.bias": "o_bias",
    "mlp.linear_fc1.bias": "fc1_bias",
    "mlp.linear_fc2.bias": "fc2_bias",
}
TOP_KEYS = {
    "embedding.word_embeddings.weight": "embed",
    "decoder.final_layernorm.weight": "norm",
    "output_layer.weight": "lm_head",
}
ROLES = ("input_norm", "qkv", "o", "post_norm", "fc1", "fc2")  # every layer has these
BIAS_ROLES = ("qkv_bias", "o_bias", "fc1_bias", "fc2_bias")
# what a name says about an architecture this mapping does not cover (a name's first match is said)
_SEEN = (
    ("experts", "mixture of experts (MoE)"),
    ("router", "mixture of experts (MoE)"),
    ("linear_q_down_proj", "multi-latent attention (MLA)"),
    ("linear_kv_down_proj", "multi-latent attention (MLA)"),
    ("q_layernorm", "query/key layer norms (qk_layernorm)"),
    ("k_layernorm", "query/key layer norms (qk_layernorm)"),
    ("layer_norm_bias", "LayerNorm (a norm with a bias), not RMSNorm"),
    ("norm.bias", "LayerNorm (a norm with a bias), not RMSNorm"),
    ("position_embeddings", "learned absolute position embeddings, not rotary"),
    ("bias", "biases the mapping does not know"),
)


class NeedsConfig(ExportError):
    """--to hf refused only for want of the model's configuration (the checkpoint records none, or not all of it):
    ``--config PATH`` would let it go on."""


def is_megatron_gpt(names: list[str]) -> bool:
    return "embedding.word_embeddings.weight" in names or any(n.startswith("decoder.layers.") for n in names)


@dataclass
class _Arch:
    heads: int
    groups: int
    head_dim: int
    hidden_act: str
    eps: float
    rope: dict[str, Any]
    max_pos: int
    from_: str  # where these came from (said)
    hidden: Optional[int] = None
    ffn: Optional[int] = None
    layers: Optional[int] = None
    vocab: Optional[int] = None
    tied: Optional[bool] = None
    # the linear biases it says the model has ("qkv", "o", "mlp"); None: it does not say (the tensors decide)
    biases: Optional[frozenset[str]] = None


QWEN2_BIASES = frozenset({"qkv"})  # Qwen2: q/k/v biases only (megatron's add_qkv_bias)
ALL_BIASES = frozenset({"qkv", "o", "mlp"})  # megatron's add_bias_linear: Llama's attention_bias and mlp_bias


def _refuse_seen(names: list[str]) -> None:
    odd = [n for n in names if not _known(n)]
    if not odd:
        return
    what = sorted({next(w for key, w in _SEEN if key in n) for n in odd if any(key in n for key, _ in _SEEN)})
    raise ExportError(
        "--to hf writes Llama-family models (RMSNorm, gated MLP, rotary attention; linear biases as Qwen2's or "
        "Llama's attention_bias/mlp_bias); this checkpoint holds "
        + (", ".join(what) + ": " if what else "tensors the Llama mapping does not know: ")
        + ", ".join(odd[:6])
        + (f" and {len(odd) - 6} more" if len(odd) > 6 else "")
        + ". The plain export (without --to hf) writes it under its own names"
    )


def _known(name: str) -> bool:
    if name in TOP_KEYS:
        return True
    m = LAYER_RE.match(name)
    return m is not None and m.group(2) in LAYER_KEYS


def _is_args(args: dict[str, Any]) -> bool:
    return any(k in args for k in ("num_attention_heads", "hidden_size", "num_layers"))


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


_ARGS_NEEDED = (
    "num_attention_heads",
    "norm_epsilon",
    "rotary_base",
    "swiglu",
    "normalization",
    "position_embedding_type",
    "max_position_embeddings",
)


def _args_lack(args: dict[str, Any]) -> list[str]:
    return [k for k in _ARGS_NEEDED if args.get(k) is None]


def _arch_from_args(args: dict[str, Any]) -> _Arch:
    """The architecture Megatron-LM's args record; refused (naming them) where values are missing or say the model is
    not Llama-family."""
    missing = _args_lack(args)
    if missing:
        raise NeedsConfig(
            "the checkpoint's Megatron-LM args lack " + ", ".join(missing) + ": give the model's Hugging Face "
            "config.json with --config PATH (it is then trusted for what the shapes cannot show)"
        )
    bad = []
    if args.get("normalization") != "RMSNorm":
        bad.append(f"normalization={args.get('normalization')!r} (Llama: RMSNorm)")
    if args.get("position_embedding_type") != "rope":
        bad.append(f"position_embedding_type={args.get('position_embedding_type')!r} (Llama: rope)")
    if args.get("rotary_interleaved"):
        bad.append("rotary_interleaved=True (Llama rotates halves; interleaved pairs are not mapped yet)")
    pct = args.get("rotary_percent", 1.0)
    if isinstance(pct, (int, float)) and pct < 1:
        bad.append(f"rotary_percent={pct} (Llama rotates the whole head)")
    if args.get("attention_output_gate") or args.get("output_gate"):
        bad.append("gated attention (output_gate)")
    if args.get("num_experts"):
        bad.append(f"num_experts={args.get('num_experts')} (mixture of experts)")
    if args.get("multi_latent_attention"):
        bad.append("multi_latent_attention=True")
    if args.get("qk_layernorm"):
        bad.append("qk_layernorm=True")
    if args.get("apply_layernorm_1p"):
        bad.append("apply_layernorm_1p=True (zero-centred norm weights)")
    if args.get("squared_relu"):
        bad.append("squared_relu=True")
    if args.get("window_size") is not None:
        bad.append(f"window_size={args.get('window_size')} (sliding-window attention)")
    if args.get("rotary_seq_len_interpolation_factor") not in (None, 1, 1.0):
        bad.append(f"rotary_seq_len_interpolation_factor={args.get('rotary_seq_len_interpolation_factor')}")
    if bad:
        raise ExportError("--to hf writes Llama-family models; the run's args say " + "; ".join(bad))
    heads = int(args["num_attention_heads"])
    groups = _int(args.get("num_query_groups")) if args.get("group_query_attention") else heads
    if groups is None:
        raise ExportError("the checkpoint's Megatron-LM args say group_query_attention but give no num_query_groups")
    hidden = _int(args.get("hidden_size"))
    head_dim = _int(args.get("kv_channels")) or (hidden // heads if hidden else None)
    if head_dim is None:
        raise ExportError("the checkpoint's Megatron-LM args give neither kv_channels nor hidden_size")
    theta = float(args["rotary_base"])
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if args.get("use_rope_scaling"):  # megatron-core's apply_rope_scaling: Llama 3.1's, with its defaults
        rope = {
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": float(args.get("rope_scaling_factor") or 8.0),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    untie = args.get("untie_embeddings_and_output_weights")
    biases: Optional[frozenset[str]] = None  # megatron: linear_qkv has a bias with either flag, the others with one
    if args.get("add_bias_linear") is not None or args.get("add_qkv_bias") is not None:
        biases = (
            ALL_BIASES if args.get("add_bias_linear") else QWEN2_BIASES if args.get("add_qkv_bias") else frozenset()
        )
    return _Arch(
        heads=heads,
        groups=groups,
        head_dim=head_dim,
        hidden_act="silu" if args["swiglu"] else "gelu",  # megatron-core's gated default is GeLU (GeGLU)
        eps=float(args["norm_epsilon"]),
        rope=rope,
        max_pos=int(args["max_position_embeddings"]),
        from_="the run's Megatron-LM args (common state)",
        hidden=hidden,
        ffn=_int(args.get("ffn_hidden_size")),
        layers=_int(args.get("num_layers")),
        vocab=_int(args.get("padded_vocab_size")),
        tied=None if untie is None else not untie,
        biases=biases,
    )


def _arch_from_config(path: Path, *, qwen2: bool = False) -> _Arch:
    """The architecture an HF config.json gives (``--config``), trusted for what shapes cannot show. ``qwen2``: a
    Qwen2 config (q/k/v biases) is taken too (a Megatron-Core source's biases can be Qwen2's)."""
    cfg = read_config(path)
    refuse_model_type(path, cfg, qwen2)
    mt = cfg.get("model_type")
    if mt == "qwen2" and cfg.get("use_sliding_window"):
        raise ExportError(f"--config {path}: use_sliding_window (sliding-window attention) is not mapped")
    biases: Optional[frozenset[str]] = QWEN2_BIASES if mt == "qwen2" else None
    attn_b, mlp_b = cfg.get("attention_bias"), cfg.get("mlp_bias")
    if mt != "qwen2" and (isinstance(attn_b, bool) or isinstance(mlp_b, bool)):
        biases = frozenset(({"qkv", "o"} if attn_b is True else set()) | ({"mlp"} if mlp_b is True else set()))
    missing = [k for k in ("num_attention_heads", "hidden_act", "rms_norm_eps") if cfg.get(k) is None]
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        theta = cfg.get("rope_theta")
        if theta is None:
            missing.append("rope_theta (or rope_parameters)")
        rope = dict(cfg.get("rope_scaling") or {})
        rope.setdefault("rope_type", rope.pop("type", "default"))
        rope["rope_theta"] = float(theta) if theta is not None else 0.0
    if missing:
        raise ExportError(f"--config {path} lacks " + ", ".join(missing))
    heads = int(cfg["num_attention_heads"])
    hidden = _int(cfg.get("hidden_size"))
    return _Arch(
        heads=heads,
        groups=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or (hidden // heads if hidden else 0)),
        hidden_act=str(cfg["hidden_act"]),
        eps=float(cfg["rms_norm_eps"]),
        rope=rope,
        max_pos=int(cfg.get("max_position_embeddings") or 2048),
        from_=f"--config {path} (trusted for hidden_act, rms_norm_eps and rope, which shapes cannot show)",
        hidden=hidden,
        ffn=_int(cfg.get("intermediate_size")),
        layers=_int(cfg.get("num_hidden_layers")),
        vocab=_int(cfg.get("vocab_size")),
        tied=cfg.get("tie_word_embeddings") if isinstance(cfg.get("tie_word_embeddings"), bool) else None,
        biases=biases,
    )


class _OneFused:
    """The one fused tensor (a layer's QKV or fc1) loaded for the row selections of a general-path source: each is
    loaded once, the previous one let go."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: Optional[str] = None
        self.tensor: Any = None

    def get(self, t: SourceTensor) -> Any:
        with self.lock:
            if self.key != t.name:
                self.key, self.tensor = None, None
                self.tensor, self.key = to_torch(t), t.name
            return self.tensor


def _row_ranges(ranges: tuple[ByteRange, ...], row_bytes: int, pieces: list[tuple[int, int]]) -> tuple[ByteRange, ...]:
    """The byte ranges of rows ``[start, start + n)`` for each piece, of a tensor whose bytes are ``ranges``."""
    out: list[ByteRange] = []
    for start, n in pieces:
        lo, hi = start * row_bytes, (start + n) * row_bytes
        pos = 0
        for r in ranges:
            a, b = max(lo, pos), min(hi, pos + r.length)
            if a < b:
                seg = ByteRange(r.path, r.offset + a - pos, b - a)
                prev = out[-1] if out else None
                if prev is not None and prev.path == seg.path and prev.offset + prev.length == seg.offset:
                    out[-1] = ByteRange(prev.path, prev.offset, prev.length + seg.length)
                else:
                    out.append(seg)
            pos += r.length
            if pos >= hi:
                break
    return tuple(out)


def _rows(t: SourceTensor, name: str, pieces: list[tuple[int, int]], fused: _OneFused) -> SourceTensor:
    """The rows ``pieces`` ([(start, count)]) of ``t``, in order, as a source tensor named ``name``."""
    n = sum(c for _, c in pieces)
    shape = (n, *t.shape[1:])
    if t.ranges is not None:
        row_bytes = t.nbytes // t.shape[0] if t.shape[0] else 0
        return SourceTensor(name, shape, t.dtype, ranges=_row_ranges(t.ranges, row_bytes, pieces), note=t.note)

    def load() -> object:
        import torch

        full = fused.get(t)
        if len(pieces) > 8:  # a permutation: row by row
            idx = torch.tensor([s + j for s, c in pieces for j in range(c)], dtype=torch.long)
            return full.index_select(0, idx).contiguous()
        return torch.cat([full[s : s + c] for s, c in pieces]).contiguous()

    return SourceTensor(name, shape, t.dtype, load=load, note=t.note)


def _renamed(t: SourceTensor, name: str) -> SourceTensor:
    return SourceTensor(name, t.shape, t.dtype, ranges=t.ranges, load=t.load, note=t.note, chunks=t.chunks)


def qkv_pieces(heads: int, groups: int, head_dim: int) -> tuple[list[tuple[int, int]], ...]:
    """The rows of q, k and v in megatron's fused ``linear_qkv`` (per query group: its heads/groups query heads,
    then one key head, then one value head, ``head_dim`` rows each), as [(start, count)] row pieces."""
    per = heads // groups
    block = (per + 2) * head_dim
    q = [(g * block, per * head_dim) for g in range(groups)]
    k = [(g * block + per * head_dim, head_dim) for g in range(groups)]
    v = [(g * block + (per + 1) * head_dim, head_dim) for g in range(groups)]
    return q, k, v


def megatron_to_hf(
    source: Source,
    args: dict[str, Any],
    *,
    config_path: Optional[Path] = None,
    true_vocab_size: Optional[int] = None,
) -> tuple[Source, dict[str, Any], list[str]]:
    """``source`` (a Megatron-Core GPT model's tensors under the checkpoint's names) as an HF Llama model: the new
    source, its config.json and what was decided (said). ``args``: Megatron-LM's args of the common state ({} where
    none); ``config_path``: ``--config``."""
    names = [t.name for t in source.tensors if not t.name.endswith("_extra_state")]
    _refuse_seen(names)
    by = {t.name: t for t in source.tensors}
    notes: list[str] = []
    layers: dict[int, dict[str, SourceTensor]] = {}
    top: dict[str, SourceTensor] = {}
    for n in names:
        m = LAYER_RE.match(n)
        if m:
            role = LAYER_KEYS[m.group(2)]
            layers.setdefault(int(m.group(1)), {})[role] = by[n]
        else:
            top[TOP_KEYS[n]] = by[n]
    problems: list[str] = layer_problems(layers, ROLES)
    n_layers = len(layers)
    for r in ("embed", "norm"):
        if r not in top:
            problems.append(f"no {[k for k, v in TOP_KEYS.items() if v == r][0]}")
    biases, why = _tensor_biases(layers)
    if why:
        problems.append(why)
    if problems:
        raise ExportError("--to hf: the checkpoint is not a whole Llama-family GPT model: " + "; ".join(problems))
    # what shapes alone say (before the configuration): a GPT-style MLP is no gated linear unit
    fc1, fc2 = layers[0]["fc1"].shape, layers[0]["fc2"].shape
    if len(fc1) == 2 and len(fc2) == 2 and fc1[0] != 2 * fc2[1]:
        raise ExportError(
            f"--to hf writes Llama-family models (a gated MLP); layer 0's linear_fc1 is {list(fc1)} for linear_fc2 "
            f"{list(fc2)}: not a gated linear unit (a GPT-style MLP). The plain export (without --to hf) writes it "
            "under its own names"
        )
    if _is_args(args) and not (config_path is not None and _args_lack(args)):
        arch = _arch_from_args(args)
    elif config_path is not None:
        arch = _arch_from_config(config_path, qwen2=True)
    elif _is_args(args):
        arch = _arch_from_args(args)  # refused: naming what they lack
    else:
        raise NeedsConfig(
            "the checkpoint records no model configuration (no Megatron-LM args in its common state): --to hf "
            "needs num_attention_heads, num_query_groups, hidden_act, rms_norm_eps, rope_theta and "
            "max_position_embeddings, which shapes cannot show; give the model's Hugging Face config.json with "
            "--config PATH"
        )
    notes.append(f"--to hf: the configuration from {arch.from_}")
    if config_path is not None and _is_args(args):  # neither silently wins: every value both give must agree
        notes += check_config_agrees(megatron_values(args), config_path, "the run's Megatron-LM args", qwen2=True)
    emb = top["embed"]
    vocab, hidden = emb.shape[0], emb.shape[1]
    tied = "lm_head" not in top
    hd, heads, groups = arch.head_dim, arch.heads, arch.groups
    ffn = layers[0]["fc2"].shape[1]
    want: list[tuple[str, Any, Any]] = [
        ("hidden size", arch.hidden, hidden),
        ("layers", arch.layers, n_layers),
        ("intermediate (ffn) size", arch.ffn, ffn),
        ("tied output layer", arch.tied, tied),
    ]
    bad = [
        f"{what}: the configuration says {said}, the tensors {seen}"
        for what, said, seen in want
        if said not in (None, seen)
    ]
    if arch.biases is not None and arch.biases != biases:
        bad.append(f"linear biases: the configuration says {_said(arch.biases)}, the tensors {_said(biases)}")
    if groups <= 0 or heads % groups:
        bad.append(f"{heads} attention heads do not divide into {groups} query groups")
    if arch.vocab is not None and arch.vocab > vocab:
        bad.append(f"vocab: the configuration says {arch.vocab}, the embedding has {vocab} rows")
    for i, p in sorted(layers.items()):
        shapes: dict[str, Optional[tuple[tuple[int, ...], tuple[int, ...]]]] = {
            "linear_qkv": (p["qkv"].shape, ((heads + 2 * groups) * hd, hidden)),
            "linear_proj": (p["o"].shape, (hidden, heads * hd)),
            "linear_fc1": (p["fc1"].shape, (2 * ffn, hidden)),
            "linear_fc2": (p["fc2"].shape, (hidden, ffn)),
            "input norm": (p["input_norm"].shape, (hidden,)),
            "pre-MLP norm": (p["post_norm"].shape, (hidden,)),
            "linear_qkv.bias": (p["qkv_bias"].shape, ((heads + 2 * groups) * hd,)) if "qkv_bias" in p else None,
            "linear_proj.bias": (p["o_bias"].shape, (hidden,)) if "o_bias" in p else None,
            "linear_fc1.bias": (p["fc1_bias"].shape, (2 * ffn,)) if "fc1_bias" in p else None,
            "linear_fc2.bias": (p["fc2_bias"].shape, (hidden,)) if "fc2_bias" in p else None,
        }
        for what, pair in shapes.items():
            if pair is None:
                continue
            seen_s, said_s = pair
            if tuple(seen_s) != said_s:
                extra = ""
                if what == "linear_fc1" and tuple(seen_s) == (ffn, hidden):
                    extra = " (not a gated linear unit: a GPT-style MLP, not Llama-family)"
                elif what == "linear_qkv":
                    extra = f" ({heads} heads, {groups} query groups, head_dim {hd})"
                bad.append(f"layer {i} {what}: {list(seen_s)}, expected {list(said_s)}{extra}")
    if top["norm"].shape != (hidden,):
        bad.append(f"final_layernorm: {list(top['norm'].shape)}, expected [{hidden}]")
    if not tied and tuple(top["lm_head"].shape) != (vocab, hidden):
        bad.append(f"output_layer: {list(top['lm_head'].shape)}, expected {[vocab, hidden]}")
    if true_vocab_size is not None and not 0 < true_vocab_size <= vocab:
        bad.append(f"--true-vocab-size {true_vocab_size}: the embedding has {vocab} rows")
    if bad:
        raise ExportError("--to hf: the configuration and the tensors disagree:\n  " + "\n  ".join(bad[:12]))
    fused = _OneFused()
    out: list[SourceTensor] = []
    keep_rows = true_vocab_size if true_vocab_size is not None else vocab
    if true_vocab_size is not None and true_vocab_size < vocab:
        out.append(_rows(emb, "model.embed_tokens.weight", [(0, keep_rows)], fused))
        notes.append(f"--true-vocab-size {keep_rows}: the embedding and lm_head cut from {vocab} rows")
    else:
        out.append(_renamed(emb, "model.embed_tokens.weight"))
        notes.append(
            f"vocab_size {vocab}: the embedding's rows as saved (Megatron pads the vocabulary to a multiple of "
            "make_vocab_size_divisible_by x TP; --true-vocab-size N keeps the first N)"
        )
    # role by role, each over the layers: megatron stacks a role's layers into one tensor, which the general path
    # (a tensor-parallel split that is no byte range) loads whole and keeps for its layers in turn; layer by layer it
    # would be loaded once per layer (L times the reads)
    q, k, v = qkv_pieces(heads, groups, hd)
    # (a bias is split as its weight's rows: a 1-D tensor's rows are its elements)
    by_role: dict[str, list[SourceTensor]] = {r: [] for r in ROLES + BIAS_ROLES}
    for i, p in sorted(layers.items()):
        pre = f"model.layers.{i}."
        by_role["input_norm"].append(_renamed(p["input_norm"], pre + "input_layernorm.weight"))
        for suffix, qkv_role, o_role, fc1_role, fc2_role in (
            ("weight", "qkv", "o", "fc1", "fc2"),
            ("bias", *BIAS_ROLES),
        ):
            if qkv_role in p:
                for what, rows in (("q", q), ("k", k), ("v", v)):
                    name = f"{pre}self_attn.{what}_proj.{suffix}"
                    by_role[qkv_role].append(_rows(p[qkv_role], name, rows, fused))
            if o_role in p:
                by_role[o_role].append(_renamed(p[o_role], f"{pre}self_attn.o_proj.{suffix}"))
            if fc1_role in p:
                by_role[fc1_role].append(_rows(p[fc1_role], f"{pre}mlp.gate_proj.{suffix}", [(0, ffn)], fused))
                by_role[fc1_role].append(_rows(p[fc1_role], f"{pre}mlp.up_proj.{suffix}", [(ffn, ffn)], fused))
            if fc2_role in p:
                by_role[fc2_role].append(_renamed(p[fc2_role], f"{pre}mlp.down_proj.{suffix}"))
        by_role["post_norm"].append(_renamed(p["post_norm"], pre + "post_attention_layernorm.weight"))
    for r in ROLES + BIAS_ROLES:
        out.extend(by_role[r])
    out.append(_renamed(top["norm"], "model.norm.weight"))
    if not tied:
        lm = top["lm_head"]
        out.append(
            _rows(lm, "lm_head.weight", [(0, keep_rows)], fused)
            if keep_rows < vocab
            else _renamed(lm, "lm_head.weight")
        )
    else:
        notes.append("tied: no output_layer in the checkpoint; lm_head is model.embed_tokens (tie_word_embeddings)")
    notes.append(
        f"--to hf: linear_qkv split into q/k/v by query group ({groups} groups of {heads // groups} query heads, "
        f"head_dim {hd}), linear_fc1 into gate_proj/up_proj (first half gate), hidden_act {arch.hidden_act}"
    )
    if biases == QWEN2_BIASES:
        notes.append(
            "--to hf: biases on linear_qkv only (add_qkv_bias): Qwen2ForCausalLM (model_type qwen2), "
            "q/k/v biases split as their weights"
        )
    elif biases:
        notes.append(
            f"--to hf: linear biases ({_said(biases)}): LlamaForCausalLM with attention_bias "
            f"{str('qkv' in biases).lower()}, mlp_bias {str('mlp' in biases).lower()}; split as their weights"
        )
    config = hf_config(arch, hidden=hidden, ffn=ffn, layers=n_layers, vocab=keep_rows, tied=tied, biases=biases)
    kept = [n for n in source.notes if not n.startswith("Megatron-Core torch_dist:")]  # names as saved: not here
    new = Source(source.kind, source.path, out, train_dtype=source.train_dtype, notes=kept)
    return new, config, notes


def _tensor_biases(layers: dict[int, dict[str, SourceTensor]]) -> tuple[frozenset[str], Optional[str]]:
    """The linear biases every layer holds, as HF's groups ("qkv", "o", "mlp"), and why they map to no HF model
    (None: they do): the same in every layer; Qwen2's (q/k/v only) or Llama's (q/k/v and o together:
    attention_bias; fc1 and fc2 together: mlp_bias)."""
    sets = {frozenset(r for r in BIAS_ROLES if r in p) for p in layers.values()}
    if len(sets) > 1:
        return frozenset(), "its layers hold different linear biases: " + "; ".join(
            sorted(", ".join(_BIAS_OF[r] for r in BIAS_ROLES if r in x) or "none" for x in sets)
        )
    roles = sets.pop() if sets else frozenset()
    groups = frozenset(
        g for g, rs in (("qkv", {"qkv_bias"}), ("o", {"o_bias"}), ("mlp", {"fc1_bias", "fc2_bias"})) if rs & roles
    )
    mlp_half = len(roles & {"fc1_bias", "fc2_bias"}) == 1
    if mlp_half or groups not in (frozenset(), QWEN2_BIASES, frozenset({"qkv", "o"}), frozenset({"mlp"}), ALL_BIASES):
        return groups, (
            "linear biases on "
            + ", ".join(_BIAS_OF[r] for r in BIAS_ROLES if r in roles)
            + " only: neither Qwen2's (linear_qkv only) nor Llama's "
            "(linear_qkv with linear_proj: attention_bias; linear_fc1 with linear_fc2: mlp_bias)"
        )
    return groups, None


_BIAS_OF = {"qkv_bias": "linear_qkv", "o_bias": "linear_proj", "fc1_bias": "linear_fc1", "fc2_bias": "linear_fc2"}


def _said(biases: frozenset[str]) -> str:
    names = {"qkv": "linear_qkv", "o": "linear_proj", "mlp": "linear_fc1/fc2"}
    return ", ".join(names[g] for g in ("qkv", "o", "mlp") if g in biases) or "none"


def hf_config(
    arch: _Arch,
    *,
    hidden: int,
    ffn: int,
    layers: int,
    vocab: int,
    tied: bool,
    biases: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """config.json of the LlamaForCausalLM (``biases``: its attention_bias, q/k/v and o, and mlp_bias), or of the
    Qwen2ForCausalLM where the biases are q/k/v's only (Qwen2's attention: q/k/v with biases, o without; its MLP
    without). ``rope_parameters`` is what transformers 5 stores; ``rope_theta`` (and ``rope_scaling``) are written
    too, with the same values, for transformers 4, which reads only those."""
    qwen2 = biases == QWEN2_BIASES
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.groups,
        "head_dim": arch.head_dim,
        "hidden_act": arch.hidden_act,
        "rms_norm_eps": arch.eps,
        "max_position_embeddings": arch.max_pos,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "attention_bias": "qkv" in biases,
        "mlp_bias": "mlp" in biases,
        "rope_parameters": dict(arch.rope),
        "rope_theta": arch.rope["rope_theta"],
    }
    if qwen2:  # its biases are fixed by the architecture; no sliding window (megatron's window_size is refused)
        del cfg["attention_bias"], cfg["mlp_bias"]
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    if arch.rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in arch.rope.items() if k != "rope_theta"}
    return cfg


# ---------------------------------------------------------------------------------------------------- torchtitan

TT_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
# torchtitan 0.3.0's Llama3StateDictAdapter (models/llama3/state_dict_adapter.py), its from_hf_map inverted
TT_LAYER_KEYS = {
    "attention.qkv_linear.wq.weight": "self_attn.q_proj.weight",
    "attention.qkv_linear.wk.weight": "self_attn.k_proj.weight",
    "attention.qkv_linear.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
TT_TOP_KEYS = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
TT_LM_HEAD = "lm_head.weight"
_TT_SEEN = (
    ("moe", "mixture of experts (MoE)"),
    ("experts", "mixture of experts (MoE)"),
    ("router", "mixture of experts (MoE)"),
    ("q_norm", "query/key norms (qk_norm)"),
    ("k_norm", "query/key norms (qk_norm)"),
    ("wqkv", "a fused wqkv (not the adapter's qkv_linear.wq/wk/wv)"),
    ("gate", "a gated feed-forward or attention"),
    ("bias", "linear biases"),
)


def is_torchtitan_llama(names: list[str]) -> bool:
    return "tok_embeddings.weight" in names and any(n.startswith("layers.") for n in names)


def rope_permutation(n_heads: int, head_dim: int) -> list[tuple[int, int]]:
    """The row order torchtitan's adapter gives ``wq``/``wk`` (its ``_permute``:
    ``w.view(n_heads, head_dim // 2, 2, dim).transpose(1, 2).reshape(-1, dim)``): torchtitan rotates adjacent pairs
    (2j, 2j+1), HF's Llama halves (j, j + head_dim/2); per head, the even rows, then the odd ones. As (start, 1)
    row pieces."""
    return [(h * head_dim + 2 * j + p, 1) for h in range(n_heads) for p in (0, 1) for j in range(head_dim // 2)]


def find_torchtitan_job_config(step_dir: Path) -> Optional[Path]:
    """The JSON job config torchtitan's trainer wrote (``--debug.save_config_file``, relative to the dump folder):
    a ``*.json`` holding ``model_spec.model`` in the dump folder (the checkpoint folder's parent) or a folder of it."""
    dump = step_dir.parent.parent
    try:
        found = sorted(dump.glob("*.json")) + sorted(dump.glob("*/*.json"))
    except OSError:
        return None
    for p in found:
        if step_dir.parent in p.parents:
            continue
        try:
            if p.stat().st_size > 16 << 20:
                continue
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("model_spec"), dict):
            if isinstance(doc["model_spec"].get("model"), dict):
                return p
    return None


def _arch_from_torchtitan(path: Path) -> _Arch:
    """The architecture torchtitan's job config records (``model_spec.model``: ``Llama3Model.Config.to_dict()``)."""
    try:
        model = json.loads(path.read_text())["model_spec"]["model"]
        layers = model["layers"]
        layer = layers[0]
        attn = layer["attention"]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ExportError(f"torchtitan's job config {path}: no model_spec.model.layers[0].attention ({e})") from None
    bad = []
    if layer.get("moe"):
        bad.append("moe (mixture of experts)")
    if attn.get("qk_norm"):
        bad.append("qk_norm")
    if any(isinstance(v, dict) and v.get("bias") for v in (attn.get("wo") or {}, layer.get("feed_forward") or {})):
        bad.append("linear biases")
    rope_cfg = attn.get("rope") or {}
    scaling = rope_cfg.get("scaling", "none")
    if scaling not in ("none", "llama"):
        bad.append(f"rope scaling {scaling!r} (mapped: none, llama)")
    if bad:
        raise ExportError(f"--to hf writes Llama-family models; torchtitan's job config {path} says " + "; ".join(bad))
    heads = _int(attn.get("n_heads"))
    kv = _int(attn.get("n_kv_heads")) or heads
    dim = _int(model.get("dim"))
    eps = (layer.get("attention_norm") or {}).get("eps")
    theta = rope_cfg.get("theta")
    missing = [
        k
        for k, v in (("n_heads", heads), ("dim", dim), ("attention_norm.eps", eps), ("rope.theta", theta))
        if v is None
    ]
    if missing or heads is None or dim is None or eps is None or theta is None:
        raise ExportError(f"torchtitan's job config {path} lacks " + ", ".join(missing))
    head_dim = _int(attn.get("head_dim")) or _int((attn.get("qkv_linear") or {}).get("head_dim")) or dim // heads
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(theta)}
    if scaling == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": float(theta),
            "factor": float(rope_cfg.get("scaling_factor", 8.0)),
            "low_freq_factor": float(rope_cfg.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(rope_cfg.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings": int(rope_cfg.get("original_max_position_embeddings", 8192)),
        }
    ffn = _int(((layer.get("feed_forward") or {}).get("w1") or {}).get("out_features"))
    tie = model.get("enable_weight_tying")
    return _Arch(
        heads=heads,
        groups=kv or heads,
        head_dim=head_dim,
        hidden_act="silu",  # torchtitan's Llama3 FeedForward: w2(silu(w1(x)) * w3(x))
        eps=float(eps),
        rope=rope,
        max_pos=int(rope_cfg.get("max_seq_len") or 2048),
        from_=f"torchtitan's job config {path.name} in the run's dump folder (its --debug.save_config_file)",
        hidden=dim,
        ffn=ffn,
        layers=len(layers) if isinstance(layers, list) else None,
        vocab=_int(model.get("vocab_size")),
        tied=tie if isinstance(tie, bool) else None,
    )


def torchtitan_to_hf(
    source: Source,
    step_dir: Optional[Path],
    *,
    config_path: Optional[Path] = None,
    true_vocab_size: Optional[int] = None,
) -> tuple[Source, dict[str, Any], list[str]]:
    """``source`` (a torchtitan Llama3 model's tensors, as its step-N checkpoint names them) as an HF Llama model,
    as torchtitan 0.3.0's ``Llama3StateDictAdapter.to_hf`` maps it: names, and wq/wk rows permuted per head.
    The config: torchtitan's saved job config beside the run (``step_dir``: the local step-N folder), else
    ``--config``, else refused."""
    names = [t.name for t in source.tensors]
    by = {t.name: t for t in source.tensors}
    odd = [
        n
        for n in names
        if n not in TT_TOP_KEYS
        and n != TT_LM_HEAD
        and not ((m := TT_LAYER_RE.match(n)) is not None and m.group(2) in TT_LAYER_KEYS)
    ]
    if odd:
        what = sorted({w for n in odd for key, w in _TT_SEEN if key in n})
        raise ExportError(
            "--to hf writes Llama-family models (torchtitan's Llama3 as its Llama3StateDictAdapter maps it); this "
            "checkpoint holds "
            + (", ".join(what) + ": " if what else "tensors the Llama mapping does not know: ")
            + ", ".join(odd[:6])
            + (f" and {len(odd) - 6} more" if len(odd) > 6 else "")
            + ". The plain export (without --to hf) writes it under its own names"
        )
    layers: dict[int, dict[str, SourceTensor]] = {}
    for n in names:
        m = TT_LAYER_RE.match(n)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = by[n]
    problems = layer_problems(layers, TT_LAYER_KEYS)
    n_layers = len(layers)
    for k in TT_TOP_KEYS:
        if k not in by:
            problems.append(f"no {k}")
    if problems or not layers:
        raise ExportError("--to hf: the checkpoint is not a whole torchtitan Llama model: " + "; ".join(problems))
    # shapes first: a refusal for a disagreement says so even before a missing configuration
    emb = by["tok_embeddings.weight"]
    vocab, hidden = emb.shape[0], emb.shape[1]
    l0 = layers[0]
    ffn = l0["feed_forward.w1.weight"].shape[0]
    q_rows, kv_rows = l0["attention.qkv_linear.wq.weight"].shape[0], l0["attention.qkv_linear.wk.weight"].shape[0]
    notes: list[str] = []
    job = find_torchtitan_job_config(step_dir) if step_dir is not None else None
    if job is not None:
        arch = _arch_from_torchtitan(job)
        if config_path is not None:  # neither silently wins: every value both give must agree
            notes += check_config_agrees(torchtitan_values(arch), config_path, f"torchtitan's job config {job.name}")
    elif config_path is not None:
        arch = _arch_from_config(config_path)
        if arch.hidden_act != "silu":
            raise ExportError(
                f"--config {config_path}: hidden_act {arch.hidden_act!r}; torchtitan's Llama3 feed-forward is SiLU"
            )
    else:
        raise NeedsConfig(
            "torchtitan keeps its model configs in Python and this run saved no job config (--debug.save_config_file) "
            f"beside it: --to hf needs num_attention_heads (n_heads), num_key_value_heads "
            f"(n_kv_heads; wq has {q_rows} rows, wk {kv_rows}), rms_norm_eps, rope_theta (and the rope scaling) and "
            "max_position_embeddings, which shapes cannot show; give the model's Hugging Face config.json with "
            "--config PATH"
        )
    notes.append(f"--to hf: the configuration from {arch.from_}")
    tied = "lm_head.weight" not in by if arch.tied is None else arch.tied
    hd, heads, kv = arch.head_dim, arch.heads, arch.groups
    bad = [
        f"{what}: the configuration says {said}, the tensors {seen}"
        for what, said, seen in (
            ("hidden size (dim)", arch.hidden, hidden),
            ("layers", arch.layers, n_layers),
            ("intermediate (ffn) size", arch.ffn, ffn),
            ("vocab", arch.vocab, vocab),
        )
        if said not in (None, seen)
    ]
    if hd % 2:
        bad.append(f"head_dim {hd} is odd: no rotary pairs")
    if not tied and "lm_head.weight" not in by:
        bad.append("the configuration says untied, the checkpoint has no lm_head.weight")
    for i, p in sorted(layers.items()):
        want = {
            "attention.qkv_linear.wq.weight": (heads * hd, hidden),
            "attention.qkv_linear.wk.weight": (kv * hd, hidden),
            "attention.qkv_linear.wv.weight": (kv * hd, hidden),
            "attention.wo.weight": (hidden, heads * hd),
            "feed_forward.w1.weight": (ffn, hidden),
            "feed_forward.w3.weight": (ffn, hidden),
            "feed_forward.w2.weight": (hidden, ffn),
            "attention_norm.weight": (hidden,),
            "ffn_norm.weight": (hidden,),
        }
        for k, shape in want.items():
            if tuple(p[k].shape) != shape:
                extra = f" ({heads} heads, {kv} key/value heads, head_dim {hd})" if "attention" in k else ""
                bad.append(f"layer {i} {k}: {list(p[k].shape)}, expected {list(shape)}{extra}")
    if tuple(by["norm.weight"].shape) != (hidden,):
        bad.append(f"norm.weight: {list(by['norm.weight'].shape)}, expected [{hidden}]")
    if "lm_head.weight" in by and tuple(by["lm_head.weight"].shape) != (vocab, hidden):
        bad.append(f"lm_head.weight: {list(by['lm_head.weight'].shape)}, expected {[vocab, hidden]}")
    if true_vocab_size is not None and not 0 < true_vocab_size <= vocab:
        bad.append(f"--true-vocab-size {true_vocab_size}: the embedding has {vocab} rows")
    if bad:
        raise ExportError("--to hf: the configuration and the tensors disagree:\n  " + "\n  ".join(bad[:12]))
    fused = _OneFused()
    keep = true_vocab_size if true_vocab_size is not None else vocab
    out: list[SourceTensor] = []

    def vocab_rows(t: SourceTensor, name: str) -> SourceTensor:
        return _rows(t, name, [(0, keep)], fused) if keep < vocab else _renamed(t, name)

    out.append(vocab_rows(emb, "model.embed_tokens.weight"))
    q_perm, k_perm = rope_permutation(heads, hd), rope_permutation(kv, hd)
    for i, p in sorted(layers.items()):
        for k, hf in TT_LAYER_KEYS.items():
            name = f"model.layers.{i}.{hf}"
            if k == "attention.qkv_linear.wq.weight":
                out.append(_rows(p[k], name, q_perm, fused))
            elif k == "attention.qkv_linear.wk.weight":
                out.append(_rows(p[k], name, k_perm, fused))
            else:
                out.append(_renamed(p[k], name))
    out.append(_renamed(by["norm.weight"], "model.norm.weight"))
    if not tied:
        out.append(vocab_rows(by["lm_head.weight"], "lm_head.weight"))
    else:
        notes.append("tied (enable_weight_tying): lm_head is model.embed_tokens, written once")
    if keep < vocab:
        notes.append(f"--true-vocab-size {keep}: the embedding and lm_head cut from {vocab} rows")
    notes.append(
        f"--to hf: torchtitan's Llama3StateDictAdapter mapping; wq and wk rows permuted per head (adjacent rotary "
        f"pairs -> halves; {heads} heads, {kv} key/value heads, head_dim {hd}), hidden_act {arch.hidden_act}"
    )
    config = hf_config(arch, hidden=hidden, ffn=ffn, layers=n_layers, vocab=keep, tied=tied)
    new = Source(source.kind, source.path, out, train_dtype=source.train_dtype, notes=list(source.notes))
    return new, config, notes


# ---------------------------------------------------------------------------------------------------- verify


def hf_references(refs: Iterator[tuple[str, Any]], cfg: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``verify DIR --against SRC`` of a ``--to hf`` export: the reference loader's tensors (under the source's
    names: Megatron-Core's or torchtitan's) as the HF tensors they map to, computed afresh from the output's
    ``config.json`` (heads, key/value heads, head_dim) with torch's own view/split, not the export's row pieces:
    megatron's ``linear_qkv`` viewed ``[groups, heads/groups + 2, head_dim, hidden]``, ``linear_fc1`` halved;
    torchtitan's wq/wk permuted by its adapter's formula; megatron's biases as their weights' rows. Rows past
    ``vocab_size`` (``--true-vocab-size``) cut."""
    heads, kv = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    hd, vocab, tied = int(cfg["head_dim"]), int(cfg["vocab_size"]), bool(cfg.get("tie_word_embeddings"))
    tt_top = {**TT_TOP_KEYS, TT_LM_HEAD: "lm_head.weight"}
    mg_top = {
        "embedding.word_embeddings.weight": "model.embed_tokens.weight",
        "decoder.final_layernorm.weight": "model.norm.weight",
        "output_layer.weight": "lm_head.weight",
    }
    mg_layer = {
        "input_norm": "input_layernorm.weight",
        "o": "self_attn.o_proj.weight",
        "o_bias": "self_attn.o_proj.bias",
        "post_norm": "post_attention_layernorm.weight",
        "fc2": "mlp.down_proj.weight",
        "fc2_bias": "mlp.down_proj.bias",
    }
    for name, t in refs:
        if name.endswith("_extra_state"):
            continue
        if name in mg_top or name in tt_top:
            hf = mg_top.get(name) or tt_top[name]
            if hf == "lm_head.weight" and tied:
                continue
            yield hf, (t[:vocab] if hf != "model.norm.weight" else t)
            continue
        m = LAYER_RE.match(name)
        if m and m.group(2) in LAYER_KEYS:
            pre, role = f"model.layers.{m.group(1)}.", LAYER_KEYS[m.group(2)]
            suffix = "bias" if role.endswith("_bias") else "weight"  # a bias: its weight's rows
            if role in ("qkv", "qkv_bias"):
                per, rest = heads // kv, tuple(t.shape[1:])
                g = t.view(kv, per + 2, hd, *rest)
                yield pre + f"self_attn.q_proj.{suffix}", g[:, :per].reshape(-1, *rest)
                yield pre + f"self_attn.k_proj.{suffix}", g[:, per].reshape(-1, *rest)
                yield pre + f"self_attn.v_proj.{suffix}", g[:, per + 1].reshape(-1, *rest)
            elif role in ("fc1", "fc1_bias"):
                gate, up = t.chunk(2)
                yield pre + f"mlp.gate_proj.{suffix}", gate
                yield pre + f"mlp.up_proj.{suffix}", up
            else:
                yield pre + mg_layer[role], t
            continue
        m = TT_LAYER_RE.match(name)
        if m and m.group(2) in TT_LAYER_KEYS:
            hf = f"model.layers.{m.group(1)}.{TT_LAYER_KEYS[m.group(2)]}"
            if m.group(2).endswith(("wq.weight", "wk.weight")):
                n = t.shape[0] // hd
                t = t.view(n, hd // 2, 2, t.shape[1]).transpose(1, 2).reshape(t.shape[0], t.shape[1])
            yield hf, t
            continue
        yield name, t  # not mapped: reported as missing in the output


def is_hf_export(out: Path) -> Optional[dict[str, Any]]:
    """The config.json of a ``--to hf`` output (a Llama or, from a Megatron-Core source with q/k/v biases, a Qwen2
    folder), else None."""
    try:
        cfg = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(cfg, dict) and cfg.get("model_type") in ("llama", "qwen2") and "head_dim" in cfg:
        return cfg
    return None


# ---------------------------------------------------------------------------------------------------- the offer


def hf_offer(
    tensors: list[tuple[str, tuple[int, ...], str]],
    *,
    megatron: bool,
    args: dict[str, Any],
    step_dir: Optional[Path],
) -> Optional[str]:
    """What the inspector may offer of ``--to hf`` for a checkpoint whose model tensors (as export names them) are
    ``tensors`` ((name, shape, dtype)), from header facts only: the checks ``megatron_to_hf``/``torchtitan_to_hf``
    make before writing, run on tensors that are never read. ``"ready"``: it converts as it is; ``"config"``: it
    would, given ``--config PATH`` (the checkpoint records no configuration, or not all of it); None: not a
    Llama-family Megatron-Core GPT or torchtitan model (or its shapes and configuration disagree)."""

    def never() -> object:
        raise AssertionError("hf_offer reads no tensor")

    names = [n for n, _, _ in tensors]
    src = Source("dcp", Path("."), [SourceTensor(n, tuple(s), d, load=never) for n, s, d in tensors])
    try:
        if megatron and is_megatron_gpt(names):
            megatron_to_hf(src, args)
        elif is_torchtitan_llama(names):
            torchtitan_to_hf(src, step_dir)
        else:
            return None
    except NeedsConfig:
        return "config"
    except (ExportError, KeyError, ValueError, TypeError, ZeroDivisionError):
        return None
    return "ready"


def layer_problems(layers: dict[int, dict[str, SourceTensor]], roles: Iterable[str]) -> list[str]:
    """What keeps ``layers`` (index -> role -> tensor) from being whole: indices that are not 0..n-1, and each
    layer's missing roles (of ``roles``)."""
    problems: list[str] = []
    n_layers = len(layers)
    if sorted(layers) != list(range(n_layers)):
        problems.append(f"layers {sorted(layers)} are not 0..{n_layers - 1}")
    for i, parts in sorted(layers.items()):
        lack = [r for r in roles if r not in parts]
        if lack:
            problems.append(f"layer {i} lacks {', '.join(lack)}")
    return problems
