"""``export --to hf`` of Megatron-Core torch_dist checkpoints, proven by logits: samples/megatron_hf.py saves a tiny
Llama-family GPTModel (RMSNorm with distinct weights, SwiGLU, rotary halves, GQA 4 heads / 2 groups) at TP=1, TP=2
and PP=2 (megatron-core 0.19 and 0.16), a tied one, and two with random linear biases (Qwen2's q/k/v only, and all
four linear layers'), and records megatron's own fp32 logits on a fixed 2 x 40 batch after
``dist_checkpointing.load`` (a PP=2 save: its two stages in turn). transformers loads the export
(LlamaForCausalLM, Qwen2ForCausalLM for q/k/v biases) and must give the same logits (max |Δ| <= 1e-4 * max |logit|;
measured 4e-7 to 6.5e-7 of it); each mutation (q/k/v split wrong, gate and up swapped, two norms swapped, the wrong
activation, k and v biases swapped) must miss by >= 100x the tolerance."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tui.core.export import to_hf
from ckpt_tui.core.export.api import export
from ckpt_tui.core.export.write import ExportError
from tests.functional.core.hf_mutations import run_worked_example, swapped_copies

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VARIANTS = [
    "megatron-hf-tp1",
    "megatron-hf-tp2",
    "megatron-hf-tied",
    "megatron-hf-pp2",
    "megatron-hf-tp2-016",
    "megatron-hf-tp1-016",
    "megatron-hf-pp2-016",
]
# with linear biases (random, not megatron's zeros): variant -> (model_type, the class from_pretrained builds, the
# biases of a layer)
QKV_BIASES = ["self_attn.k_proj.bias", "self_attn.q_proj.bias", "self_attn.v_proj.bias"]
BIAS_VARIANTS = {
    "megatron-hf-qkvbias": ("qwen2", "Qwen2ForCausalLM", QKV_BIASES),
    "megatron-hf-bias": (
        "llama",
        "LlamaForCausalLM",
        sorted(QKV_BIASES + ["self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"]),
    ),
}


def _logits(folder, ids, cls="LlamaForCausalLM"):
    model = getattr(transformers, cls).from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def _oracle(root):
    o = torch.load(root / "oracle/logits.pt", weights_only=True)
    return o["ids"], o["logits"]


def _rel(folder, root, cls="LlamaForCausalLM") -> float:
    ids, ref = _oracle(root)
    return ((_logits(folder, ids, cls) - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_equal_megatrons_own(real_ckpt, tmp_path, variant):
    root = real_ckpt(variant)
    out = tmp_path / "hf"
    res = export(root / "checkpoints", out, to="hf")
    assert res.verified
    assert any("split into q/k/v by query group (2 groups of 2 query heads, head_dim 16)" in n for n in res.notes)
    assert any("vocab_size 256" in n for n in res.notes)
    _, info = transformers.LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    cfg = json.loads((out / "config.json").read_text())
    tied = variant == "megatron-hf-tied"
    assert cfg["tie_word_embeddings"] is tied and ("lm_head.weight" in load_file(out / "model.safetensors")) is not tied
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert (cfg["hidden_act"], cfg["rms_norm_eps"], cfg["vocab_size"]) == ("silu", 1e-5, 256)
    # rope: what transformers 5 reads back equals megatron's settings; the legacy key (transformers 4) agrees
    auto = transformers.AutoConfig.from_pretrained(out)
    assert auto.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0} and cfg["rope_theta"] == 10000.0
    rel = _rel(out, root)
    print(f"{variant}: max|Δ| / max|logit| = {rel:.2e}")
    assert rel <= TOL


@pytest.mark.parametrize("variant", BIAS_VARIANTS)
def test_biases_mapped_logits_equal_megatrons_own(real_ckpt, tmp_path, variant):
    """add_qkv_bias (linear_qkv's bias only): a Qwen2ForCausalLM folder; add_bias_linear (all four): Llama with
    attention_bias and mlp_bias. AutoModelForCausalLM builds that class from the folder, nothing missing or
    unexpected, and its logits are megatron's."""
    model_type, cls, layer_biases = BIAS_VARIANTS[variant]
    root = real_ckpt(variant)
    out = tmp_path / "hf"
    res = export(root / "checkpoints", out, to="hf")
    assert res.verified
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == model_type and cfg["architectures"] == [cls]
    if model_type == "llama":
        assert cfg["attention_bias"] is True and cfg["mlp_bias"] is True
        assert any("LlamaForCausalLM with attention_bias true, mlp_bias true" in n for n in res.notes), res.notes
    else:
        assert "attention_bias" not in cfg and cfg["use_sliding_window"] is False
        assert any("Qwen2ForCausalLM (model_type qwen2)" in n for n in res.notes), res.notes
    sd = load_file(out / "model.safetensors")
    for i in (0, 1):
        biases = sorted(k.split(f"layers.{i}.")[1] for k in sd if k.endswith(".bias") and f".layers.{i}." in k)
        assert biases == layer_biases
    assert all(sd[k].abs().min() > 0 for k in sd if k.endswith(".bias"))  # the fixture's, not megatron's zeros
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == cls
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert transformers.AutoConfig.from_pretrained(out).rope_parameters == {"rope_type": "default", "rope_theta": 1e4}
    rel = _rel(out, root, cls)
    print(f"{variant}: max|Δ| / max|logit| = {rel:.2e}")
    assert rel <= TOL


def test_misplaced_biases_miss_by_far_more_than_the_tolerance(real_ckpt, tmp_path):
    """A bias put on the wrong projection is seen: k and v biases swapped (Qwen2), gate and up biases swapped, the
    o_proj bias taken for down_proj's (Llama's attention_bias/mlp_bias) miss by >= 100x the tolerance."""
    misses = {}
    for variant, swaps in (
        ("megatron-hf-qkvbias", {"k/v biases swapped": ("self_attn.k_proj.bias", "self_attn.v_proj.bias")}),
        (
            "megatron-hf-bias",
            {
                "gate/up biases swapped": ("mlp.gate_proj.bias", "mlp.up_proj.bias"),
                "o/down biases swapped": ("self_attn.o_proj.bias", "mlp.down_proj.bias"),
            },
        ),
    ):
        (tmp_path / variant).mkdir()
        root, out = _exported(real_ckpt, tmp_path / variant, variant)
        cls = BIAS_VARIANTS[variant][1]
        assert _rel(out, root, cls) <= TOL
        layer0 = {what: tuple(f"model.layers.0.{n}" for n in pair) for what, pair in swaps.items()}
        for what, d in swapped_copies(out, tmp_path / variant, layer0).items():
            misses[what] = _rel(d, root, cls)
    print({k: f"{v:.2e}" for k, v in misses.items()})
    assert len(misses) == 3 and all(v >= 100 * TOL for v in misses.values()), misses


def test_verify_knows_the_bias_mapping(real_ckpt, tmp_path):
    """verify DIR --against SRC of a bias export (a Qwen2 folder, and a Llama one with biases): megatron's biases
    split afresh as their weights; passes, and fails on a mutated bias."""
    from ckpt_tui.core.verify import verify

    for variant in BIAS_VARIANTS:
        root = real_ckpt(variant)
        out = tmp_path / variant
        export(root / "checkpoints", out, to="hf")
        v = verify(out, root / "checkpoints")
        assert v.ok and v.compared == len(load_file(out / "model.safetensors")) and not v.not_in_reference, v
        sd = load_file(out / "model.safetensors")
        name = "model.layers.1.self_attn.v_proj.bias"
        sd[name] = sd[name].clone()
        sd[name][-1] += 1
        save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
        v = verify(out, root / "checkpoints")
        assert not v.ok and v.mismatches == [name]


def test_bias_checkpoint_without_args_takes_a_qwen2_config(real_ckpt, tmp_path, monkeypatch):
    """Without args, --config with model_type qwen2 gives a q/k/v-bias checkpoint its configuration (logits
    megatron's); a config or args whose biases disagree with the tensors are refused before anything is written."""
    root = real_ckpt("megatron-hf-qkvbias")
    good = tmp_path / "good"
    export(root / "checkpoints", good, to="hf")
    qwen_args = _args(real_ckpt, "megatron-hf-qkvbias")
    assert qwen_args["add_qkv_bias"] is True and qwen_args["add_bias_linear"] is False
    _no_args(monkeypatch)
    cfg = json.loads((good / "config.json").read_text())
    given = tmp_path / "given.json"
    given.write_text(json.dumps({k: v for k, v in cfg.items() if k != "rope_parameters"}))
    res = export(root / "checkpoints", tmp_path / "hf", to="hf", config=given)
    assert any("--config" in n and "trusted" in n for n in res.notes)
    assert json.loads((tmp_path / "hf/config.json").read_text())["model_type"] == "qwen2"
    assert _rel(tmp_path / "hf", root, "Qwen2ForCausalLM") <= TOL
    # a Qwen2 config for a checkpoint without biases, a Llama one without biases for this one: refused
    with pytest.raises(ExportError, match="linear biases: the configuration says linear_qkv, the tensors none"):
        export(real_ckpt("megatron-hf-tp2") / "checkpoints", tmp_path / "x", to="hf", config=given)
    llama = {**cfg, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": False}
    given.write_text(json.dumps(llama))
    with pytest.raises(ExportError, match="linear biases: the configuration says none, the tensors linear_qkv"):
        export(root / "checkpoints", tmp_path / "x", to="hf", config=given)
    given.write_text(json.dumps({**cfg, "use_sliding_window": True}))
    with pytest.raises(ExportError, match="use_sliding_window"):
        export(root / "checkpoints", tmp_path / "x", to="hf", config=given)
    # args that say no biases: refused too
    _no_args(monkeypatch, {**qwen_args, "add_qkv_bias": False})
    with pytest.raises(ExportError, match="linear biases: the configuration says none, the tensors linear_qkv"):
        export(root / "checkpoints", tmp_path / "x", to="hf")
    assert not (tmp_path / "x").exists()


def test_a_qwen2_config_beside_the_runs_args_is_checked_against_them(real_ckpt, tmp_path):
    """Args and --config both given for a q/k/v-bias run: the Qwen2 config the run's own export wrote agrees with
    the args (the cross-check takes a qwen2 model_type, as the config reader does); one value changed is refused."""
    root = real_ckpt("megatron-hf-qkvbias")
    good = tmp_path / "good"
    export(root / "checkpoints", good, to="hf")
    res = export(root / "checkpoints", tmp_path / "hf", to="hf", config=good / "config.json")
    assert any("agrees with the run's Megatron-LM args" in n for n in res.notes), res.notes
    assert _rel(tmp_path / "hf", root, "Qwen2ForCausalLM") <= TOL
    cfg = json.loads((good / "config.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**cfg, "rms_norm_eps": 1e-6}))
    with pytest.raises(ExportError, match="rms_norm_eps: --config says 1e-06"):
        export(root / "checkpoints", tmp_path / "x", to="hf", config=bad)
    assert not (tmp_path / "x").exists()


def _exported(real_ckpt, tmp_path, variant="megatron-hf-tp2", **kw):
    root = real_ckpt(variant)
    out = tmp_path / "hf"
    export(root / "checkpoints", out, to="hf", **kw)
    return root, out


def _edit(out, fn):
    sd = load_file(out / "model.safetensors")
    fn(sd)
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})


def test_mutations_miss_by_far_more_than_the_tolerance(real_ckpt, tmp_path):
    """The test sees errors: each wrong mapping misses megatron's logits by >= 100x the tolerance."""
    root, out = _exported(real_ckpt, tmp_path)
    assert _rel(out, root) <= TOL
    misses = {what: _rel(d, root) for what, d in swapped_copies(out, tmp_path).items()}
    d = tmp_path / "gelu"
    shutil.copytree(out, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    misses["wrong activation"] = _rel(d, root)
    # q/k/v taken as three blocks [all q | all k | all v] instead of per query group
    h, g, hd = 4, 2, 16

    def blocks(heads, groups, head_dim):
        return (
            [(0, heads * head_dim)],
            [(heads * head_dim, groups * head_dim)],
            [((heads + groups) * head_dim, groups * head_dim)],
        )

    assert blocks(h, g, hd) != to_hf.qkv_pieces(h, g, hd)
    d = tmp_path / "qkv-blocks"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(to_hf, "qkv_pieces", blocks)
        export(root / "checkpoints", d, to="hf")
    misses["q/k/v split as blocks"] = _rel(d, root)
    print({k: f"{v:.2e}" for k, v in misses.items()})
    assert all(v >= 100 * TOL for v in misses.values()), misses


def test_qkv_pieces_by_query_group():
    """Megatron's linear_qkv rows, derived from its forward (qkv.view(s, b, groups, (heads/groups + 2) * head_dim),
    split into heads/groups q heads, one k, one v): group g's block of (per + 2) * head_dim rows."""
    q, k, v = to_hf.qkv_pieces(8, 2, 4)  # 4 q heads per group
    assert q == [(0, 16), (24, 16)] and k == [(16, 4), (40, 4)] and v == [(20, 4), (44, 4)]
    q, k, v = to_hf.qkv_pieces(4, 4, 2)  # MHA: q k v per head
    assert q == [(0, 2), (6, 2), (12, 2), (18, 2)] and k[0] == (2, 2) and v[0] == (4, 2)


def test_true_vocab_size_cuts_the_padded_rows(real_ckpt, tmp_path):
    root, out = _exported(real_ckpt, tmp_path, true_vocab_size=250)
    sd = load_file(out / "model.safetensors")
    assert sd["model.embed_tokens.weight"].shape == (250, 64) and sd["lm_head.weight"].shape == (250, 64)
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 250
    ids, ref = _oracle(root)
    ids = ids.clamp(max=249)  # the batch within the kept vocabulary: same logits on the kept rows
    full = tmp_path / "full"
    export(root / "checkpoints", full, to="hf")
    assert torch.allclose(_logits(out, ids), _logits(full, ids)[..., :250], atol=1e-5)
    with pytest.raises(ExportError, match="--true-vocab-size 300: the embedding has 256 rows"):
        export(root / "checkpoints", tmp_path / "x", to="hf", true_vocab_size=300)


# ---------------------------------------------------------------- refusals


def _no_args(monkeypatch, args=None):
    from ckpt_tui.core.formats.dcp import format as dcp_format

    monkeypatch.setattr(dcp_format, "megatron_args", lambda node: dict(args or {}))


def test_without_args_refused_naming_the_values_then_config_works(real_ckpt, tmp_path, monkeypatch):
    root = real_ckpt("megatron-hf-tp2")
    good = tmp_path / "good"
    export(real_ckpt("megatron-hf-tp1") / "checkpoints", good, to="hf")
    _no_args(monkeypatch)
    with pytest.raises(ExportError) as e:
        export(root / "checkpoints", tmp_path / "x", to="hf")
    for value in ("num_attention_heads", "num_query_groups", "hidden_act", "rms_norm_eps", "rope_theta", "--config"):
        assert value in str(e.value)
    assert not (tmp_path / "x").exists()
    # the run's HF config.json, given with --config: trusted for what shapes cannot show; the logits match
    cfg = json.loads((good / "config.json").read_text())
    given = tmp_path / "given.json"
    given.write_text(json.dumps({k: v for k, v in cfg.items() if k != "rope_parameters"}))
    res = export(root / "checkpoints", tmp_path / "hf", to="hf", config=given)
    assert any("--config" in n and "trusted" in n for n in res.notes)
    assert _rel(tmp_path / "hf", root) <= TOL
    # a config whose shapes disagree with the tensors: refused before anything is written
    given.write_text(json.dumps({**cfg, "num_key_value_heads": 4}))
    with pytest.raises(ExportError, match=r"layer 0 linear_qkv: \[128, 64\], expected \[192, 64\]"):
        export(root / "checkpoints", tmp_path / "y", to="hf", config=given)
    given.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ("rms_norm_eps", "hidden_act")}))
    with pytest.raises(ExportError, match="lacks hidden_act, rms_norm_eps"):
        export(root / "checkpoints", tmp_path / "y", to="hf", config=given)
    assert not (tmp_path / "y").exists()


def _args(real_ckpt, variant="megatron-hf-tp2"):
    from ckpt_tui.core.formats.dcp.format import megatron_args
    from ckpt_tui.core.report import inspect

    rep = inspect(real_ckpt(variant) / "checkpoints")
    return megatron_args(rep.inventory.root.find("iter_0000010"))


@pytest.mark.parametrize(
    "change, said",
    [
        ({"rotary_interleaved": True}, "rotary_interleaved=True"),
        ({"rotary_percent": 0.5}, "rotary_percent=0.5"),
        ({"normalization": "LayerNorm"}, "normalization='LayerNorm'"),
        ({"num_experts": 8}, "num_experts=8 (mixture of experts)"),
        ({"norm_epsilon": None, "swiglu": None}, "args lack norm_epsilon, swiglu"),
        (
            {"num_attention_heads": 8},
            "linear_qkv: [128, 64], expected [192, 64] (8 heads, 2 query groups, head_dim 16)",
        ),
        ({"ffn_hidden_size": 128}, "intermediate (ffn) size: the configuration says 128, the tensors 96"),
        ({"window_size": [128, 0]}, "window_size=[128, 0] (sliding-window attention)"),
        ({"add_qkv_bias": True}, "linear biases: the configuration says linear_qkv, the tensors none"),
        (
            {"add_bias_linear": True},
            "linear biases: the configuration says linear_qkv, linear_proj, linear_fc1/fc2, the tensors none",
        ),
    ],
)
def test_args_that_are_not_llama_refused(real_ckpt, tmp_path, monkeypatch, change, said):
    args = _args(real_ckpt)
    assert args["swiglu"] is True and args["num_query_groups"] == 2
    _no_args(monkeypatch, {**args, **change})
    with pytest.raises(ExportError) as e:
        export(real_ckpt("megatron-hf-tp2") / "checkpoints", tmp_path / "x", to="hf")
    assert said in str(e.value)
    assert not (tmp_path / "x").exists()


def test_geglu_when_the_run_did_not_say_swiglu(real_ckpt, tmp_path, monkeypatch):
    """megatron-core's gated default is GeLU: without swiglu the config says gelu (and these logits, made with
    SiLU, then miss: the activation comes from the run, never a guess)."""
    root = real_ckpt("megatron-hf-tp2")
    _no_args(monkeypatch, {**_args(real_ckpt), "swiglu": False})
    export(root / "checkpoints", tmp_path / "hf", to="hf")
    assert json.loads((tmp_path / "hf/config.json").read_text())["hidden_act"] == "gelu"
    assert _rel(tmp_path / "hf", root) >= 100 * TOL


def test_non_llama_megatron_refused_saying_what_it_saw(real_ckpt, tmp_path):
    """samples/megatron_dist.py's GPT: LayerNorm, learned absolute positions (its linear biases would be mapped: not
    among what is said)."""
    with pytest.raises(ExportError) as e:
        export(real_ckpt("megatron-dist") / "checkpoints", tmp_path / "x", to="hf")
    msg = str(e.value)
    assert "Llama-family" in msg and "LayerNorm" in msg and "learned absolute position embeddings" in msg
    assert "biases the mapping does not know" not in msg and "without --to hf" in msg


def test_other_frameworks_refused(real_ckpt, tmp_path):
    with pytest.raises(ExportError, match="--to hf reads Megatron-Core torch_dist GPT checkpoints"):
        export(real_ckpt("fsdp2-dcp"), tmp_path / "x", to="hf")


def test_args_lacking_values_give_way_to_config(real_ckpt, tmp_path, monkeypatch):
    """args that lack what --to hf needs: --config then gives it (the refusal asked for it)."""
    root = real_ckpt("megatron-hf-tp2")
    export(real_ckpt("megatron-hf-tp1") / "checkpoints", tmp_path / "good", to="hf")
    _no_args(monkeypatch, {**_args(real_ckpt), "norm_epsilon": None})
    with pytest.raises(to_hf.NeedsConfig, match="lack norm_epsilon"):
        export(root / "checkpoints", tmp_path / "x", to="hf")
    res = export(root / "checkpoints", tmp_path / "hf", to="hf", config=tmp_path / "good")
    assert any("--config" in n and "trusted" in n for n in res.notes)
    assert _rel(tmp_path / "hf", root) <= TOL


def test_the_offer_asks_what_the_export_would(real_ckpt, monkeypatch):
    """inspect's to-hf fact, from the metadata alone: ready with the run's args, config without them, nothing for
    megatron's GPT-style model (LayerNorm, biases) or a shape the args disagree with."""
    from ckpt_tui.core.report import inspect

    def offer(variant):
        rep = inspect(real_ckpt(variant) / "checkpoints")
        return rep.inventory.root.find("iter_0000010").facts.get("to_hf")

    assert offer("megatron-hf-tp2") == offer("megatron-hf-tp2-016") == offer("megatron-hf-pp2") == "ready"
    assert offer("megatron-hf-qkvbias") == offer("megatron-hf-bias") == offer("megatron-hf-pp2-016") == "ready"
    assert offer("megatron-dist") is None
    names = [
        ("embedding.word_embeddings.weight", (256, 64), "float32"),
        ("decoder.final_layernorm.weight", (64,), "float32"),
        ("output_layer.weight", (256, 64), "float32"),
        ("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", (64,), "float32"),
        ("decoder.layers.0.self_attention.linear_qkv.weight", (128, 64), "float32"),
        ("decoder.layers.0.self_attention.linear_proj.weight", (64, 64), "float32"),
        ("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", (64,), "float32"),
        ("decoder.layers.0.mlp.linear_fc1.weight", (192, 64), "float32"),
        ("decoder.layers.0.mlp.linear_fc2.weight", (64, 96), "float32"),
    ]
    assert to_hf.hf_offer(names, megatron=True, args={}, step_dir=None) == "config"
    gpt = [(n, (96, 64) if n.endswith("linear_fc1.weight") else s, d) for n, s, d in names]
    assert to_hf.hf_offer(gpt, megatron=True, args={}, step_dir=None) is None  # not a gated MLP
    args = {**_args(real_ckpt), "hidden_size": 64, "num_layers": 1, "ffn_hidden_size": 96, "num_attention_heads": 8}
    assert to_hf.hf_offer(names, megatron=True, args=args, step_dir=None) is None  # qkv rows disagree
    args["num_attention_heads"] = 4
    assert to_hf.hf_offer(names, megatron=True, args=args, step_dir=None) == "ready"


# ---------------------------------------------------------------- the worked example of docs/export.md


@pytest.mark.parametrize(
    "doc_file,heading",
    [("docs/export.md", "## To a Hugging Face model"), ("README.md", "#### Megatron-Core → Hugging Face")],
)
def test_the_worked_example_runs_as_written(real_ckpt, tmp_path, doc_file, heading):
    v = run_worked_example(heading, real_ckpt("megatron-hf-tp2"), tmp_path, doc_file=doc_file)
    assert _rel(v / "hf", v) <= TOL  # the folder it wrote: megatron's logits


def test_stacked_layers_read_once_as_the_plain_export_reads_them(real_ckpt, tmp_path, monkeypatch):
    """TP=2 splits linear_proj and linear_fc2 along their inputs: no byte ranges, so torch's DCP loader reads each
    stacked tensor (every layer) whole, kept for its layers in turn. --to hf writes role by role, as the plain export
    writes key by key: the same number of whole-stack reads (layer by layer it was one per layer and role)."""
    from ckpt_tui.core.formats.dcp import source as dcp_source

    calls: list[str] = []
    real = dcp_source.load_one

    def counted(folder, key, *a, **k):
        calls.append(key)
        return real(folder, key, *a, **k)

    monkeypatch.setattr(dcp_source, "load_one", counted)
    src = real_ckpt("megatron-hf-tp2") / "checkpoints"
    export(src, tmp_path / "plain")
    plain = list(calls)
    calls.clear()
    export(src, tmp_path / "hf", to="hf")
    assert plain and sorted(calls) == sorted(plain), (calls, plain)


# ---------------------------------------------------------------- generation_config.json


def test_generation_config_copied_from_beside_the_run_or_configs_folder(real_ckpt_copy, tmp_path):
    """A generation_config.json in the run folder (above checkpoints/iter_N/) is copied as it is; one in --config's
    folder comes first; one that is no JSON is said, never copied; none anywhere: none written."""
    v = real_ckpt_copy("megatron-hf-tp1")
    res = export(v / "checkpoints", tmp_path / "none", to="hf")
    assert not (tmp_path / "none/generation_config.json").exists()
    run_gen = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.7}
    (v / "generation_config.json").write_text(json.dumps(run_gen))
    res = export(v / "checkpoints", tmp_path / "run", to="hf")
    assert json.loads((tmp_path / "run/generation_config.json").read_text()) == run_gen
    assert any(n.startswith("generation_config.json copied from") for n in res.notes), res.notes
    assert transformers.GenerationConfig.from_pretrained(tmp_path / "run").temperature == 0.7
    # --config's folder first (its config.json the one the run's args agree with)
    given = tmp_path / "given"
    given.mkdir()
    shutil.copy(tmp_path / "run/config.json", given / "config.json")
    (given / "generation_config.json").write_text(json.dumps({**run_gen, "temperature": 0.2}))
    export(v / "checkpoints", tmp_path / "cfg", to="hf", config=given / "config.json")
    assert json.loads((tmp_path / "cfg/generation_config.json").read_text())["temperature"] == 0.2
    # broken: said, not copied
    (v / "generation_config.json").write_text("{not json")
    res = export(v / "checkpoints", tmp_path / "bad", to="hf")
    assert not (tmp_path / "bad/generation_config.json").exists()
    assert any("generation_config.json" in n and "not copied" in n for n in res.notes), res.notes
