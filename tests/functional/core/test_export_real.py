"""Export on real checkpoints, compared bit-exact with the peers' converters (the oracles)."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export, plan_export
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.progress import Cancelled


def same(a: dict, b: dict):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k


def dcp_oracle(folder: Path, tmp_path: Path) -> dict:
    """torch's own dcp_to_torch_save, then accelerate's unwrap of a single top-level container."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / "oracle.pt"
    dcp_to_torch_save(str(folder), str(out))
    sd = torch.load(out, weights_only=False)
    if len(sd) == 1:
        sd = sd[next(iter(sd))]
    return sd


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, torch.Tensor):
            out[key] = v
    return out


@pytest.mark.parametrize(
    "variant,sub,pick",
    [
        ("hf-fsdp1", "checkpoint-2/pytorch_model_fsdp_0", None),
        ("hf-fsdp2", "checkpoint-2/pytorch_model_fsdp_0", None),
        ("fsdp1-dcp", "", None),
        ("fsdp2-dcp", "", "model"),
        ("fsdp2-zstd", "", "model"),  # every item zstd-compressed (torch's ZStandard extension)
        ("lightning-fsdp", "checkpoints/epoch=0-step=2.ckpt", "model"),
    ],
)
def test_dcp_equals_dcp_to_torch_save(real_ckpt, tmp_path, variant, sub, pick):
    src = real_ckpt(variant) / sub if sub else real_ckpt(variant)
    res = export(src, tmp_path / "out")
    assert res.verified
    ref = dcp_oracle(src, tmp_path)
    if pick:
        ref = ref[pick]
    ref = flat(ref)
    if variant.startswith("lightning"):  # the LightningModule's one attribute, stripped by default
        ref = {k.removeprefix("model."): v for k, v in ref.items()}
    same(load_file(tmp_path / "out" / "model.safetensors"), ref)


def test_dcp_in_safetensors_format(real_ckpt, tmp_path):
    """torch's dcp_to_torch_save cannot read SAFETENSORS-format .distcp files (it torch.loads them);
    the oracle is the same model saved in the default format."""
    export(real_ckpt("dcp-fs-safetensors"), tmp_path / "out")
    ref = dcp_oracle(real_ckpt("fsdp2-dcp"), tmp_path)["model"]
    same(load_file(tmp_path / "out" / "model.safetensors"), flat(ref))


def test_rank_local_metadata(real_ckpt, tmp_path):
    """torch's own dcp_to_torch_save reads only rank 0's `__0.metadata` here (rank 1's rows come out as
    zeros), so the oracle is the same model saved with collectives (fsdp2-dcp, same seed and steps)."""
    export(real_ckpt("dcp-ranklocal"), tmp_path / "out")
    ref = dcp_oracle(real_ckpt("fsdp2-dcp"), tmp_path)["model"]
    same(load_file(tmp_path / "out" / "model.safetensors"), flat(ref))


def test_torchtitan_model_keys_at_top_level(real_ckpt, tmp_path):
    src = real_ckpt("torchtitan") / "checkpoint/step-1"
    export(src, tmp_path / "out")
    ref = dcp_oracle(src, tmp_path)
    model = {
        k: v
        for k, v in flat(ref).items()
        if k.split(".")[0] not in ("optimizer", "lr_scheduler", "dataloader", "train_state")
    }
    same(load_file(tmp_path / "out" / "model.safetensors"), model)


def test_first_user_report_equals_accelerate_merge_weights(real_ckpt, tmp_path):
    """Pointed at checkpoint-2 (not the sub-folder), we pick the model; accelerate needs the sub-folder."""
    ck = real_ckpt("hf-fsdp1") / "checkpoint-2"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.accelerate_cli",
            "merge-weights",
            str(ck),
            str(tmp_path / "acc_bad"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and ".metadata" in bad.stderr  # the reported failure, still there
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.accelerate_cli",
            "merge-weights",
            str(ck / "pytorch_model_fsdp_0"),
            str(tmp_path / "acc"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    res = export(ck, tmp_path / "ours")
    assert any("pytorch_model_fsdp_0" in n for n in res.notes)
    same(load_file(tmp_path / "ours" / "model.safetensors"), load_file(tmp_path / "acc" / "model.safetensors"))


@pytest.mark.parametrize(
    "variant,sub", [("fsdp-full", ""), ("hf-model-bin", ""), ("plain-pt", ""), ("megatron-legacy", "")]
)
def test_torch_files_equal_torch_load(real_ckpt, tmp_path, variant, sub):
    res = export(real_ckpt(variant), tmp_path / "out")
    files = [p for p in real_ckpt(variant).rglob("*") if p.suffix in (".bin", ".pt") and p.name != "training_args.bin"]
    sd = torch.load(files[0], weights_only=False)
    if "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]
    same(load_file(tmp_path / "out" / "model.safetensors"), flat(sd))
    assert res.verified


def test_every_dtype_survives_and_casting(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sd = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(5, dtype=torch.bfloat16),
        "f16": torch.randn(2, 2).half(),
        "i64": torch.arange(6).reshape(2, 3),
        "i8": torch.tensor([-1, 2], dtype=torch.int8),
        "u8": torch.tensor([255], dtype=torch.uint8),
        "b": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "f64": torch.randn(2, dtype=torch.float64),
        "view": torch.arange(12.0).reshape(3, 4).t(),
    }  # a non-contiguous view
    torch.save(sd, src / "model.pt")
    export(src, tmp_path / "keep")
    got = load_file(tmp_path / "keep" / "model.safetensors")
    same(got, {k: v.contiguous() for k, v in sd.items()})
    export(src, tmp_path / "bf16", dtype="bf16")
    got = load_file(tmp_path / "bf16" / "model.safetensors")
    for k, v in sd.items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert got[k].dtype == want.dtype and torch.equal(got[k], want.contiguous()), k


def test_sharded_output_index_and_from_pretrained(real_ckpt, tmp_path):
    transformers = pytest.importorskip("transformers")
    ck = real_ckpt("hf-fsdp1") / "checkpoint-2"
    config = real_ckpt("hf-model-bin") / "config.json"  # the same tiny Llama architecture
    out = tmp_path / "out"
    res = export(ck, out, max_shard_size="100KB", config=str(config))
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and shards == sorted(set(idx["weight_map"].values())) == sorted(res.files)
    for s in shards:
        with safe_open(str(out / s), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for k in f.keys():
                assert idx["weight_map"][k] == s
    assert set(idx["weight_map"]) == {k for s in shards for k in load_file(out / s)}
    assert (
        idx["metadata"]["total_size"]
        == res.bytes
        == sum(t.numel() * t.element_size() for s in shards for t in load_file(out / s).values())
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    ref = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(out))
    state = flat(dcp_oracle(ck / "pytorch_model_fsdp_0", tmp_path))
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_refuses_non_empty_output_and_overwrites_atomically(real_ckpt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export(real_ckpt("plain-pt"), out)
    assert (out / "keep.txt").read_text() == "mine"
    export(real_ckpt("plain-pt"), out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    assert not list(tmp_path.glob(".out.*"))


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_cancel_removes_temp_and_never_touches_source(real_ckpt, tmp_path):
    src = real_ckpt("hf-fsdp1") / "checkpoint-2"
    before = _digest(src)
    cancel = threading.Event()

    def on_progress(p):
        if p.done > 0:
            cancel.set()

    with pytest.raises(Cancelled):
        export(src, tmp_path / "out", max_shard_size="50KB", on_progress=on_progress, cancel=cancel)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == []
    assert _digest(src) == before


def test_export_refuses_broken_checkpoint(real_ckpt_copy, tmp_path):
    d = real_ckpt_copy("fsdp1-dcp")
    os.remove(d / "__1_0.distcp")
    with pytest.raises(ExportError, match="shard-missing"):
        export(d, tmp_path / "out")


def test_dry_run_plan_is_pure(real_ckpt, tmp_path):
    plan, said = plan_export(real_ckpt("hf-fsdp1") / "checkpoint-2", tmp_path / "out", max_shard_size="100KB")
    text = plan.to_plan().describe()
    assert "model-00001-of-" in text and "model.safetensors.index.json" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "variant",
    [
        "ds-zero1-bf16",
        "ds-zero2-bf16",
        "ds-zero3-bf16",
        "ds-zero2-tied",
        "ds-zero2-frozen",
        "ds-zero3-frozen",
        "ds-zero2-3ranks",
        "ds-zero3-3ranks",
    ],
)
def test_deepspeed_export_equals_zero_to_fp32(real_ckpt, tmp_path, variant):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    res = export(real_ckpt(variant), tmp_path / "out")
    ref = get_fp32_state_dict_from_zero_checkpoint(str(real_ckpt(variant)), tag="global_step2")
    got = load_file(tmp_path / "out" / "model.safetensors")
    src_plan, _ = plan_export(real_ckpt(variant), tmp_path / "o2")
    for alias, target in src_plan.dropped_tied:  # written once, as save_pretrained does
        assert alias in ref and alias not in got
        ref.pop(alias)
    same(got, {k: v.float() if v.is_floating_point() else v for k, v in ref.items()})
    assert res.verified


def test_zero1_frozen_params_that_zero_to_fp32_drops(real_ckpt, tmp_path):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ck = real_ckpt("ds-zero1-frozen")
    export(ck, tmp_path / "out")
    got = load_file(tmp_path / "out" / "model.safetensors")
    ref = get_fp32_state_dict_from_zero_checkpoint(str(ck), tag="global_step2")
    dropped = set(got) - set(ref)
    assert dropped == {"embed_tokens.weight"}
    module = torch.load(ck / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert torch.equal(got["embed_tokens.weight"], module["embed_tokens.weight"].float())


@pytest.mark.parametrize("variant", ["hf-ds-zero2", "hf-ds-zero2-tied-frozen", "hf-ds-zero3"])
def test_trainer_deepspeed_export_loads_in_transformers(real_ckpt, tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ck = real_ckpt(variant) / "checkpoint-2"
    out = tmp_path / "out"
    export(ck, out, max_shard_size="200KB")
    assert (out / "config.json").is_file() and (out / "model.safetensors.index.json").is_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    ref = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(ck))
    ref.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(str(ck), tag="global_step2"), strict=False)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_builtin_verification_catches_a_flipped_byte(real_ckpt, tmp_path):
    from ckpt_tui.core.export.write import execute, verify_files

    plan, _ = plan_export(real_ckpt("ds-zero2-bf16"), tmp_path / "out")
    execute(plan, verify=False)
    f = tmp_path / "out" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 1  # inside the last tensor's bytes
    f.write_bytes(bytes(data))
    assert verify_files(plan, tmp_path / "out") == [plan.files[0].tensors[-1].name]
