"""The restricted unpickler on the real pickles of the framework-written Megatron-Core and torchtitan fixtures
(their headers checked in under data/): every class they name is read as inert data, none is outside the
allowlist, and nothing is run. No torch."""

from __future__ import annotations

import zipfile

import pytest

from ckpt_tui.core.formats.dcp.reader import (
    chunk_layout,
    megatron_stacked,
    megatron_tensor_parallel,
    megatron_tp_split,
    read,
)
from ckpt_tui.core.formats.unpickle import Record, safe_loads

from . import trees

IT = "checkpoints/iter_0000010"


@pytest.mark.parametrize(
    "variant,rel",
    [
        ("megatron-dist", f"{IT}/.metadata"),  # Metadata + all_local_plans: SavePlan/WriteItem/TensorWriteData
        ("torchtitan", "checkpoint/step-1/.metadata"),
        ("torchtitan", "checkpoint/step-2/.metadata"),
    ],
)
def test_dcp_metadata_needs_nothing_outside_the_allowlist(tmp_path, variant, rel):
    up = safe_loads(trees.write_file(variant, rel, tmp_path / "m").read_bytes())
    assert up.unsafe == set()
    assert isinstance(up.obj, Record) and up.obj.__dict__["state_dict_metadata"]


def test_megatron_save_plans_are_records(tmp_path):
    up = safe_loads(trees.write_file("megatron-dist", f"{IT}/.metadata", tmp_path / "m").read_bytes())
    plans = up.obj.__dict__["all_local_plans"]
    assert [type(p).__name__ for p in plans] == ["SavePlan", "SavePlan"]
    item = plans[1].__dict__["items"][0]
    assert type(item).__name__ == "WriteItem" and type(item.__dict__["index"]).__name__ == "MetadataIndex"


def test_megatron_common_state(tmp_path):
    p = trees.write_file("megatron-dist", f"{IT}/common.pt", tmp_path / "common.pt")
    with zipfile.ZipFile(p) as zf:
        up = safe_loads(zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl"))), persistent=True)
    assert up.unsafe == set() and up.obj["iteration"] == 10 and up.obj["checkpoint_version"] == 3.0


def test_megatron_stacks_and_tensor_parallel(tmp_path):
    root = trees.tree("megatron-dist", tmp_path)
    info = read(root / IT)
    stacked = megatron_stacked(info)
    assert stacked["decoder.layers.self_attention.linear_qkv.weight"] == (
        "decoder.layers.",
        "self_attention.linear_qkv.weight",
        2,
    )
    assert "decoder.final_layernorm.weight" not in stacked and "embedding.word_embeddings.weight" not in stacked
    assert megatron_tensor_parallel(info) == 2


# megatron-core 0.16 TP=2, and 0.19 TP=2, PP=2 (2 ranks), TP=2 x PP=2 (4 ranks): variant -> (TP, PP)
SIZES = {"megatron-dist": (2, 1), "megatron-dist-019": (2, 1), "megatron-pp2": (1, 2), "megatron-tp2pp2": (2, 2)}


@pytest.mark.parametrize("variant", sorted(SIZES))
def test_megatron_tensor_parallel_from_the_split_weight_dimension(tmp_path, variant):
    """TP from the real saves' .metadata: the distinct chunk offsets along the dimension tensor parallelism splits —
    linear_qkv's rows (192 = 3 x 64) and linear_proj's columns, the stacked layer axis (one chunk per layer) left
    out."""
    info = read(trees.tree(variant, tmp_path) / IT)
    tp, _ = SIZES[variant]
    assert megatron_tensor_parallel(info) == tp
    qkv = info.tp_offsets["decoder.layers.self_attention.linear_qkv.weight"]  # (layers, 192, 64)
    proj = info.tp_offsets["decoder.layers.self_attention.linear_proj.weight"]  # (layers, 64, 64)
    fc1 = info.tp_offsets["decoder.layers.mlp.linear_fc1.weight"]  # (layers, 128, 64)
    fc2 = info.tp_offsets["decoder.layers.mlp.linear_fc2.weight"]  # (layers, 64, 128)
    assert {o[1] for o in qkv} == set(range(0, 192, 192 // tp)) and {o[2] for o in qkv} == {0}
    assert {o[2] for o in proj} == set(range(0, 64, 64 // tp)) and {o[1] for o in proj} == {0}
    assert {o[1] for o in fc1} == set(range(0, 128, 128 // tp)) and {o[2] for o in fc2} == set(range(0, 128, 128 // tp))
    assert {o[0] for o in qkv} == {0, 1}  # each of the 2 layers its own chunk


def test_megatron_pipeline_stages_leave_no_mark_on_the_chunks(tmp_path):
    """Why PP comes from Megatron-LM's args or not at all: megatron saves every layer as its own chunk whichever stage
    holds it, so a TP=2 save and a TP=2 x PP=2 save place the same chunks (and a PP=2 one those of TP=1)."""
    tp2 = chunk_layout(read(trees.tree("megatron-dist-019", tmp_path) / IT))
    tp2pp2 = chunk_layout(read(trees.tree("megatron-tp2pp2", tmp_path) / IT))
    assert tp2 == tp2pp2
    pp2 = read(trees.tree("megatron-pp2", tmp_path) / IT)
    assert all(per_first == 1 for _, per_first in chunk_layout(pp2).values())  # no split within a layer


def test_megatron_tp_split_names():
    assert megatron_tp_split("decoder.layers.self_attention.linear_qkv.weight") == -2
    assert megatron_tp_split("decoder.layers.3.mlp.linear_fc1.weight") == -2  # unstacked (older saves)
    assert megatron_tp_split("decoder.layers.mlp.linear_fc2.weight") == -1
    assert megatron_tp_split("model.decoder.layers.self_attention.linear_proj.weight") == -1
    # a distributed optimizer's state is split by flattened ranges; biases, norms and experts are not these weights
    assert megatron_tp_split("optimizer.state.exp_avg.decoder.layers.self_attention.linear_qkv.weight") is None
    assert megatron_tp_split("decoder.layers.self_attention.linear_qkv.bias") is None
    assert megatron_tp_split("decoder.layers.mlp.experts.linear_fc1.weight") is None
