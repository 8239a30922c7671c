"""A Trainer checkpoint's config.json is someone's file: the Trainer-order naming of optimizer.pt
(torch_save/trainer_order.py) reads it bounded, follows no link, runs no code it names, builds nothing beyond a
model's size, and quotes it escaped; each refusal keeps param_<i> and says why."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ckpt_tui.core.adapters.config import parse_lora_config
from ckpt_tui.core.formats.torch_save.optim import torch_optimizer_source
from ckpt_tui.core.formats.torch_save.trainer_order import MAX_CONFIG_BYTES, trainer_param_order
from ckpt_tui.samples._common import TINY_LLAMA

ESC = "\x1b]0;pwned\x07\x1b[2J"
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **TINY_LLAMA}


def _order(tmp_path: Path, doc, **kw):
    p = tmp_path / "config.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return trainer_param_order(p, weight_decay=0.01, **kw)


@pytest.fixture
def no_build(monkeypatch):
    """Fail the test if a model were built: a refusal comes before transformers builds anything."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", boom)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "_from_config", boom)


def test_the_tiny_llama_itself_is_built(tmp_path):
    """The config the refusals below start from does give an order (so each refusal is its edit's)."""
    order = _order(tmp_path, LLAMA)
    assert order.why_not is None and order.groups[0][0] == "model.embed_tokens.weight"


def test_an_oversized_config_is_not_read(tmp_path):
    doc = json.dumps(LLAMA)
    order = _order(tmp_path, doc + " " * (MAX_CONFIG_BYTES - len(doc) + 1))
    assert order.why_not is not None and "larger than a model config can be" in order.why_not


@pytest.mark.parametrize(
    "edit,word",
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"text_config": {"num_hidden_layers": 10**9}}, "num_hidden_layers"),
        ({"num_local_experts": 10**6}, "num_local_experts"),
        ({"num_hidden_layers": 1000, "num_experts": 1000}, "experts are more modules"),
    ],
)
def test_huge_layer_and_expert_counts_are_refused_before_building(tmp_path, no_build, edit, word):
    order = _order(tmp_path, {**LLAMA, **edit})
    assert order.why_not is not None and word in order.why_not and order.groups == []


@pytest.mark.parametrize(
    "raw,word",
    [
        ("\xff\xfe not json", "not valid JSON"),
        ('{"model_type": "llama",', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ("[" * 200_000 + "]" * 200_000, "not valid JSON"),  # deeper than the JSON reader recurses
        ('{"a":' * 40 + "1" + "}" * 40, "nests deeper"),
    ],
)
def test_what_is_not_a_json_object_is_refused(tmp_path, raw, word):
    p = tmp_path / "config.json"
    p.write_bytes(raw.encode("latin-1") if raw.startswith("\xff") else raw.encode())
    order = trainer_param_order(p, weight_decay=0.0)
    assert order.why_not is not None and word in order.why_not


def test_a_symlinked_config_is_not_followed(tmp_path):
    real = tmp_path / "elsewhere" / "config.json"
    real.parent.mkdir()
    real.write_text(json.dumps(LLAMA))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").symlink_to(real)
    order = trainer_param_order(ck / "config.json", weight_decay=0.01)
    assert order.why_not is not None and "symbolic link; not followed" in order.why_not
    # a Hugging Face cache's snapshot -> blob link is followed inside its repo folder only
    assert trainer_param_order(ck / "config.json", weight_decay=0.01, link_root=ck).why_not is not None
    assert trainer_param_order(ck / "config.json", weight_decay=0.01, link_root=tmp_path).why_not is None


def test_auto_map_anywhere_is_refused_and_imports_nothing(tmp_path, no_build):
    (tmp_path / "evil_cfg.py").write_text("raise SystemExit('imported')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        for doc in (
            {**LLAMA, "auto_map": {"AutoConfig": "evil_cfg.C"}},
            {**LLAMA, "text_config": {"auto_map": {"AutoModel": "evil_cfg.M"}}},
        ):
            order = _order(tmp_path, doc)
            assert order.why_not is not None and "auto_map" in order.why_not
        assert "evil_cfg" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize(
    "edit,word",
    [
        ({"model_type": "evil" + ESC}, "is not a model transformers"),
        ({"model_type": 7}, "no `model_type`"),
        ({"architectures": ["Trainer"]}, "not a llama class"),
        ({"architectures": ["os.system" + ESC]}, "not a llama class"),
        ({"architectures": "LlamaForCausalLM"}, "not a list of class names"),
        ({"hidden_size": "wide" + ESC}, "cannot build the model"),
    ],
)
def test_what_transformers_does_not_have_is_refused_escaped(tmp_path, no_build, edit, word):
    order = _order(tmp_path, {**LLAMA, **edit})
    assert order.why_not is not None and word in order.why_not
    assert "\x1b" not in order.why_not and "\x07" not in order.why_not


def test_a_config_transformers_refuses_is_said(tmp_path):
    order = _order(tmp_path, {**LLAMA, "num_attention_heads": 3})  # 64 is not divisible by 3
    assert order.why_not is not None and "cannot build the model" in order.why_not


@pytest.mark.parametrize(
    "lora,word",
    [
        ({"target_modules": "(" + "a" * 2000 + ")"}, "regular expression of"),
        ({"target_modules": "([unclosed"}, "is not a regular expression"),
        ({"target_modules": ["nothing_here"]}, "no module of the model matches"),
        ({"target_modules": ["self_attn"]}, "is not a Linear, Conv1D or Embedding"),
        ({"target_modules": ["q_proj"], "use_dora": True}, "use_dora"),
        ({"target_modules": ["q_proj"], "layers_to_transform": "all"}, "layers_to_transform"),
        ({"target_modules": ["q_proj"], "modules_to_save": ["q_proj.lora_A"]}, "LoRA layer"),
        ({"target_modules": ["embed_tokens"], "lora_bias": True}, "lora_bias on an Embedding"),
    ],
)
def test_an_adapter_config_that_cannot_be_emulated_is_refused(tmp_path, lora, word):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA))
    cfg = parse_lora_config({"peft_type": "LORA", "r": 4, "lora_alpha": 8, **lora})
    order = trainer_param_order(p, adapter_config=cfg, weight_decay=0.01)
    assert order.why_not is not None and word in order.why_not, order.why_not


def test_a_hostile_config_in_a_checkpoint_keeps_param_i_and_says_why(real_ckpt_copy):
    ck = real_ckpt_copy("full-gpt2-optim") / "run" / "checkpoint-2"
    doc = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**doc, "n_layer": 10**9, "model_type": "gpt2" + ESC}))
    src, _ = torch_optimizer_source(ck / "optimizer.pt", None)
    notes = "\n".join(src.notes)
    assert all(t.name.startswith("param_") for t in src.tensors)
    assert "the HF Trainer's parameter order was not used: config.json: `n_layer` is 1000000000" in notes
    (ck / "config.json").unlink()
    os.symlink(ck / "model.safetensors", ck / "config.json")
    src, _ = torch_optimizer_source(ck / "optimizer.pt", None)
    assert "config.json is a symbolic link; not followed" in "\n".join(src.notes)
