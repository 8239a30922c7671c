"""LoRA tensor names as ckpt_tui maps them, against PEFT itself: for PeftModels built here (a tiny Llama and a
tiny GPT-2, LoRA on Linear, Conv1D, Embedding, with lora_bias, modules_to_save, rank_pattern, DoRA), the names
each container holds map to exactly the keys ``get_peft_model_state_dict`` gives -- the keys of
``adapter_model.safetensors``.

The containers, as their producers write them: the file ``save_pretrained`` writes; a live model's state dict;
a DeepSpeed tag's ``module`` (``DeepSpeedEngine.module_state_dict(exclude_frozen_parameters=True)``: the state
dict less the frozen parameters -- a tied frozen weight stays); the same under DDP's ``module.``; and an FSDP2
DCP folder written by Accelerate's ``save_fsdp_model(adapter_only=True)``, the call the Trainer makes, in a
subprocess on a one-rank gloo group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from ckpt_tui.core.adapters.names import ROOT, base_name, lora_layout

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")


def _llama():
    from ckpt_tui.samples._common import TINY_LLAMA  # the fixtures' model: non-square MLP, 2 layers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=32)
    cfg.bos_token_id = cfg.eos_token_id = 0
    return transformers.GPT2LMHeadModel(cfg)


CASES = {
    "linear": (_llama, dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),
    "rank_pattern": (
        _llama,
        dict(
            r=4,
            target_modules=["q_proj", "k_proj", "up_proj", "down_proj"],
            rank_pattern={"k_proj": 2, "layers.1.mlp.up_proj": 8},
        ),
    ),
    "embedding": (_llama, dict(r=4, target_modules=["embed_tokens", "q_proj"])),
    "lora_bias": (_llama, dict(r=4, target_modules=["q_proj", "down_proj"], lora_bias=True)),
    "modules_to_save": (_llama, dict(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])),
    "dora": (_llama, dict(r=4, target_modules=["q_proj", "v_proj"], use_dora=True)),
    "gpt2": (_gpt2, dict(r=4, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)),
    "gpt2_wte": (_gpt2, dict(r=4, target_modules=["wte", "c_attn"], fan_in_fan_out=True)),
}


def _peft_model(case):
    make, kw = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(make(), peft.LoraConfig(**kw))


def _shapes(sd):
    return {k: tuple(v.shape) for k, v in sd.items()}


def _peft_keys(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(peft.get_peft_model_state_dict(model))


def _deepspeed_module(model):
    """What DeepSpeedEngine.module_state_dict(exclude_frozen_parameters=True) keeps (deepspeed/runtime/engine.py)."""
    sd = model.state_dict()
    for n, p in model.named_parameters():
        if not p.requires_grad and n in sd:
            del sd[n]
    return sd


def _lora_layers(model):
    return {n.removeprefix(ROOT): m for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}


def _check_modules(layout, model, *, ordered=True):
    layers = _lora_layers(model)
    got = [m.module for m in layout.modules]
    assert (got if ordered else sorted(got)) == (list(layers) if ordered else sorted(layers))  # every LoRA layer
    for m in layout.modules:
        layer = layers[m.module]
        assert m.rank == layer.r["default"], m.module
        assert m.embedding == (m.module in {n for n, x in layers.items() if x.lora_embedding_A})
        assert (m.b_bias is not None) == bool(layer.lora_bias["default"])
    assert layout.targets() == sorted({n.rpartition(".")[2] for n in layers})
    assert layout.problems == []


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    return request.param, _peft_model(request.param)


def test_the_file_save_pretrained_writes_maps_to_itself(case, tmp_path):
    name, model = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    with safetensors.safe_open(str(tmp_path / "adapter_model.safetensors"), "np") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    layout = lora_layout(shapes)
    assert layout is not None and layout.container == "peft" and not layout.adapter_named
    assert sorted(shapes) == _peft_keys(model)
    assert layout.saved == {k: k for k in shapes}
    assert layout.others == 0 and layout.dropped == [] and layout.from_base() == {}
    assert layout.params() == sum(p.numel() for p in peft.get_peft_model_state_dict(model).values())
    _check_modules(layout, model, ordered=False)  # the file holds its names sorted


def test_a_live_state_dict_maps_to_peft_s_keys(case):
    name, model = case
    sd = model.state_dict()
    layout = lora_layout(_shapes(sd))
    assert layout is not None and layout.container == "live" and layout.adapter_named
    assert sorted(layout.saved.values()) == _peft_keys(model)  # exactly, embedding base layers included
    assert layout.from_base() == {}
    kept = set(layout.saved) | set(layout.dropped)
    assert layout.others == len(set(sd) - kept) > 0  # the base weights, counted, not exported
    assert all(".original_module." in n for n in layout.dropped)
    _check_modules(layout, model)


@pytest.mark.parametrize("prefix", ["", "module."])
def test_a_deepspeed_tag_s_trainable_tensors_map_to_peft_s_keys(case, prefix):
    name, model = case
    sd = {prefix + k: v for k, v in _shapes(_deepspeed_module(model)).items()}
    layout = lora_layout(sd, container="deepspeed")
    assert layout is not None and layout.container == "deepspeed" and layout.prefix == prefix
    # the embedding's frozen base layer PEFT saves beside a LoRA on it is not in the tag: named, from the base
    assert sorted([*layout.saved.values(), *layout.from_base()]) == _peft_keys(model)
    for saved, base in layout.from_base().items():
        assert saved.endswith(".base_layer.weight") and base == base_name(saved)
        assert base in CASES[name][0]().state_dict()  # a tensor of the plain base model
    # a tied frozen weight (GPT-2's lm_head) survives exclude_frozen_parameters: it counts as not adapter
    assert layout.others == len(set(sd) - set(layout.saved))
    _check_modules(layout, model)


def test_the_mappings_as_written():
    """The forms, spelt out (each also proven by the PEFT oracle tests above)."""
    cases = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        ),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight": (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
        ),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.bias": (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias"
        ),
        "base_model.model.model.embed_tokens.lora_embedding_A.default": (
            "base_model.model.model.embed_tokens.lora_embedding_A"
        ),
        "base_model.model.model.embed_tokens.lora_embedding_B.default": (
            "base_model.model.model.embed_tokens.lora_embedding_B"
        ),
        "base_model.model.lm_head.modules_to_save.default.weight": "base_model.model.lm_head.weight",
    }
    shapes = {k: (8, 4) if "lora_B" in k or "embedding_B" in k else (4, 8) if "lora_" in k else (16, 8) for k in cases}
    shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.bias"] = (8,)
    shapes["base_model.model.lm_head.original_module.weight"] = (16, 8)
    layout = lora_layout(shapes)
    assert layout is not None
    assert layout.saved == cases
    assert layout.dropped == ["base_model.model.lm_head.original_module.weight"]
    assert layout.modules_to_save == {"lm_head.weight": "base_model.model.lm_head.weight"}
    assert layout.from_base() == {"base_model.model.model.embed_tokens.base_layer.weight": "model.embed_tokens.weight"}
    assert base_name("base_model.model.lm_head.weight") == "lm_head.weight"


def test_peft_s_file_of_a_run_that_added_tokens_keeps_the_wrappers_copies_unmerged():
    """PEFT 0.21's save_embedding_layers on a resized embedding that is also in modules_to_save writes the
    wrapper's own tensors beside the modules_to_save one (what samples/hf_peft.py's peft-llama-resized holds)."""
    mts = ["base_model.model.model.embed_tokens", "base_model.model.lm_head"]
    shapes = {f"{m}{s}.weight": (264, 64) for m in mts for s in ("", ".modules_to_save", ".original_module")}
    shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] = (4, 64)
    shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"] = (64, 4)
    layout = lora_layout(shapes)
    assert layout is not None and layout.problems == [] and layout.dropped == []
    assert layout.saved == {k: k for k in shapes}  # the adapter export writes the file's keys, all of them
    assert layout.modules_to_save == {
        "model.embed_tokens.weight": mts[0] + ".weight",
        "lm_head.weight": mts[1] + ".weight",
    }
    assert sorted(layout.wrapper_copies) == sorted(
        k for k in shapes if ".original_module." in k or ".modules_to_save." in k
    )
    assert layout.params() == 2 * 264 * 64 + 2 * 4 * 64  # the copies are not the adapter's own parameters
    # a copy of a module the file does not save, and a live model's wrapper: not the adapter's
    del shapes[mts[1] + ".weight"]
    layout = lora_layout(shapes)
    assert layout is not None and sorted(layout.dropped) == [
        mts[1] + ".modules_to_save.weight",
        mts[1] + ".original_module.weight",
    ]
    live = {
        "base_model.model.lm_head.modules_to_save.default.weight": (8, 4),
        "base_model.model.lm_head.original_module.weight": (8, 4),
    }
    layout = lora_layout(live)
    assert (
        layout is not None
        and layout.wrapper_copies == []
        and layout.dropped == ["base_model.model.lm_head.original_module.weight"]
    )


def test_target_modules_decide_the_embedding_base_layer_as_peft_does():
    shapes = {
        "base_model.model.model.embed_tokens.lora_embedding_A.default": (4, 256),
        "base_model.model.model.embed_tokens.lora_embedding_B.default": (64, 4),
    }
    listed = lora_layout(shapes, target_modules=["embed_tokens"])
    by_path = lora_layout(shapes, target_modules=["model.embed_tokens"])  # PEFT's `k in target_modules`: no
    regex = lora_layout(shapes, target_modules=r".*embed_tokens")
    assert listed and by_path and regex
    assert (
        list(listed.from_base()) == list(regex.from_base()) == ["base_model.model.model.embed_tokens.base_layer.weight"]
    )
    assert by_path.from_base() == {}

    model = peft.get_peft_model(_llama(), peft.LoraConfig(r=4, target_modules=["model.embed_tokens"]))
    assert sorted([*by_path.saved.values(), *by_path.from_base()]) == _peft_keys(model)


def test_another_adapter_s_tensors_are_dropped_and_named():
    model = _peft_model("linear")
    model.add_adapter("other", peft.LoraConfig(r=2, target_modules=["q_proj"]))
    layout = lora_layout(_shapes(model.state_dict()))
    assert layout is not None
    assert sorted(layout.saved.values()) == _peft_keys(model)  # the default adapter, as PEFT saves it
    assert any(".lora_A.other." in n for n in layout.dropped)
    assert len(layout.problems) == 1 and "`other`" in layout.problems[0] and "`default`" in layout.problems[0]

    only = peft.get_peft_model(_llama(), peft.LoraConfig(r=2, target_modules=["q_proj"]), adapter_name="mine")
    layout = lora_layout(_shapes(_deepspeed_module(only)))
    assert layout is not None and layout.modules == [] and layout.saved == {}
    assert "`mine`" in layout.problems[0]


def test_a_whole_model_in_peft_s_names_counts_its_base_weights_as_others():
    model = _peft_model("modules_to_save")
    sd = model.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = peft.get_peft_model_state_dict(model)
    # saved-form adapter names beside every base weight under its live name (a merged-by-hand state dict)
    shapes = {k: tuple(v.shape) for k, v in adapter.items() if "lora_" in k}
    shapes.update({k: tuple(v.shape) for k, v in sd.items() if "lora_" not in k and "modules_to_save" not in k})
    layout = lora_layout(shapes)
    assert layout is not None and layout.modules_to_save == {}
    assert layout.others == len(shapes) - len(layout.saved) - len(layout.dropped) > 0


def test_unpaired_and_disagreeing_tensors_are_problems():
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    v = "base_model.model.model.layers.0.self_attn.v_proj"
    k = "base_model.model.model.layers.0.self_attn.k_proj"
    shapes = {
        f"{q}.lora_A.default.weight": (4, 64),
        f"{q}.lora_B.default.weight": (64, 4),
        f"{v}.lora_A.default.weight": (4, 64),  # no B
        f"{k}.lora_A.default.weight": (4, 64),
        f"{k}.lora_B.default.weight": (64, 2),  # r 4 against 2
    }
    layout = lora_layout(shapes)
    assert layout is not None
    assert [m.module for m in layout.modules] == ["model.layers.0.self_attn.q_proj"]
    assert layout.modules[0].rank == 4
    assert len(layout.problems) == 2
    assert "v_proj` has no lora_B" in layout.problems[0]
    assert "k_proj" in layout.problems[1] and "rank" in layout.problems[1]
    assert sorted(layout.dropped) == sorted(
        [f"{v}.lora_A.default.weight", f"{k}.lora_A.default.weight", f"{k}.lora_B.default.weight"]
    )


def test_names_that_are_not_lora_give_none():
    assert lora_layout({}) is None
    assert lora_layout({"model.layers.0.self_attn.q_proj.weight": (64, 64), "lm_head.weight": (256, 64)}) is None
    assert lora_layout({"base_model.model.model.norm.weight": (64,)}) is None  # a PeftModel's name, no adapter


FSDP2_SAVE = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, transformers, peft
    from accelerate import FullyShardedDataParallelPlugin, PartialState
    from accelerate.utils import save_fsdp_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from ckpt_tui.samples._common import TINY_LLAMA

    out = sys.argv[1]
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=0, world_size=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "down_proj"], modules_to_save=["lm_head"]))
    expected = sorted(peft.get_peft_model_state_dict(model))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    PartialState(cpu=True)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT", cpu_ram_efficient_loading=False)

    class Acc:
        process_index, num_processes = 0, 1

    save_fsdp_model(plugin, Acc(), model, out, adapter_only=True)  # what Trainer._save_optimizer_and_scheduler calls
    dist.destroy_process_group()
    print(json.dumps(expected))
    """
)


def test_an_fsdp2_dcp_folder_the_trainer_s_call_writes(tmp_path):
    from ckpt_tui.core.formats.dcp.reader import read

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-c", FSDP2_SAVE, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    expected = json.loads(r.stdout.strip().splitlines()[-1])
    info = read(tmp_path / "pytorch_model_fsdp_0")
    shapes = {t.name: tuple(t.shape) for t in info.tensors}
    assert all(k.startswith("model." + ROOT) for k in shapes)  # PEFT's saved names under DCP's `model.`
    layout = lora_layout(shapes)
    assert layout is not None and layout.container == "dcp" and layout.prefix == "model."
    assert not layout.adapter_named  # get_peft_model_state_dict ran before the save: no `.default`
    assert sorted(layout.saved.values()) == expected
    assert layout.modules_to_save == {"lm_head.weight": "base_model.model.lm_head.weight"}
    assert layout.targets() == ["down_proj", "q_proj"] and layout.problems == [] and layout.others == 0
