"""The LoRA and fine-tuning fixtures of samples/hf_peft.py, checked against the frameworks that wrote them:
every expected file is there, adapter_config.json records what was asked for and the local base, PEFT loads each
adapter folder back onto its base bit-exact with the live run's adapter (oracle/adapter_state.safetensors),
every LoRA target moved off PEFT's zero B (so a merge that is left out shows), and oracle/optimizer_names.json
agrees with the optimizer state each run saved (optimizer.pt, the DeepSpeed tag, FSDP's optimizer_0/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui import samples
from tests.fixtures import FRAMEWORKS, fixture_path

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

RUN = "run/checkpoint-2"
SINGLE = ("peft-llama", "peft-llama-bias-bf16", "peft-gpt2-rslora", "peft-llama-resized")
RESIZED = {"peft-llama-resized": 264}  # the run added tokens: resize_token_embeddings(264) on the 256 base
FULL = ("full-gpt2-optim", "full-llama-bias-optim")
DS = ("peft-ds-zero2", "peft-ds-zero3")
FSDP = ("peft-fsdp2", "peft-fsdp1")
PEFT = SINGLE + ("peft-ddp-mts",) + DS + FSDP
FOLDERS = SINGLE + ("peft-ddp-mts",) + DS  # the checkpoint is an adapter folder PEFT loads
WITH_OPTIMIZER_PT = SINGLE + FULL + ("peft-ddp-mts",)

_QV = dict(targets={"q_proj", "v_proj"})
_NONE = dict(
    use_rslora=False, fan_in_fan_out=False, lora_bias=False, modules_to_save=None, rank_pattern={}, alpha_pattern={}
)
# what each PEFT variant asked for (targets by their last name); FSDP saves no adapter_config.json
ASKED: dict[str, dict] = {
    "peft-llama": {**_NONE, **_QV},
    "peft-llama-bias-bf16": {
        **_NONE,
        "targets": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
        "rank_pattern": {"down_proj": 2},
        "alpha_pattern": {"down_proj": 3, "o_proj": 2},
    },
    # Conv1D: PEFT turns fan_in_fan_out on by itself (the generator does not ask) and records it
    "peft-gpt2-rslora": {
        **_NONE,
        "targets": {"c_attn", "c_fc"},
        "use_rslora": True,
        "fan_in_fan_out": True,
        "lora_bias": True,
    },
    "peft-llama-resized": {**_NONE, **_QV, "modules_to_save": ["embed_tokens", "lm_head"]},
    "peft-ddp-mts": {**_NONE, "targets": {"q_proj", "k_proj", "v_proj", "o_proj"}, "modules_to_save": ["lm_head"]},
    "peft-ds-zero2": {**_NONE, **_QV},
    "peft-ds-zero3": {**_NONE, **_QV},
    "peft-fsdp2": {**_NONE, **_QV},
    "peft-fsdp1": {**_NONE, **_QV},
}
LAYERS = 2


@pytest.fixture(autouse=True)
def _in_the_variant_folder(request, monkeypatch):
    """Where the run was: PEFT resolves the recorded base "base-model" from the current folder (loading and
    get_peft_model_state_dict look for its config.json there, and try the hub when it is not found)."""
    variant = request.node.callspec.params.get("variant") if hasattr(request.node, "callspec") else None
    if variant is not None:
        monkeypatch.chdir(fixture_path(variant))


def _base(variant: str):
    model = transformers.AutoModelForCausalLM.from_pretrained(fixture_path(variant) / "base-model")
    if variant in RESIZED:  # as the run did before wrapping it, and as a user must before loading its adapter
        model.resize_token_embeddings(RESIZED[variant])
    return model


def _oracle(variant: str, name: str = "adapter_state") -> dict[str, torch.Tensor]:
    return load_file(fixture_path(variant) / "oracle" / f"{name}.safetensors")


def _names(variant: str) -> dict:
    return json.loads((fixture_path(variant) / "oracle/optimizer_names.json").read_text())


def _targets(variant: str) -> list[str]:
    """The base's module paths a LoRA of ``variant`` targets: Linear / Conv1D layers named as asked."""
    from transformers.pytorch_utils import Conv1D

    model = _base(variant)
    return [
        n
        for n, m in model.named_modules()
        if n.rsplit(".", 1)[-1] in ASKED[variant]["targets"] and isinstance(m, (torch.nn.Linear, Conv1D))
    ]


@pytest.mark.parametrize(
    "variant", sorted(samples.GROUPS["hf_peft"].variants + samples.GROUPS["hf_peft_dist"].variants)
)
def test_every_expected_file_is_written(variant):
    root = fixture_path(variant)
    assert not [p for p in samples.EXPECTED[variant] if not any(root.glob(p))]


def test_groups_launch_as_asked():
    assert samples.GROUPS["hf_peft"].nproc == 1 and samples.GROUPS["hf_peft_dist"].nproc == 2
    assert set(samples.GROUPS["hf_peft"].variants) == set(SINGLE + FULL)
    assert set(samples.GROUPS["hf_peft_dist"].variants) == {"peft-ddp-mts", "full-ddp-model-only", *DS, *FSDP}
    assert "peft" not in FRAMEWORKS  # the whole cache's key: peft enters only the hashes of the groups using it


def test_group_hash_follows_the_installed_peft(monkeypatch):
    from importlib import metadata

    before = {g: samples.group_hash(g) for g in samples.GROUPS}
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda d: "0.0.0" if d == "peft" else real(d))
    after = {g: samples.group_hash(g) for g in samples.GROUPS}
    changed = {g for g in before if before[g] != after[g]}
    assert changed == {"hf_peft", "hf_peft_dist", "hf_broken"}  # hf_broken saves a PEFT adapter under ZeRO-3


@pytest.mark.parametrize("variant", FOLDERS)
def test_adapter_config_records_the_local_base_and_what_was_asked(variant):
    cfg = json.loads((fixture_path(variant) / RUN / "adapter_config.json").read_text())
    asked = ASKED[variant]
    assert cfg["base_model_name_or_path"] == "base-model"  # loaded by the relative path from the variant folder
    assert (fixture_path(variant) / cfg["base_model_name_or_path"] / "config.json").is_file()
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM" and cfg["peft_version"] == "0.21.0"
    assert (cfg["r"], cfg["lora_alpha"]) == (4, 8)
    assert {t.rsplit(".", 1)[-1] for t in cfg["target_modules"]} == asked["targets"]
    for key in ("use_rslora", "fan_in_fan_out", "lora_bias", "modules_to_save", "rank_pattern", "alpha_pattern"):
        assert cfg[key] == asked[key], key
    assert not cfg["use_dora"] and cfg["target_parameters"] is None and cfg["trainable_token_indices"] is None


def test_all_linear_is_recorded_as_every_layer_s_linear_by_name():
    cfg = json.loads((fixture_path("peft-llama-bias-bf16") / RUN / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == sorted(_targets("peft-llama-bias-bf16"))  # 7 per layer, no lm_head
    assert len(cfg["target_modules"]) == 7 * LAYERS


def test_bases_dtypes_and_shapes():
    bf16 = load_file(fixture_path("peft-llama-bias-bf16") / "base-model/model.safetensors")
    assert {t.dtype for t in bf16.values()} == {torch.bfloat16}
    assert "model.layers.0.self_attn.q_proj.bias" in bf16 and "model.layers.0.self_attn.o_proj.bias" in bf16
    for v in ("peft-llama", "peft-gpt2-rslora", "peft-ddp-mts", *DS, *FSDP):
        assert {t.dtype for t in load_file(fixture_path(v) / "base-model/model.safetensors").values()} == {
            torch.float32
        }
    gpt2 = load_file(fixture_path("peft-gpt2-rslora") / "base-model/model.safetensors")
    assert gpt2["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)  # Conv1D: (in, out), non-square
    mts = json.loads((fixture_path("peft-ddp-mts") / "base-model/config.json").read_text())
    assert mts["tie_word_embeddings"] is False  # modules_to_save on lm_head needs an untied head
    # the run that added tokens: a 256-row base, a 264-row embedding and head saved, and PEFT's own copies of
    # the wrappers' tensors beside them (save_embedding_layers, which PEFT turns on when it sees the resize)
    rs = fixture_path("peft-llama-resized")
    assert json.loads((rs / "base-model/config.json").read_text())["vocab_size"] == 256
    saved = load_file(rs / RUN / "adapter_model.safetensors")
    for m in ("base_model.model.model.embed_tokens", "base_model.model.lm_head"):
        assert saved[f"{m}.weight"].shape == (264, 64)
        assert torch.equal(saved[f"{m}.modules_to_save.weight"], saved[f"{m}.weight"])
        assert saved[f"{m}.original_module.weight"].shape == (264, 64)


@pytest.mark.parametrize("variant", PEFT)
def test_every_target_s_lora_b_moved_off_zero(variant):
    targets = _targets(variant)
    assert len(targets) == LAYERS * len(ASKED[variant]["targets"])
    for state in ("adapter_state", "adapter_state_fp32") if variant in DS else ("adapter_state",):
        sd = _oracle(variant, state)
        assert sorted(k for k in sd if ".lora_B." in k and k.endswith(".weight")) == sorted(
            f"base_model.model.{t}.lora_B.weight" for t in targets
        )
        for t in targets:
            assert sd[f"base_model.model.{t}.lora_A.weight"].count_nonzero() > 0, (state, t)
            assert sd[f"base_model.model.{t}.lora_B.weight"].count_nonzero() > 0, (state, t)
            if ASKED[variant]["lora_bias"]:
                assert sd[f"base_model.model.{t}.lora_B.bias"].count_nonzero() > 0, (state, t)


@pytest.mark.parametrize("variant", FOLDERS)
def test_peft_loads_the_folder_bit_exact_with_the_live_adapter(variant):
    ckpt = fixture_path(variant) / RUN
    oracle = _oracle(variant)
    saved = load_file(ckpt / "adapter_model.safetensors")
    assert sorted(saved) == sorted(oracle)
    for k, t in oracle.items():  # as written: dtype (bf16 under DeepSpeed) and bits
        assert saved[k].dtype == t.dtype and torch.equal(saved[k], t), k
    model = peft.PeftModel.from_pretrained(_base(variant), ckpt)
    loaded = peft.get_peft_model_state_dict(model)
    assert sorted(loaded) == sorted(oracle)
    for k, t in oracle.items():  # PEFT upcasts a bf16 adapter to fp32 on load (autocast_adapter_dtype): exact
        assert torch.equal(loaded[k], t.to(loaded[k].dtype)), k


@pytest.mark.parametrize("variant", FOLDERS)
def test_merging_changes_every_target(variant):
    base = {k: v.clone() for k, v in _base(variant).state_dict().items()}
    merged = peft.PeftModel.from_pretrained(_base(variant), fixture_path(variant) / RUN).merge_and_unload()
    msd = merged.state_dict()
    for t in _targets(variant):
        assert (msd[f"{t}.weight"] != base[f"{t}.weight"]).sum() > 0, t
        if ASKED[variant]["lora_bias"]:
            assert (msd[f"{t}.bias"] != base[f"{t}.bias"]).sum() > 0, t
    if ASKED[variant]["modules_to_save"]:
        assert torch.equal(msd["lm_head.weight"], _oracle(variant)["base_model.model.lm_head.weight"])
        assert not torch.equal(msd["lm_head.weight"], base["lm_head.weight"])


def _named_shapes(variant: str) -> dict[str, tuple[int, ...]]:
    """Every trainable parameter of the run's model as the Trainer named it, with its shape."""
    ckpt = fixture_path(variant) / RUN
    if variant in FULL:
        config = transformers.AutoConfig.from_pretrained(ckpt)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        model = peft.PeftModel.from_pretrained(_base(variant), ckpt, is_trainable=True)
    return {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("variant", WITH_OPTIMIZER_PT)
def test_optimizer_names_agree_with_optimizer_pt(variant):
    names = _names(variant)
    assert names["source"] == "trainer.optimizer.param_groups"
    opt = torch.load(fixture_path(variant) / RUN / "optimizer.pt", weights_only=True)
    assert [len(g["params"]) for g in names["groups"]] == [len(g["params"]) for g in opt["param_groups"]]
    assert [g["weight_decay"] for g in names["groups"]] == [g["weight_decay"] for g in opt["param_groups"]]
    assert [g["weight_decay"] for g in names["groups"]] == [0.01, 0.0]
    flat = [n for g in names["groups"] for n in g["params"]]
    assert [i for g in opt["param_groups"] for i in g["params"]] == list(range(len(flat)))
    shapes = _named_shapes(variant)
    assert sorted(flat) == sorted(shapes)  # every trainable parameter, once
    assert sorted(opt["state"]) == list(range(len(flat)))
    for i, n in enumerate(flat):
        assert tuple(opt["state"][i]["exp_avg"].shape) == shapes[n], n


@pytest.mark.parametrize("variant", FULL)
def test_the_full_fine_tunes_reorder(variant):
    """The point of these fixtures: optimizer.pt's order is not named_parameters()'s."""
    flat = [n for g in _names(variant)["groups"] for n in g["params"]]
    assert flat != list(_named_shapes(variant))
    nodecay = _names(variant)["groups"][1]["params"]
    if variant == "full-gpt2-optim":  # ln_1: a no-decay LayerNorm whose name matches no pattern
        assert "transformer.h.0.ln_1.weight" in nodecay and "transformer.h.0.attn.c_attn.weight" not in nodecay
    else:
        assert "model.layers.0.self_attn.q_proj.bias" in nodecay
    saved = load_file(fixture_path(variant) / RUN / "model.safetensors")
    assert set(flat) <= set(saved) | {"lm_head.weight"}  # GPT-2 ties lm_head to wte: saved once


@pytest.mark.parametrize("variant", DS)
def test_deepspeed_tags_hold_the_adapter_s_fp32_masters(variant):
    """The Trainer hands DeepSpeed one flat parameter list (its config has an optimizer): one group."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ckpt = fixture_path(variant) / RUN
    names = _names(variant)
    assert names["source"].startswith("deepspeed ")
    assert [g["weight_decay"] for g in names["groups"]] == [0.01]
    flat = names["groups"][0]["params"]
    assert sorted(flat) == sorted(_named_shapes(variant))
    fp32 = get_fp32_state_dict_from_zero_checkpoint(str(ckpt))
    assert list(fp32) == flat  # exclude_frozen_parameters: the adapter only, under the live names
    oracle = _oracle(variant, "adapter_state_fp32")
    assert sorted(k.replace(".default", "") for k in fp32) == sorted(oracle)
    for k, t in fp32.items():
        assert t.dtype == torch.float32 and torch.equal(t, oracle[k.replace(".default", "")]), k
    bf16 = _oracle(variant)
    for k, t in oracle.items():  # the model held the masters rounded to bf16
        assert torch.equal(bf16[k], t.to(torch.bfloat16)), k
    optim = torch.load(ckpt / "global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    osd = optim["optimizer_state_dict"]  # ZeRO-3 keeps the torch optimizer's state one level down
    groups = (osd["base_optimizer_state"] if variant == "peft-ds-zero2" else osd["optimizer_state_dict"])[
        "param_groups"
    ]
    assert [g["weight_decay"] for g in groups] == [0.01]


def _dcp_load(path: Path, tmp_path: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{path.name}.pt"
    dcp_to_torch_save(path, out)
    return torch.load(out, weights_only=True)


@pytest.mark.parametrize("variant", FSDP)
def test_fsdp_folders(variant, tmp_path):
    ckpt = fixture_path(variant) / RUN
    assert not (ckpt / "adapter_config.json").exists() and not (ckpt / "adapter_model.safetensors").exists()
    model = _dcp_load(ckpt / "pytorch_model_fsdp_0", tmp_path)
    oracle = _oracle(variant)
    if variant == "peft-fsdp2":  # the adapter under PEFT's names, in the "model" container
        assert sorted(model) == ["model"] and sorted(model["model"]) == sorted(oracle)
        for k, t in oracle.items():
            assert torch.equal(model["model"][k], t), k
    else:
        assert model == {}  # FSDP1 + PEFT: no tensor entries at all (issue 24)
    opt = _dcp_load(ckpt / "optimizer_0", tmp_path)["optimizer"]
    names = _names(variant)
    assert names["source"] == "trainer.optimizer.param_groups"
    assert [(g["weight_decay"], g["params"]) for g in opt["param_groups"]] == [
        (g["weight_decay"], g["params"]) for g in names["groups"]
    ]
    flat = [n for g in names["groups"] for n in g["params"]]
    # the live names (with ".default") of the oracle's tensors
    shapes = {
        k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): tuple(t.shape)
        for k, t in oracle.items()
    }
    assert sorted(opt["state"]) == sorted(flat) == sorted(shapes)
    for n in flat:
        assert tuple(opt["state"][n]["exp_avg"].shape) == shapes[n], n
