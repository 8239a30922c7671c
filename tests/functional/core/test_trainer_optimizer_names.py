"""`ckpt-tui export CKPT --component optimizer` of an HF Trainer checkpoint's `optimizer.pt` names the state in
the Trainer's own order (torch_save/trainer_order.py): the oracle is the live Trainer's index -> name map the
fixture recorded (oracle/optimizer_names.json), PEFT itself for the adapter names, and torch.load of
optimizer.pt for every value, bit for bit. A config that disagrees with the run keeps param_<i> and says which
check failed; a config with `auto_map` runs no code from its folder."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.adapters.config import parse_lora_config
from ckpt_tui.core.formats.torch_save.optim import torch_optimizer_source, trainer_run_order
from ckpt_tui.core.formats.torch_save.trainer_order import check_against, trainer_param_order
from tests.util import ckpt_tui, load_optimizer_export

FULL = ["full-gpt2-optim", "full-llama-bias-optim"]
PEFT = ["peft-llama", "peft-llama-bias-bf16", "peft-gpt2-rslora", "peft-llama-resized", "peft-ddp-mts"]
RESIZED = {"peft-llama-resized": 264}  # the run added tokens before wrapping its base
CKPT = Path("run") / "checkpoint-2"


def _oracle(d: Path) -> dict:
    return json.loads((d / "oracle" / "optimizer_names.json").read_text())


def _ref(ck: Path) -> dict:
    return torch.load(ck / "optimizer.pt", weights_only=True)


def _bits(t: torch.Tensor) -> bytes:
    return (
        t.contiguous().view(torch.uint8).numpy().tobytes()
        if t.dim()
        else t.reshape(1).view(torch.uint8).numpy().tobytes()
    )


def _peft_saved_names(d: Path) -> dict[str, str]:
    """live parameter name -> PEFT's saved name, as PEFT itself gives them: the checkpoint loaded trainable on its
    base, each trainable parameter found by storage in get_peft_model_state_dict."""
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(d / "base-model")
    if d.name in RESIZED:
        base.resize_token_embeddings(RESIZED[d.name])
    pm = PeftModel.from_pretrained(base, d / CKPT, is_trainable=True)
    with contextlib.chdir(d):  # base_model_name_or_path "base-model" is local there (else PEFT asks the Hub)
        sd = get_peft_model_state_dict(pm)
    # a run that added tokens: PEFT also saves the wrappers' own copies (`lm_head.modules_to_save.weight`, one
    # storage with `lm_head.weight`); the name PEFT loads a parameter from is the one without the wrapper part
    copies = (".modules_to_save.", ".original_module.")
    by_ptr = {t.data_ptr(): k for k, t in sd.items() if not any(c in k for c in copies)}
    return {n: by_ptr[p.data_ptr()] for n, p in pm.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", FULL + PEFT)
def test_the_order_is_the_live_trainers(name, real_ckpt, monkeypatch):
    d = real_ckpt(name)
    monkeypatch.chdir(d.parent)  # the base is found from the checkpoint's run, not the cwd
    ref = _ref(d / CKPT)
    order = trainer_run_order(d / CKPT / "optimizer.pt", ref["param_groups"][0]["weight_decay"])
    assert order is not None and order.why_not is None
    oracle = _oracle(d)
    assert order.groups == [g["params"] for g in oracle["groups"]]
    assert order.weight_decay == [g["weight_decay"] for g in oracle["groups"]] == [0.01, 0.0]
    sizes = [len(g["params"]) for g in ref["param_groups"]]
    shapes = {i: tuple(s["exp_avg"].shape) for i, s in ref["state"].items()}
    assert check_against(order, sizes, [g["weight_decay"] for g in ref["param_groups"]], shapes, order.shapes) is None


def test_the_split_is_by_module_type_too(real_ckpt):
    """GPT-2's ln_1 is a LayerNorm no name pattern names: no-decay by its type. The order is not the model's."""
    order = _oracle(real_ckpt("full-gpt2-optim"))["groups"]
    assert (
        "transformer.h.0.ln_1.weight" in order[1]["params"]
        and "transformer.h.0.attn.c_attn.weight" in order[0]["params"]
    )
    llama = _oracle(real_ckpt("full-llama-bias-optim"))["groups"]
    assert "model.layers.0.self_attn.q_proj.bias" in llama[1]["params"]  # a bias between two decay weights
    assert "model.layers.0.self_attn.k_proj.weight" in llama[0]["params"]


def _expected_names(name: str, d: Path) -> list[str]:
    flat = [n for g in _oracle(d)["groups"] for n in g["params"]]
    if name in FULL:
        return flat
    saved = _peft_saved_names(d)
    return [saved[n] for n in flat]


@pytest.mark.parametrize("name", FULL + PEFT)
def test_export_is_named_as_the_trainer_and_bit_exact(name, real_ckpt, tmp_path):
    d = real_ckpt(name)
    out = tmp_path / "out"
    r = ckpt_tui("export", str(d / CKPT), "--component", "optimizer", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "named in the HF Trainer's order" in r.stdout + r.stderr
    names = _expected_names(name, d)
    ref = _ref(d / CKPT)
    want = {f"{names[i]}.{leaf}": t for i, st in ref["state"].items() for leaf, t in st.items() if leaf != "step"}
    sd = load_optimizer_export(out)
    assert sorted(sd) == sorted(want)
    for k, t in want.items():
        assert sd[k].dtype == t.dtype and sd[k].shape == t.shape and _bits(sd[k]) == _bits(t), k
    cfg = json.loads((out / "optimizer_config.json").read_text())
    per_group = [[names[i] for i in g["params"]] for g in ref["param_groups"]]
    assert [g["params"] for g in cfg["param_groups"]] == per_group
    assert [g["weight_decay"] for g in cfg["param_groups"]] == [g["weight_decay"] for g in ref["param_groups"]]
    if name in PEFT:
        from safetensors import safe_open

        with safe_open(d / "oracle" / "adapter_state.safetensors", "pt") as f:
            assert set(names) <= set(f.keys())  # PEFT's own saved names of the run


# -- a checkpoint that disagrees with its config keeps param_<i> and says which check failed --------------------


def _names_and_notes(opt: Path) -> tuple[set[str], str]:
    src, _ = torch_optimizer_source(opt, None)
    return {t.name.rsplit(".", 1)[0] for t in src.tensors}, "\n".join(src.notes)


def _edit_json(p: Path, **changes) -> None:
    doc = json.loads(p.read_text())
    doc.update(changes)
    p.write_text(json.dumps(doc))


def _unnamed(names: set[str], n: int) -> bool:
    return names == {f"param_{i}" for i in range(n)}


def test_a_layer_removed_from_config_json_disagrees_in_group_size(real_ckpt_copy):
    ck = real_ckpt_copy("full-gpt2-optim") / CKPT
    _edit_json(ck / "config.json", n_layer=1)
    names, notes = _names_and_notes(ck / "optimizer.pt")
    assert _unnamed(names, 28)
    assert "the HF Trainer's parameter order was not used: param group 0 holds 10 parameters" in notes
    assert "decay group of this model 6" in notes


def test_a_narrower_model_has_equal_counts_and_disagrees_in_shape(real_ckpt_copy):
    ck = real_ckpt_copy("full-gpt2-optim") / CKPT
    _edit_json(ck / "config.json", n_embd=32)
    names, notes = _names_and_notes(ck / "optimizer.pt")
    assert _unnamed(names, 28)
    assert (
        "the state of index 0 has shape (256, 64), the Trainer's parameter 0 (transformer.wte.weight) (256, 32)"
        in notes
    )


def test_weight_decay_groups_that_disagree_are_refused(real_ckpt_copy):
    ck = real_ckpt_copy("full-llama-bias-optim") / CKPT
    sd = _ref(ck)
    sd["param_groups"][1]["weight_decay"] = 0.1
    torch.save(sd, ck / "optimizer.pt")
    names, notes = _names_and_notes(ck / "optimizer.pt")
    assert names and all(n.startswith("param_") for n in names)
    assert "param group 1 has weight_decay 0.1, the Trainer's no-decay group 0.0" in notes


def test_other_targets_of_equal_shape_are_caught_by_the_saved_adapter(real_ckpt_copy, monkeypatch):
    """k_proj and v_proj are alike in shape: an adapter_config.json naming the wrong ones agrees in every count
    and shape, and is refused because adapter_model.safetensors holds other names. Never by shape alone."""
    d = real_ckpt_copy("peft-llama")
    monkeypatch.chdir(d)
    _edit_json(d / CKPT / "adapter_config.json", target_modules=["q_proj", "k_proj"])
    names, notes = _names_and_notes(d / CKPT / "optimizer.pt")
    assert _unnamed(names, 8)
    assert "adapter_model.safetensors holds no base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight" in notes


def test_an_adapter_whose_base_is_not_found_is_unnamed_and_says_so(real_ckpt_copy, monkeypatch, tmp_path):
    d = real_ckpt_copy("peft-llama")
    monkeypatch.chdir(tmp_path)
    (d / "base-model" / "config.json").unlink()
    names, notes = _names_and_notes(d / CKPT / "optimizer.pt")
    assert _unnamed(names, 8)
    assert "the base model's config.json is needed: base `base-model` not found" in notes


def test_without_transformers_the_state_stays_param_i(real_ckpt, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    names, notes = _names_and_notes(real_ckpt("full-gpt2-optim") / CKPT / "optimizer.pt")
    assert _unnamed(names, 28)
    assert "transformers is not installed" in notes


CANARY = """
from pathlib import Path
Path(__file__).with_name("CANARY_RAN").write_text("imported")
raise SystemExit("canary imported")
"""


def test_auto_map_is_refused_and_no_code_from_the_config_folder_runs(real_ckpt_copy, tmp_path):
    ck = real_ckpt_copy("full-gpt2-optim") / CKPT
    _edit_json(
        ck / "config.json",
        model_type="canary",
        auto_map={"AutoConfig": "canary.CanaryConfig", "AutoModelForCausalLM": "canary.CanaryModel"},
    )
    (ck / "canary.py").write_text(CANARY)
    out = tmp_path / "out"
    hf = tmp_path / "hf"
    r = ckpt_tui(
        "export", str(ck), "--component", "optimizer", "--out", str(out), cwd=ck,
        env={"HF_HOME": str(hf), "HF_MODULES_CACHE": str(hf / "modules")},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "config.json has `auto_map`" in r.stdout + r.stderr
    assert not (ck / "CANARY_RAN").exists() and not (hf / "modules").exists()
    assert all(k.startswith("param_") for k in load_optimizer_export(out))
    # in this process too: nothing named canary was imported
    names, notes = _names_and_notes(ck / "optimizer.pt")
    assert _unnamed(names, 28) and "auto_map" in notes and "canary" not in sys.modules


def test_a_folder_without_a_trainer_config_is_not_a_trainer_checkpoint(real_ckpt_copy):
    ck = real_ckpt_copy("full-gpt2-optim") / CKPT
    (ck / "config.json").unlink()
    assert trainer_run_order(ck / "optimizer.pt", 0.01) is None
    names, notes = _names_and_notes(ck / "optimizer.pt")
    assert _unnamed(names, 28) and "HF Trainer" not in notes and "safetensors" not in notes


# -- PEFT's wrapping, emulated, against PEFT and the Trainer themselves -------------------------------------------

TINY_GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, bos_token_id=255, eos_token_id=255)

WRAPS = [
    ("llama", dict(target_modules=["q_proj", "v_proj"])),
    ("llama", dict(target_modules=r".*\.(q|o)_proj")),
    ("llama", dict(target_modules="all-linear", lora_bias=True, rank_pattern={"down_proj": 2})),
    ("llama", dict(target_modules=["q_proj", "v_proj"], layers_to_transform=[1], layers_pattern="layers")),
    ("llama", dict(target_modules=["q_proj", "down_proj", "up_proj"], exclude_modules=["down_proj"])),
    ("llama", dict(target_modules="all-linear", exclude_modules=r".*\.0\..*")),
    ("llama", dict(target_modules=["embed_tokens", "q_proj"], modules_to_save=["lm_head"])),
    ("llama", dict(target_modules=["q_proj"], modules_to_save=["norm"])),  # a plain suffix: every *norm module
    ("llama", dict(target_modules=["model.layers.1.mlp.gate_proj", "k_proj"])),
    ("gpt2", dict(target_modules=["c_attn", "c_fc"], lora_bias=True, fan_in_fan_out=True)),
    ("gpt2", dict(target_modules=["c_attn"], modules_to_save=["ln_f"], fan_in_fan_out=True)),
    ("gpt2", dict(target_modules=["wte", "c_proj"], fan_in_fan_out=True)),
    ("gpt2", dict(target_modules="all-linear", fan_in_fan_out=True)),
]


def _base(arch: str):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    from ckpt_tui.samples._common import TINY_LLAMA

    cfg = GPT2Config(**TINY_GPT2) if arch == "gpt2" else LlamaConfig(**TINY_LLAMA, attention_bias=True)
    return AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("arch,lora", WRAPS, ids=[f"{a}-{i}" for i, (a, _) in enumerate(WRAPS)])
def test_wrapping_as_peft_and_splitting_as_the_trainer(arch, lora, tmp_path):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import Trainer, TrainingArguments

    base = _base(arch)
    base.config.save_pretrained(tmp_path / "base")
    doc = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM", **lora}
    pm = get_peft_model(base, LoraConfig(**{k: v for k, v in doc.items() if k != "peft_type"}))
    args = TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], weight_decay=0.01)
    trainer = Trainer(model=pm, args=args)
    trainer.create_optimizer()
    by_id = {id(p): n for n, p in pm.named_parameters()}
    live = [[by_id[id(p)] for p in g["params"]] for g in trainer.optimizer.param_groups]

    order = trainer_param_order(
        tmp_path / "base" / "config.json", adapter_config=parse_lora_config(doc), weight_decay=0.01
    )
    assert order.why_not is None
    assert order.groups == live and order.weight_decay == [g["weight_decay"] for g in trainer.optimizer.param_groups]
    shapes = dict((n, tuple(p.shape)) for n, p in pm.named_parameters())
    assert order.shapes == {n: shapes[n] for g in live for n in g}
    by_ptr = {t.data_ptr(): k for k, t in get_peft_model_state_dict(pm).items()}
    assert order.export_names() == [by_ptr[dict(pm.named_parameters())[n].data_ptr()] for g in live for n in g]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_full_fine_tuning_split_as_the_trainer(arch, tmp_path):
    from transformers import Trainer, TrainingArguments

    model = _base(arch)
    model.config.save_pretrained(tmp_path / "m")
    args = TrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], weight_decay=0.05)
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer()
    by_id = {id(p): n for n, p in model.named_parameters()}
    live = [[by_id[id(p)] for p in g["params"]] for g in trainer.optimizer.param_groups]
    order = trainer_param_order(tmp_path / "m" / "config.json", weight_decay=0.05)
    assert order.why_not is None and order.groups == live and order.weight_decay == [0.05, 0.0]
    assert order.export_names() == [n for g in live for n in g]
