"""``export --to hf`` of Megatron-Core torch_dist checkpoints, proven by logits: samples/megatron_hf.py saves a tiny
Llama-family GPTModel (RMSNorm with distinct weights, SwiGLU, rotary halves, GQA 4 heads / 2 groups) at TP=1 and
TP=2 (megatron-core 0.19 and 0.16) and a tied one, and records megatron's own fp32 logits on a fixed 2 x 40 batch
after ``dist_checkpointing.load``. transformers' LlamaForCausalLM loads the export and must give the same logits
(max |Δ| <= 1e-4 * max |logit|; measured about 7e-7 of it); each mutation (q/k/v split wrong, gate and up swapped,
two norms swapped, the wrong activation) must miss by >= 100x the tolerance."""

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
VARIANTS = ["megatron-hf-tp1", "megatron-hf-tp2", "megatron-hf-tied", "megatron-hf-pp2", "megatron-hf-tp2-016"]


def _logits(folder, ids):
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def _oracle(root):
    o = torch.load(root / "oracle/logits.pt", weights_only=True)
    return o["ids"], o["logits"]


def _rel(folder, root) -> float:
    ids, ref = _oracle(root)
    return ((_logits(folder, ids) - ref).abs().max() / ref.abs().max()).item()


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


def _args(real_ckpt):
    from ckpt_tui.core.formats.dcp.format import megatron_args
    from ckpt_tui.core.report import inspect

    rep = inspect(real_ckpt("megatron-hf-tp2") / "checkpoints")
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
    """samples/megatron_dist.py's GPT: LayerNorm, learned absolute positions, biases."""
    with pytest.raises(ExportError) as e:
        export(real_ckpt("megatron-dist") / "checkpoints", tmp_path / "x", to="hf")
    msg = str(e.value)
    assert "Llama-family" in msg and "LayerNorm" in msg and "learned absolute position embeddings" in msg
    assert "linear biases" in msg and "without --to hf" in msg


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


def test_the_worked_example_runs_as_written(real_ckpt, tmp_path):
    v = run_worked_example("## To a Hugging Face model", real_ckpt("megatron-hf-tp2"), tmp_path)
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
