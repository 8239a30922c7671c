"""Every finding code, produced from a real checkpoint or a real one really corrupted."""

import json
import os
import shutil
import struct

import torch
from safetensors.torch import save_file

from ckpt_tui.core.report import inspect


def only(rep, code):
    fs = [f for f in rep.findings if f.code == code]
    assert fs, (code, rep.findings)
    return fs


def test_dcp_metadata_missing_names_last_complete_sibling(real_ckpt, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", run / "checkpoint-2")
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", run / "checkpoint-4")
    os.remove(run / "checkpoint-4" / "pytorch_model_fsdp_0" / ".metadata")  # an interrupted save
    rep = inspect(run)
    f = only(rep, "dcp-metadata-missing")[0]
    assert f.severity == "error" and f.path == "checkpoint-4/pytorch_model_fsdp_0"
    assert f"`{run / 'checkpoint-2'}/`" in f.message and "ranks 0, 1" in f.message  # inspected by absolute path
    assert [(c["path"], c["complete"]) for c in rep.inventory.checkpoints] == [
        ("checkpoint-4", False),
        ("checkpoint-2", True),
    ]


def test_rank_local_metadata_is_not_missing(real_ckpt):
    rep = inspect(real_ckpt("dcp-ranklocal"))
    assert "dcp-metadata-missing" not in {f.code for f in rep.findings}
    assert rep.inventory.root.facts["rank_local_metadata"] is True


def test_dcp_shard_missing_and_truncated(real_ckpt_copy):
    d = real_ckpt_copy("fsdp1-dcp")
    os.remove(d / "__1_0.distcp")
    rep = inspect(d)
    f = only(rep, "shard-missing")[0]
    assert "__1_0.distcp" in f.message and f.severity == "error"
    shard = d / "__0_0.distcp"
    with open(shard, "r+b") as fh:
        fh.truncate(os.path.getsize(shard) // 2)
    rep = inspect(d)
    assert only(rep, "file-truncated")[0].path == "__0_0.distcp"


def test_deepspeed_rank_missing(real_ckpt_copy):
    d = real_ckpt_copy("ds-zero2-bf16")
    os.remove(d / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    rep = inspect(d)
    f = only(rep, "shard-missing")[0]
    assert "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" in f.message


def test_zero3_model_states_missing(real_ckpt_copy):
    d = real_ckpt_copy("ds-zero3-3ranks")
    os.remove(d / "global_step2" / "zero_pp_rank_2_mp_rank_00_model_states.pt")
    f = only(inspect(d), "shard-missing")[0]
    assert "zero_pp_rank_2_mp_rank_00_model_states.pt" in f.message


def test_world_size_mismatch_from_mixed_runs(real_ckpt, real_ckpt_copy):
    d = real_ckpt_copy("ds-zero2-bf16")
    shutil.copy(
        real_ckpt("ds-zero2-3ranks") / "global_step2" / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
        d / "global_step2",
    )
    f = only(inspect(d), "world-size-mismatch")[0]
    assert "bf16_zero_pp_rank_2" in f.message


def test_latest_dangling_and_hostile_and_missing(real_ckpt_copy):
    d = real_ckpt_copy("ds-zero2-bf16")
    for content in ("global_step99", "../../etc", "\x00\xff garbage"):
        (d / "latest").write_bytes(content.encode("latin1"))
        f = only(inspect(d), "latest-dangling")[0]
        assert f.severity == "error" and "global_step2" in f.message and f.fix == "latest"
    os.remove(d / "latest")
    f = only(inspect(d), "latest-missing")[0]
    assert f"echo global_step2 > {d / 'latest'}" in f.message and f.command == f"ckpt-tui fix {d} --only latest"


def test_truncated_optim_states_and_zero_byte(real_ckpt_copy):
    d = real_ckpt_copy("ds-zero2-bf16")
    p = d / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with open(p, "r+b") as fh:
        fh.truncate(os.path.getsize(p) - 100)
    f = only(inspect(d), "file-truncated")[0]
    assert f.path == "global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    p.write_bytes(b"")
    assert only(inspect(d), "file-truncated")[0].path.endswith("rank_1_mp_rank_00_optim_states.pt")
    m = d / "global_step2" / "mp_rank_00_model_states.pt"
    with open(m, "r+b") as fh:
        fh.truncate(1000)
    assert any(f.path.endswith("mp_rank_00_model_states.pt") for f in only(inspect(d), "file-truncated"))


def test_safetensors_header_lies(real_ckpt_copy):
    d = real_ckpt_copy("accelerate-save-state")
    p = d / "model.safetensors"
    data = bytearray(p.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    p.write_bytes(struct.pack("<Q", 2**63) + data[8:])  # header length of 2^63
    assert only(inspect(d), "file-corrupt")[0].path == "model.safetensors"
    bad = bytearray(data)
    bad[8 + 2] ^= 0xFF  # flip a byte inside the JSON header
    p.write_bytes(bytes(bad))
    assert only(inspect(d), "file-corrupt")[0].path == "model.safetensors"
    p.write_bytes(bytes(data[: 8 + n + 10]))  # data block cut short
    assert only(inspect(d), "file-truncated")[0].path == "model.safetensors"


def test_index_mismatch(real_ckpt_copy):
    d = real_ckpt_copy("hf-model-sharded")
    idx = d / "model.safetensors.index.json"
    doc = json.loads(idx.read_text())
    name = sorted(doc["weight_map"])[0]
    del doc["weight_map"][name]
    doc["weight_map"]["ghost.weight"] = "model-00099-of-00099.safetensors"
    idx.write_text(json.dumps(doc))
    f = only(inspect(d), "index-mismatch")[0]
    assert "model-00099-of-00099.safetensors" in f.message and name in f.message


def test_unsafe_pickle_in_a_real_checkpoint(real_ckpt_copy, tmp_path):
    d = real_ckpt_copy("hf-ds-zero2") / "checkpoint-2"
    canary = tmp_path / "canary"

    class Payload:
        def __reduce__(self):
            return (open, (str(canary), "w"))

    torch.save({"args": Payload()}, d / "training_args.bin")
    rep = inspect(d)
    assert only(rep, "unsafe-pickle")[0].path == "training_args.bin"
    assert not canary.exists()


def test_mixed_dtypes_and_tied_in_a_torch_file(tmp_path):
    emb = torch.randn(8, 4)
    torch.save(
        {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": torch.ones(4, dtype=torch.bfloat16)},
        tmp_path / "pytorch_model.bin",
    )
    rep = inspect(tmp_path)
    assert "bfloat16" in only(rep, "mixed-dtypes")[0].message
    assert "embed.weight = lm_head.weight" in only(rep, "tied-weights")[0].message


def test_adapter_only(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "x"}))
    save_file({"base_model.model.q.lora_A.weight": torch.zeros(4, 8)}, str(tmp_path / "adapter_model.safetensors"))
    assert only(inspect(tmp_path), "adapter-only")[0].severity == "info"


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    f = only(inspect(tmp_path), "not-a-checkpoint")[0]
    assert f.severity == "error"


def test_symlink_loop_and_deep_nesting_do_not_hang(tmp_path):
    (tmp_path / "a").mkdir()
    os.symlink(tmp_path, tmp_path / "a" / "loop")
    deep = tmp_path
    for i in range(40):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    rep = inspect(tmp_path)
    assert any(f.code == "unreadable" and "loop" in f.message for f in rep.findings)
    assert any(f.code == "unreadable" and "deep" in f.message for f in rep.findings)
