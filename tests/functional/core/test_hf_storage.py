"""torch's ``HuggingFaceStorageWriter`` in its three layouts (issue 25), each written by FSDP2 on 2 gloo ranks
(samples/torch_dcp.py): ``save_distributed=False`` of the full state dict (`hf-storage-single`: model files + index),
``save_distributed=True`` (`hf-storage-distributed`: per-rank ``shard-0000R-…`` files, DCP_SHARDING_INFO, no index)
and with ``enable_consolidation=True`` (`dcp-safetensors`: ``sharded/`` and the consolidated files).

Oracle: torch's own ``consolidate_safetensors_files`` of the per-rank shards, tensor for tensor, bit-exact (not file
bytes). Careless copies: the first rank's shard missing; the consolidated file missing (the consolidation did not
finish). Hostile ones: a shard's DCP_SHARDING_INFO that makes chunks overlap, a tensor name carrying an escape
sequence."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures import fixture_path
from tests.util import ckpt_tui

SHARDS = ["shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]


def _oracle(shards: Path, tmp_path: Path) -> dict:
    """torch's consolidate_safetensors_files of the per-rank shards in ``shards``, read back."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

    names = set()
    for s in SHARDS:
        names |= set(load_file(shards / s))
    out = tmp_path / "oracle"
    out.mkdir(exist_ok=True)
    consolidate_safetensors_files(str(shards), str(out), {n: 1 for n in names})
    got = {}
    for f in out.glob("*.safetensors"):
        got.update(load_file(f))
    assert len(got) == len(names) >= 17
    return got


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k


def _inspect(path: Path, cwd: Path) -> dict:
    r = ckpt_tui("inspect", str(path), "--json", cwd=cwd)
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def _export(path: Path, out: Path, cwd: Path):
    r = ckpt_tui("export", str(path), "--out", str(out), cwd=cwd)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


def _copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_path(name), d)
    return d


# ---------------------------------------------------------------------------------------------- as written


def test_the_three_layouts_are_recognised_with_no_finding(tmp_path):
    doc = _inspect(fixture_path("hf-storage-distributed"), tmp_path)
    assert doc["findings"] == [] and doc["components"] == {"model": "."}, doc["findings"]
    assert "2 ranks" in doc["summary"] and "66K params" in doc["summary"], doc["summary"]
    doc = _inspect(fixture_path("hf-storage-single"), tmp_path)
    assert doc["findings"] == [] and doc["components"] == {"model": "model.safetensors.index.json"}
    assert doc["summary"].startswith("Hugging Face model"), doc["summary"]
    doc = _inspect(fixture_path("dcp-safetensors"), tmp_path)  # consolidated: the model is the consolidated files
    assert doc["findings"] == [] and doc["components"] == {"model": "model.safetensors.index.json"}, doc


def test_tensors_lists_the_whole_tensors_of_the_per_rank_shards(tmp_path):
    r = ckpt_tui("tensors", str(fixture_path("hf-storage-distributed")), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = {t["name"]: t["shape"] for t in json.loads(r.stdout)["tensors"]}
    want = _oracle(fixture_path("hf-storage-distributed"), tmp_path)
    assert listed == {k: list(v.shape) for k, v in want.items()}


@pytest.mark.parametrize("name", ["hf-storage-distributed", "dcp-safetensors"])
def test_export_equals_torch_s_consolidation_bit_exact_and_verifies(name, tmp_path):
    src = fixture_path(name)
    shards = src if name == "hf-storage-distributed" else src / "sharded"
    want = _oracle(shards, tmp_path)
    r = _export(src, tmp_path / "out", tmp_path)
    assert r.returncode == 0, r.stderr
    _same(load_file(tmp_path / "out" / "model.safetensors"), want)
    r = ckpt_tui("verify", str(tmp_path / "out"), "--against", str(src), cwd=tmp_path)
    assert r.returncode == 0 and "0 mismatched, 0 missing" in r.stdout, r.stdout + r.stderr
    if name == "dcp-safetensors":  # and torch's own consolidated files are what it consolidates
        _same(load_file(src / "model-00001-of-00001.safetensors"), want)


def test_the_single_layout_exports_its_whole_tensors(tmp_path):
    src = fixture_path("hf-storage-single")
    r = _export(src, tmp_path / "out", tmp_path)
    assert r.returncode == 0, r.stderr
    _same(load_file(tmp_path / "out" / "model.safetensors"), load_file(src / "model-00001-of-00001.safetensors"))
    # the same model as the distributed save of the same run
    _same(load_file(tmp_path / "out" / "model.safetensors"), _oracle(fixture_path("hf-storage-distributed"), tmp_path))


# ---------------------------------------------------------------------------------------------- careless


def test_a_missing_rank_s_shard_is_shard_missing_and_export_refuses(tmp_path):
    d = _copy("hf-storage-distributed", tmp_path)
    (d / SHARDS[0]).unlink()  # rank 0's file did not arrive
    doc = _inspect(d, tmp_path)
    codes = {f["code"]: f for f in doc["findings"]}
    assert "shard-missing" in codes and codes["shard-missing"]["severity"] == "error", doc["findings"]
    assert "shard-00001-model-" in codes["shard-missing"]["message"]
    assert "dcp-chunk-gap" in codes  # and what it leaves unwritten, per tensor
    r = _export(d, tmp_path / "out", tmp_path)
    assert r.returncode == 1 and "do not make whole tensors" in r.stderr and not (tmp_path / "out").exists()


def test_consolidation_that_did_not_finish_exports_the_shards(tmp_path):
    d = _copy("dcp-safetensors", tmp_path)
    (d / "model-00001-of-00001.safetensors").unlink()
    doc = _inspect(d, tmp_path)
    assert doc["components"] == {"model": "sharded"}, doc["components"]
    (f,) = [f for f in doc["findings"] if f["code"] == "index-mismatch"]
    assert f["severity"] == "error" and "did not finish" in f["message"]
    assert f["command"] == f"ckpt-tui export {d} --out DIR"
    r = _export(d, tmp_path / "out", tmp_path)  # the command as printed, DIR chosen
    assert r.returncode == 0, r.stderr
    _same(load_file(tmp_path / "out" / "model.safetensors"), _oracle(d / "sharded", tmp_path))


# ---------------------------------------------------------------------------------------------- hostile


def _rewrite_header(path: Path, change) -> None:
    """``path`` with its JSON header ``change(header)``d, the data block as it was."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    change(head)
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def test_sharding_info_that_makes_chunks_overlap_is_refused(tmp_path):
    d = _copy("hf-storage-distributed", tmp_path)

    def overlap(head):
        info = json.loads(head["__metadata__"]["DCP_SHARDING_INFO"])
        info["embed_tokens.weight"]["saved_offsets"] = [64, 0]  # rank 1's rows moved onto rank 0's
        head["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)

    _rewrite_header(d / SHARDS[1], overlap)
    doc = _inspect(d, tmp_path)
    (f,) = [f for f in doc["findings"] if f["code"] == "dcp-chunk-gap"]
    assert f["severity"] == "error" and "embed_tokens.weight" in f["message"], f["message"]
    r = _export(d, tmp_path / "out", tmp_path)
    assert r.returncode == 1 and "embed_tokens.weight" in r.stderr and not (tmp_path / "out").exists()


def test_a_tensor_name_with_an_escape_sequence_is_shown_visibly(tmp_path):
    d = _copy("hf-storage-distributed", tmp_path)
    evil = "norm.weight\x1b]0;pwned\x07"

    def rename(head):
        head[evil] = head.pop("norm.weight")
        info = json.loads(head["__metadata__"]["DCP_SHARDING_INFO"])
        info[evil] = info.pop("norm.weight")
        head["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)

    for s in SHARDS:
        _rewrite_header(d / s, rename)
    for args in (("inspect", str(d)), ("tensors", str(d))):
        r = ckpt_tui(*args, cwd=tmp_path)
        assert r.returncode in (0, 1) and "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
    r = ckpt_tui("tensors", str(d), cwd=tmp_path)
    assert "norm.weight\\x1b]0;pwned\\x07" in r.stdout, r.stdout
