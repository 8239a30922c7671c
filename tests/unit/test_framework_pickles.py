"""The restricted unpickler on the real pickles of the framework-written Megatron-Core and torchtitan fixtures
(their headers checked in under data/): every class they name is read as inert data, none is outside the
allowlist, and nothing is run. No torch."""

from __future__ import annotations

import zipfile

import pytest

from ckpt_tui.core.formats.dcp.reader import megatron_stacked, megatron_tensor_parallel, read
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
