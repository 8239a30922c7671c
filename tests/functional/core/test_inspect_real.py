"""The inspector on checkpoints written by the real frameworks (DeepSpeed, HF Trainer, Lightning,
torch DCP, Accelerate, Transformers) on CPU: layout, components, facts and findings."""

import pytest

from ckpt_tui.core.codes import CODES
from ckpt_tui.core.layout import LAYOUTS
from ckpt_tui.core.report import inspect
from ckpt_tui.core.tensors import list_tensors


def codes(rep):
    return {f.code for f in rep.findings}


def errors(rep):
    return [f for f in rep.findings if f.severity == "error"]


# variant, sub-path to inspect, layout, {role: component}, findings expected, findings that must be absent
CASES = [
    ("ds-zero1-bf16", "", "deepspeed", {"model": "global_step2"}, {"universal-info-missing"}, set()),
    ("ds-zero2-bf16", "", "deepspeed", {"model": "global_step2"}, {"universal-info-missing"}, set()),
    ("ds-zero3-bf16", "", "deepspeed", {"model": "global_step2"}, set(), {"universal-info-missing"}),
    ("ds-zero2-fp32", "", "deepspeed", {"model": "global_step2"}, {"universal-info-missing"}, set()),
    ("ds-zero2-tied", "", "deepspeed", {}, {"tied-weights"}, {"frozen-params"}),
    ("ds-zero1-frozen", "", "deepspeed", {}, {"frozen-params"}, set()),
    ("ds-zero2-frozen", "", "deepspeed", {}, {"frozen-params"}, set()),
    ("ds-zero3-frozen", "", "deepspeed", {}, {"frozen-params"}, {"universal-info-missing"}),
    ("ds-zero2-3ranks", "", "deepspeed", {}, {"universal-info-missing"}, set()),
    ("ds-zero3-3ranks", "", "deepspeed", {}, set(), set()),
    ("universal", "", "universal", {"model": "global_step2_universal"}, set(), {"latest-missing"}),
    ("universal-zero2", "", "universal", {}, set(), set()),
    (
        "hf-ds-zero1",
        "checkpoint-2",
        "hf-trainer-deepspeed",
        {"model": "global_step2"},
        {"universal-info-missing"},
        set(),
    ),
    (
        "hf-ds-zero2",
        "checkpoint-2",
        "hf-trainer-deepspeed",
        {"model": "global_step2"},
        {"universal-info-missing"},
        set(),
    ),
    (
        "hf-ds-zero3",
        "checkpoint-2",
        "hf-trainer-deepspeed",
        {"model": "global_step2"},
        set(),
        {"universal-info-missing"},
    ),
    ("hf-ds-zero2-tied-frozen", "checkpoint-2", "hf-trainer-deepspeed", {}, {"tied-weights", "frozen-params"}, set()),
    (
        "hf-fsdp1",
        "checkpoint-2",
        "hf-trainer-fsdp",
        {"model": "pytorch_model_fsdp_0", "optimizer": "optimizer_0"},
        {"dcp-components"},
        set(),
    ),
    (
        "hf-fsdp2",
        "checkpoint-2",
        "hf-trainer-fsdp",
        {"model": "pytorch_model_fsdp_0", "optimizer": "optimizer_0"},
        {"dcp-components"},
        set(),
    ),
    (
        "lightning-ds-zero2",
        "checkpoints/epoch=0-step=2.ckpt",
        "lightning-deepspeed",
        {"model": "checkpoint"},
        {"universal-info-missing"},
        set(),
    ),
    (
        "lightning-ds-zero3",
        "checkpoints/epoch=0-step=2.ckpt",
        "lightning-deepspeed",
        {"model": "checkpoint"},
        set(),
        set(),
    ),
    ("lightning-fsdp", "checkpoints/epoch=0-step=2.ckpt", "lightning-fsdp", {"model": "."}, set(), set()),
    ("fsdp1-dcp", "", "dcp", {"model": "."}, set(), set()),
    ("fsdp2-dcp", "", "dcp", {"model": ".", "optimizer": "."}, set(), set()),
    ("fsdp2-zstd", "", "dcp", {"model": ".", "optimizer": "."}, set(), set()),
    ("fsdp-full", "", "fsdp-full", {"model": "pytorch_model_fsdp.bin"}, set(), set()),
    ("fsdp-local", "", "fsdp-local", {"model": "pytorch_model_fsdp_rank0.bin"}, set(), set()),
    ("dcp-ranklocal", "", "dcp", {"model": "."}, set(), set()),
    ("dcp-fs-safetensors", "", "dcp", {"model": "."}, set(), set()),
    ("dcp-safetensors", "", "hf-model", {}, set(), set()),
    ("torchtitan", "checkpoint/step-1", "torchtitan", {"model": ".", "optimizer": "."}, set(), {"unsafe-pickle"}),
    ("megatron-dist", "checkpoints", "megatron-dist", {"model": "iter_0000010"}, set(), {"unsafe-pickle"}),
    (
        "megatron-legacy",
        "",
        "megatron-legacy",
        {"model+optimizer": "iter_0000010/mp_rank_00/model_optim_rng.pt"},
        set(),
        set(),
    ),
    ("accelerate-save-state", "", "accelerate", {"model": "model.safetensors"}, set(), set()),
    ("hf-model-sharded", "", "hf-model", {"model": "model.safetensors.index.json"}, set(), set()),
    ("hf-model-bin", "", "hf-model", {"model": "pytorch_model.bin"}, set(), set()),
    ("plain-pt", "", "torch-file", {"model": "model.pt"}, set(), set()),
]


@pytest.mark.parametrize("variant,sub,layout,comps,present,absent", CASES, ids=[c[0] for c in CASES])
def test_layout_components_findings(real_ckpt, variant, sub, layout, comps, present, absent):
    path = real_ckpt(variant) / sub if sub else real_ckpt(variant)
    rep = inspect(path)
    inv = rep.inventory
    assert inv.layout == layout, inv.summary
    assert layout in LAYOUTS and codes(rep) <= set(CODES)  # the documented vocabularies are complete
    for role, p in comps.items():
        assert inv.components.get(role) == p, inv.components
    assert present <= codes(rep), rep.findings
    assert not (absent & codes(rep)), rep.findings
    assert not errors(rep), errors(rep)  # a healthy checkpoint: no unsafe-pickle, no corrupt file
    assert "unsafe-pickle" not in codes(rep)
    model = comps.get("model") or comps.get("model+optimizer")
    if model:
        node = inv.node(model)
        tensors = list(list_tensors(node))
        assert tensors and all(t.nbytes >= 0 for t in tensors)


@pytest.mark.parametrize(
    "variant,stage,world,prefix",
    [
        ("ds-zero1-bf16", 1, 2, "bf16_"),
        ("ds-zero2-bf16", 2, 2, "bf16_"),
        ("ds-zero3-bf16", 3, 2, "bf16_"),
        ("ds-zero2-fp32", 2, 2, ""),
        ("ds-zero2-3ranks", 2, 3, "bf16_"),
        ("ds-zero3-3ranks", 3, 3, "bf16_"),
    ],
)
def test_deepspeed_facts(real_ckpt, variant, stage, world, prefix):
    rep = inspect(real_ckpt(variant))
    f = rep.inventory.node("global_step2").facts
    assert f["zero_stage"] == stage and f["world_size"] == world and f["optim_prefix"] == prefix
    assert f["global_step"] == 2
    assert f.get("train_dtype") == ("bfloat16" if prefix else None)
    assert f["universal_checkpoint_info"] is False
    assert f"{world} ranks" in rep.inventory.summary and f"ZeRO-{stage}" in rep.inventory.summary


def test_first_user_report_layout(real_ckpt):
    """`inspect checkpoint-2000` on HF Trainer FSDP: model and optimizer named, no error."""
    rep = inspect(real_ckpt("hf-fsdp1") / "checkpoint-2")
    inv = rep.inventory
    assert not errors(rep)
    assert "model in `pytorch_model_fsdp_0/`" in inv.summary and "optimizer in `optimizer_0/`" in inv.summary
    assert inv.summary.startswith("HF Trainer + FSDP (sharded), 2 ranks, step 2")
    assert inv.node("pytorch_model_fsdp_0").role == "model"
    assert inv.node("optimizer_0").role == "optimizer"
    f = [f for f in rep.findings if f.code == "dcp-components"][0]
    assert "pytorch_model_fsdp_0" in f.message and "accelerate merge-weights" in f.message


def test_second_user_report_layout(real_ckpt):
    rep = inspect(real_ckpt("hf-ds-zero2") / "checkpoint-2")
    f = [f for f in rep.findings if f.code == "universal-info-missing"]
    assert f and f[0].severity == "warning" and f[0].fix == "universal-info"
    assert "Required universal_checkpoint_info state is missing" in f[0].message


def test_run_folder_lists_checkpoints(real_ckpt):
    rep = inspect(real_ckpt("hf-ds-zero2"))
    inv = rep.inventory
    assert inv.layout == "run-folder"
    assert inv.checkpoints == [{"path": "checkpoint-2", "step": 2, "layout": "hf-trainer-deepspeed", "complete": True}]
    assert "HF Trainer + DeepSpeed ZeRO-2" in inv.summary


def test_training_args_reads_through_stand_ins(real_ckpt):
    rep = inspect(real_ckpt("hf-ds-zero2") / "checkpoint-2")
    n = rep.inventory.node("training_args.bin")
    assert n.role == "training-args" and "unsafe_globals" not in n.facts
    assert n.facts["object"] == "transformers.training_args.TrainingArguments"


def test_dcp_tensor_listing_matches_torch(real_ckpt):
    import torch.distributed.checkpoint as dcp

    path = real_ckpt("hf-fsdp1") / "checkpoint-2" / "pytorch_model_fsdp_0"
    ref = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    rep = inspect(path)
    ours = {t.name: t for t in list_tensors(rep.inventory.root, stored=True)}  # as stored, not as exported
    tensors = {k: v for k, v in ref.items() if hasattr(v, "size")}
    assert set(ours) == set(tensors)
    for k, v in tensors.items():
        assert ours[k].shape == tuple(v.size) and ours[k].dtype == str(v.properties.dtype).replace("torch.", "")
