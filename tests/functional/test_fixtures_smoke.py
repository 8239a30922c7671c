"""Every registered fixture exists and has the layout its framework writes (fast once cached)."""

from __future__ import annotations

import pickle

import pytest

from ckpt_tui import samples

try:
    from tests.fixtures import REGISTRY
except ImportError:
    from fixtures import REGISTRY

# Group order keeps one group's variants together, so a cold run generates each group once, in turn.
NAMES = sorted(REGISTRY, key=lambda v: (list(samples.GROUPS).index(REGISTRY[v][0]), v))


@pytest.mark.parametrize("name", NAMES)
def test_expected_files(real_ckpt, name):
    root = real_ckpt(name)
    missing = [p for p in samples.EXPECTED[name] if not any(root.glob(p))]
    assert not missing, f"{name}: missing {missing}"


def _dcp_keys(path):
    with open(path, "rb") as f:
        return set(pickle.load(f).state_dict_metadata)  # torch must be importable to unpickle


def _load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def test_zero3_has_per_rank_model_states(real_ckpt):
    for name, world in [("ds-zero3-bf16", 2), ("ds-zero3-3ranks", 3), ("ds-zero3-frozen", 2)]:
        tag = real_ckpt(name) / "global_step2"
        assert not (tag / "mp_rank_00_model_states.pt").exists()
        for r in range(world):
            assert (tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt").is_file()
            assert (tag / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").is_file()
        assert not (tag / f"zero_pp_rank_{world}_mp_rank_00_model_states.pt").exists()


def test_fp32_has_no_bf16_prefix(real_ckpt):
    names = [p.name for p in (real_ckpt("ds-zero2-fp32") / "global_step2").iterdir()]
    assert not [n for n in names if n.startswith("bf16_")]
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in names


def test_ds_tied_and_frozen_recorded(real_ckpt):
    tied = _load(real_ckpt("ds-zero2-tied") / "global_step2/mp_rank_00_model_states.pt")
    assert tied["shared_params"] == {"lm_head.weight": "embed_tokens.weight"}
    frozen2 = _load(real_ckpt("ds-zero2-frozen") / "global_step2/mp_rank_00_model_states.pt")
    assert list(frozen2["frozen_param_shapes"]) == ["embed_tokens.weight"]
    frozen1 = _load(real_ckpt("ds-zero1-frozen") / "global_step2/mp_rank_00_model_states.pt")
    assert not frozen1["frozen_param_shapes"]  # ZeRO-1 saves no frozen_param_* (FIXTURES.md)


def test_engine_checkpoints_lack_universal_info(real_ckpt):
    for name, rel in [
        ("ds-zero2-bf16", "global_step2/mp_rank_00_model_states.pt"),
        ("hf-ds-zero2", "checkpoint-2/global_step2/mp_rank_00_model_states.pt"),
        ("demo", "deepspeed-zero2/global_step3/mp_rank_00_model_states.pt"),
    ]:
        assert "universal_checkpoint_info" not in _load(real_ckpt(name) / rel)


def test_universal_output(real_ckpt):
    u = real_ckpt("universal")
    assert (u / "latest_universal").read_text().strip() == "global_step2_universal"
    assert (u / "global_step2_universal/zero/embed_tokens.weight/exp_avg_sq.pt").is_file()
    u2 = real_ckpt("universal-zero2")
    assert (u2 / "global_step2_universal/zero/embed_tokens.weight/fp32.pt").is_file()


def test_hf_trainer_layouts(real_ckpt):
    z3 = real_ckpt("hf-ds-zero3") / "checkpoint-2"
    assert not (z3 / "model.safetensors").exists()  # ZeRO-3 without stage3_gather_16bit_weights_on_model_save
    for name in ("hf-fsdp1", "hf-fsdp2"):
        ckpt = real_ckpt(name) / "checkpoint-2"
        assert (ckpt / "pytorch_model_fsdp_0/.metadata").is_file()
        assert not (ckpt / ".metadata").exists() and not (ckpt / "config.json").exists()
        model_keys = _dcp_keys(ckpt / "pytorch_model_fsdp_0/.metadata")
        assert "model.model.embed_tokens.weight" in model_keys
        opt_keys = _dcp_keys(ckpt / "optimizer_0/.metadata")
        assert "optimizer.state.model.embed_tokens.weight.exp_avg" in opt_keys


def test_dcp_key_layouts(real_ckpt):
    fsdp2 = _dcp_keys(real_ckpt("fsdp2-dcp") / ".metadata")
    assert "model.embed_tokens.weight" in fsdp2 and "optim.state.embed_tokens.weight.exp_avg" in fsdp2
    assert "model.embed_tokens.weight" in _dcp_keys(real_ckpt("fsdp1-dcp") / ".metadata")
    titan = _dcp_keys(real_ckpt("torchtitan") / "checkpoint/step-1/.metadata")  # CheckpointManager.save(1)
    assert "tok_embeddings.weight" in titan and "train_state.step" in titan
    assert any(k.startswith("optimizer.state.") for k in titan)
    assert any(k.startswith("lr_scheduler.") for k in titan) and any(k.startswith("dataloader.") for k in titan)
    last = _dcp_keys(real_ckpt("torchtitan") / "checkpoint/step-2/.metadata")  # save(2, last_step=True)
    assert "tok_embeddings.weight" in last and not any(k.startswith(("optimizer.", "train_state.")) for k in last)
    lit = real_ckpt("lightning-fsdp") / "checkpoints/epoch=0-step=2.ckpt"
    assert "model.model.embed_tokens.weight" in _dcp_keys(lit / ".metadata")
    assert not (real_ckpt("dcp-ranklocal") / ".metadata").exists()
    assert not (real_ckpt("dcp-safetensors") / ".metadata").exists()


def test_megatron_layouts(real_ckpt):
    import json

    md = real_ckpt("megatron-dist") / "checkpoints"
    assert json.loads((md / "iter_0000010/metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (md / "latest_checkpointed_iteration.txt").read_text().strip() == "10"
    assert "decoder.layers.self_attention.linear_qkv.weight" in _dcp_keys(md / "iter_0000010/.metadata")
    legacy = _load(real_ckpt("megatron-legacy") / "iter_0000010/mp_rank_00/model_optim_rng.pt")
    assert {"model", "optimizer", "iteration", "args"} <= set(legacy)
    assert type(legacy["args"]).__name__ == "Namespace"


def test_demo_has_both_problems(real_ckpt):
    demo = real_ckpt("demo")
    ckpt = demo / "fsdp-trainer-run/checkpoint-20"
    assert not (ckpt / ".metadata").exists()  # `accelerate merge-weights checkpoint-20` fails on this
    assert (ckpt / "pytorch_model_fsdp_0/.metadata").is_file()
    assert "optimizer.state.embed_tokens.weight.exp_avg" in _dcp_keys(ckpt / "optimizer_0/.metadata")
    assert (demo / "deepspeed-zero2/latest").read_text().strip() == "global_step3"


def test_every_fixture_has_a_model_for_its_printed_load_snippet():
    """The advice corpus runs every export's printed load code against tests/snippets.py's MODELS at the very end
    of a long run: a fixture added without an entry would fail there, after 40 minutes; here it fails at once."""
    from tests.fixtures import REGISTRY, SKIPPED
    from tests.snippets import MODELS

    assert sorted(v for v in REGISTRY if v not in SKIPPED and v not in MODELS) == []
