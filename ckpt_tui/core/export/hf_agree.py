"""``--to hf`` given ``--config`` for a run that records its own configuration (Megatron-LM's args, torchtitan's
job config): neither silently wins. Every value both give must agree, else the export is refused naming each
disagreement, before anything is written.

Compared: heads, key/value heads (query groups), head_dim, hidden_act, the norm's eps, rope (type, theta and the
``llama3`` scaling's factors), vocab, layers, hidden and intermediate size, tied or not. A config's vocab_size
below the run's is no disagreement: Megatron pads the vocabulary (``make_vocab_size_divisible_by`` x TP) and an HF
config names the true size: said, with ``--true-vocab-size``. Not compared: ``max_position_embeddings`` (an HF
config names the model's context, a run's args often the training sequence length; it changes no weight).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from .errors import ExportError

# key -> the config.json name it is said as
HF_NAMES = {
    "heads": "num_attention_heads",
    "groups": "num_key_value_heads",
    "head_dim": "head_dim",
    "hidden_act": "hidden_act",
    "eps": "rms_norm_eps",
    "rope_type": "rope_type",
    "rope_theta": "rope_theta",
    "factor": "rope factor",
    "low_freq_factor": "rope low_freq_factor",
    "high_freq_factor": "rope high_freq_factor",
    "original_max_position_embeddings": "rope original_max_position_embeddings",
    "vocab": "vocab_size",
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "ffn": "intermediate_size",
    "tied": "tie_word_embeddings",
}
_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

Values = dict[str, tuple[str, Any]]  # key -> (where the source says it, the value)


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def megatron_values(args: dict[str, Any]) -> Values:
    """What Megatron-LM's ``args`` say of each compared value (those they give)."""
    out: Values = {}

    def put(key: str, name: str, v: Any) -> None:
        if v is not None:
            out[key] = (name, v)

    heads, hidden = _int(args.get("num_attention_heads")), _int(args.get("hidden_size"))
    put("heads", "num_attention_heads", heads)
    if args.get("group_query_attention"):
        put("groups", "num_query_groups", _int(args.get("num_query_groups")))
    elif "group_query_attention" in args:
        put("groups", "num_attention_heads (no group_query_attention)", heads)
    if _int(args.get("kv_channels")):
        put("head_dim", "kv_channels", _int(args.get("kv_channels")))
    elif heads and hidden:
        put("head_dim", "hidden_size / num_attention_heads", hidden // heads)
    if isinstance(args.get("swiglu"), bool):
        put("hidden_act", "swiglu", "silu" if args["swiglu"] else "gelu")
    put("eps", "norm_epsilon", _num(args.get("norm_epsilon")))
    put("rope_theta", "rotary_base", _num(args.get("rotary_base")))
    if "use_rope_scaling" in args:
        scaled = bool(args["use_rope_scaling"])
        put("rope_type", "use_rope_scaling", "llama3" if scaled else "default")
        if scaled:  # megatron-core's apply_rope_scaling: Llama 3.1's, with its defaults
            put("factor", "rope_scaling_factor", float(args.get("rope_scaling_factor") or 8.0))
            put("low_freq_factor", "megatron-core's apply_rope_scaling", 1.0)
            put("high_freq_factor", "megatron-core's apply_rope_scaling", 4.0)
            put("original_max_position_embeddings", "megatron-core's apply_rope_scaling", 8192)
    put("vocab", "padded_vocab_size", _int(args.get("padded_vocab_size")))
    put("layers", "num_layers", _int(args.get("num_layers")))
    put("hidden", "hidden_size", hidden)
    put("ffn", "ffn_hidden_size", _int(args.get("ffn_hidden_size")))
    untie = args.get("untie_embeddings_and_output_weights")
    if isinstance(untie, bool):
        put("tied", "untie_embeddings_and_output_weights", not untie)
    return out


def torchtitan_values(arch: Any) -> Values:
    """What torchtitan's job config says (its architecture as ``to_hf._arch_from_torchtitan`` read it)."""
    out: Values = {}
    named = {
        "heads": ("n_heads", arch.heads),
        "groups": ("n_kv_heads", arch.groups),
        "head_dim": ("head_dim", arch.head_dim),
        "hidden_act": ("its Llama3 feed-forward", arch.hidden_act),
        "eps": ("attention_norm.eps", arch.eps),
        "vocab": ("vocab_size", arch.vocab),
        "layers": ("layers", arch.layers),
        "hidden": ("dim", arch.hidden),
        "ffn": ("feed_forward.w1.out_features", arch.ffn),
        "tied": ("enable_weight_tying", arch.tied),
    }
    for k, (name, v) in named.items():
        if v is not None:
            out[k] = (name, v)
    rope = dict(arch.rope)
    out["rope_type"] = ("rope.scaling", rope.get("rope_type", "default"))
    out["rope_theta"] = ("rope.theta", rope.get("rope_theta"))
    for k in _ROPE_KEYS:
        if k in rope:
            out[k] = (f"rope.{k}", rope[k])
    return out


def read_config(path: Path) -> dict[str, Any]:
    """``--config``'s JSON object (the file, or the folder's config.json); ExportError where it is none."""
    p = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"--config {path}: cannot read it as a config.json ({e})") from None
    if not isinstance(cfg, dict):
        raise ExportError(f"--config {path}: not a config.json (a JSON object)")
    return cfg


def refuse_model_type(path: Path, cfg: dict[str, Any], qwen2: bool) -> None:
    """``--config``'s model_type must be one --to hf writes: Llama, or (``qwen2``: a source whose biases can be
    Qwen2's, q/k/v only) Qwen2."""
    mt = cfg.get("model_type")
    if mt not in (None, "llama", "qwen2") or (mt == "qwen2" and not qwen2):
        raise ExportError(
            f"--config {path}: model_type {mt!r}; --to hf writes Llama (model_type 'llama')"
            + (" or, with q/k/v biases only, Qwen2 ('qwen2')" if qwen2 else "")
        )


def config_values(path: Path, *, qwen2: bool = False) -> Values:
    """What an HF config.json (``--config``: the file, or the folder holding it) says of each compared value (those
    it gives; ``num_key_value_heads`` absent is ``num_attention_heads``, as transformers reads it)."""
    cfg = read_config(path)
    refuse_model_type(path, cfg, qwen2)
    out: Values = {}

    def put(key: str, v: Any) -> None:
        if v is not None:
            out[key] = (HF_NAMES[key], v)

    heads, hidden = _int(cfg.get("num_attention_heads")), _int(cfg.get("hidden_size"))
    put("heads", heads)
    put("groups", _int(cfg.get("num_key_value_heads")) or heads)
    put("head_dim", _int(cfg.get("head_dim")) or (hidden // heads if heads and hidden else None))
    put("hidden_act", cfg.get("hidden_act") if isinstance(cfg.get("hidden_act"), str) else None)
    put("eps", _num(cfg.get("rms_norm_eps")))
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        scaling = cfg.get("rope_scaling")
        rope = dict(scaling) if isinstance(scaling, dict) else {}
        if "type" in rope:
            rope.setdefault("rope_type", rope.pop("type"))
        if cfg.get("rope_theta") is not None:
            rope["rope_theta"] = cfg["rope_theta"]
        if rope.get("rope_theta") is not None:
            rope.setdefault("rope_type", "default")
    put("rope_type", rope.get("rope_type") if isinstance(rope.get("rope_type"), str) else None)
    put("rope_theta", _num(rope.get("rope_theta")))
    for k in _ROPE_KEYS:
        put(k, _num(rope.get(k)))
    put("vocab", _int(cfg.get("vocab_size")))
    put("layers", _int(cfg.get("num_hidden_layers")))
    put("hidden", hidden)
    put("ffn", _int(cfg.get("intermediate_size")))
    put("tied", cfg.get("tie_word_embeddings") if isinstance(cfg.get("tie_word_embeddings"), bool) else None)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return bool(a == b)


def check_config_agrees(run: Values, config_path: Path, what: str, *, qwen2: bool = False) -> list[str]:
    """The notes of ``--config`` checked against what the run records (``run``, from ``what``); ExportError naming
    every disagreement. ``qwen2``: a Qwen2 config is taken (a Megatron-Core source)."""
    given = config_values(config_path, qwen2=qwen2)
    both = [k for k in HF_NAMES if k in run and k in given]
    bad: list[str] = []
    notes: list[str] = []
    for k in both:
        (name, mine), (_, theirs) = run[k], given[k]
        if _same(mine, theirs):
            continue
        if k == "vocab" and isinstance(theirs, int) and isinstance(mine, int) and theirs < mine:
            notes.append(
                f"--config says vocab_size {theirs}, {what} {mine} ({name}: the padded vocabulary): the export keeps "
                f"the {mine} rows the tensors hold; --true-vocab-size {theirs} keeps the config's"
            )
            continue
        bad.append(f"{HF_NAMES[k]}: --config says {theirs!r}, {what} {mine!r} ({name})")
    if bad:
        raise ExportError(
            f"--config {config_path} and {what} disagree (given both, every value both give must agree: correct "
            "the one that is wrong, or leave --config out where the run's record is whole):\n  " + "\n  ".join(bad)
        )
    notes.insert(0, f"--config {config_path} agrees with {what} on the {len(both)} values both give")
    return notes
