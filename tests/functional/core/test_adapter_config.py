"""adapter_config.json as ckpt_tui reads it, against PEFT itself: the scaling of every LoRA layer of a model
PEFT built from the same config, and the refusals of what a plain merge does not cover."""

from __future__ import annotations

import json

import pytest

from ckpt_tui.core.adapters.config import AdapterConfigError, parse_lora_config, read_lora_config

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def _tiny_llama():
    from ckpt_tui.samples._common import TINY_LLAMA  # the fixtures' model: non-square MLP, 2 layers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))


@pytest.mark.parametrize(
    "kw",
    [
        dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "down_proj"]),
        dict(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "k_proj", "up_proj"],
            rank_pattern={"k_proj": 2, "layers.1.mlp.up_proj": 8},
            alpha_pattern={"q_proj": 3, "up_proj": 5},
        ),
    ],
)
def test_the_scaling_of_every_layer_is_peft_s(tmp_path, kw):
    model = peft.get_peft_model(_tiny_llama(), peft.LoraConfig(**kw))
    model.save_pretrained(tmp_path)
    cfg = read_lora_config(tmp_path / "adapter_config.json")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert layers
    for name, layer in layers.items():
        module = name.removeprefix("base_model.model.")
        assert cfg.rank(module) == layer.r["default"], name
        assert cfg.scale(module) == layer.scaling["default"], name  # the same Python float, bit for bit
    assert cfg.unsupported_for_merge() == []


def test_variants_a_plain_merge_does_not_cover_are_named(tmp_path):
    model = peft.get_peft_model(_tiny_llama(), peft.LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    model.save_pretrained(tmp_path)
    assert read_lora_config(tmp_path / "adapter_config.json").unsupported_for_merge() == ["use_dora"]


@pytest.mark.parametrize(
    "doc, says",
    [
        ([], "not a JSON object"),
        ({"peft_type": "IA3", "r": 4}, "only LoRA"),
        ({"r": 0}, "`r`"),
        ({"r": True}, "`r`"),
        ({"r": 4, "target_modules": [1]}, "target_modules"),
        ({"r": 4, "rank_pattern": {"(": 2}}, "regular expression"),
        ({"r": 4, "alpha_pattern": {"q": "8"}}, "alpha_pattern"),
        ({"r": 4, "bias": "all"}, "bias"),
    ],
)
def test_a_hostile_or_careless_config_is_refused_with_the_reason(doc, says):
    with pytest.raises(AdapterConfigError, match=says):
        parse_lora_config(doc)


def test_a_symlinked_oversized_or_corrupt_config_is_not_read(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"r": 4}))
    link = tmp_path / "adapter_config.json"
    link.symlink_to(real)
    with pytest.raises(AdapterConfigError, match="symbolic link"):
        read_lora_config(link)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((4 << 20) + 1))
    with pytest.raises(AdapterConfigError, match="larger"):
        read_lora_config(big)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"r": 4')
    with pytest.raises(AdapterConfigError, match="not valid JSON"):
        read_lora_config(bad)
