"""torch DCP written with torch's ZStandard extension (issue 25): FSDP2's model and optimizer in one
``FileSystemWriter(out, _extensions=[ZStandard()])`` save, on 2 gloo ranks (samples/torch_dcp.py `fsdp2-zstd`).

Oracle: torch's own ``dcp_to_torch_save`` of the folder (it needs ``zstandard``, ckpt-tui's dependency). The
careless and hostile copies: a shard cut short (file-truncated), `zstandard` not importable (one line, exit 1),
and a crafted entry whose zstd stream inflates without end (refused at the item's bound, not after memory ran out)."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export
from tests.fixtures import fixture_path
from tests.util import ckpt_tui

zstandard = pytest.importorskip("zstandard")

NAME = "fsdp2-zstd"


def _oracle(tmp_path: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(fixture_path(NAME)), str(tmp_path / "ref.pt"))
    return torch.load(tmp_path / "ref.pt", weights_only=False)  # our own fixture, converted by torch: trusted


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
    return out


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / NAME
    shutil.copytree(fixture_path(NAME), d)
    return d


def _clean(r) -> None:
    assert "Traceback" not in r.stdout + r.stderr and "internal error" not in r.stderr, r.stderr


def test_every_item_is_compressed_and_inspect_finds_nothing_wrong(tmp_path):
    meta = pickle.loads((fixture_path(NAME) / ".metadata").read_bytes())  # our fixture, torch's classes
    descs = {tuple(st.transform_descriptors or ()) for st in meta.storage_data.values()}
    assert descs == {("stream.zstd/1",)}  # what the producer wrote: every item through ZStandard
    r = ckpt_tui("inspect", str(fixture_path(NAME)), "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["findings"] == [], doc["findings"]
    assert doc["components"] == {"model": ".", "optimizer": "."}


def test_model_export_is_dcp_to_torch_save_bit_exact(tmp_path):
    res = export(fixture_path(NAME), tmp_path / "out")
    assert res.verified
    got = load_file(tmp_path / "out" / "model.safetensors")
    want = _flat(_oracle(tmp_path)["model"])
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
    # and verify, which compares with torch's own DCP loader reading the compressed folder
    r = ckpt_tui("verify", str(tmp_path / "out"), "--against", str(fixture_path(NAME)), cwd=tmp_path)
    assert r.returncode == 0 and f"✓ {len(want)} tensors compared" in r.stdout, r.stdout + r.stderr
    assert "0 mismatched, 0 missing" in r.stdout


def test_optimizer_export_with_its_hyper_parameters_is_torch_s(tmp_path):
    from tests.functional.core.test_optimizer_export_sources import check_against
    from tests.util import load_optimizer_export

    r = ckpt_tui(
        "export", str(fixture_path(NAME)), "--component", "optimizer", "--out", str(tmp_path / "o"), cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    sd = load_optimizer_export(tmp_path / "o")
    cfg = json.loads((tmp_path / "o" / "optimizer_config.json").read_text())
    assert cfg["source"] == "torch-dcp" and cfg["states"] == ["exp_avg", "exp_avg_sq"]
    ref = _oracle(tmp_path)["optimizer"]
    check_against(sd, cfg, ref, lambda fqn: fqn)  # every state bit-exact, lr/eps/betas/weight_decay equal
    assert [g["lr"] for g in cfg["param_groups"]] == [g["lr"] for g in ref["param_groups"]]


def test_without_zstandard_export_is_one_line_and_exit_1(tmp_path):
    """As on a machine where the dependency's import fails: neither zstandard nor pyzstd importable."""
    code = (
        "import sys; sys.modules['zstandard'] = None; sys.modules['pyzstd'] = None; "
        "from ckpt_tui.cli import main; sys.argv[0] = 'ckpt-tui'; main()"
    )
    for extra in ([], ["--component", "optimizer"]):
        r = subprocess.run(
            [sys.executable, "-c", code, "export", str(fixture_path(NAME)), "--out", str(tmp_path / "o"), *extra],
            capture_output=True,
            text=True,
        )
        _clean(r)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert "zstd-compressed" in lines[0] and "pip install 'zstandard>=0.22'" in lines[0], lines
        assert not (tmp_path / "o").exists()


def test_a_shard_cut_short_is_file_truncated_and_export_refuses(tmp_path):
    d = _copy(tmp_path)
    shard = sorted(d.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # killed mid-write
    r = ckpt_tui("inspect", str(d), "--json", cwd=tmp_path)
    _clean(r)
    codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert r.returncode == 1 and "file-truncated" in codes, codes
    for extra in ([], ["--component", "optimizer"]):
        r = ckpt_tui("export", str(d), "--out", str(tmp_path / "o"), *extra, cwd=tmp_path)
        _clean(r)
        assert r.returncode == 1 and not (tmp_path / "o").exists(), r.stderr


def _bomb(d: Path, pick) -> str:
    """Point the storage entry ``pick`` chooses at a crafted zstd frame appended to its shard: 256 MiB of
    zeros in a few kB. Returns the entry's key."""
    meta = pickle.loads((d / ".metadata").read_bytes())  # our own fixture, re-pickled with torch's classes
    index = next(i for i in meta.storage_data if pick(i.fqn))
    st = meta.storage_data[index]
    frame = zstandard.ZstdCompressor(level=19).compress(b"\0" * (256 << 20))
    shard = d / st.relative_path
    st.offset, st.length = shard.stat().st_size, len(frame)
    with open(shard, "ab") as f:
        f.write(frame)
    (d / ".metadata").write_bytes(pickle.dumps(meta))
    return index.fqn


@pytest.mark.parametrize(
    "pick,component",
    [
        (lambda fqn: fqn.startswith("model.") and fqn.endswith(".weight"), "model"),
        (lambda fqn: fqn.startswith("optimizer.state.") and fqn.endswith(".exp_avg"), "optimizer"),
        (lambda fqn: fqn.startswith("optimizer.param_groups.") and fqn.endswith(".lr"), "optimizer"),
    ],
    ids=["tensor", "optimizer-state", "hyper-parameter"],
)
def test_a_compression_bomb_is_refused_at_the_item_s_bound(tmp_path, pick, component):
    d = _copy(tmp_path)
    key = _bomb(d, pick)
    r = ckpt_tui("export", str(d), "--component", component, "--out", str(tmp_path / "o"), cwd=tmp_path)
    _clean(r)
    assert r.returncode == 1 and not (tmp_path / "o").exists(), r.stderr
    assert "inflates past" in r.stderr and "compression bomb" in r.stderr, r.stderr
    assert key.rsplit(".", 1)[-1] in r.stderr


def test_the_bound_is_the_chunk_s_bytes(tmp_path):
    """A tensor item may inflate to its chunk's bytes and a zip's slack, no further: an honest item passes,
    one 2 MiB over its chunk is refused (the reader torch gets, as export hands it)."""
    from ckpt_tui.core.formats import FormatError
    from ckpt_tui.core.formats.dcp.extensions import ZIP_SLACK, read_bounded

    big = zstandard.ZstdCompressor().compress(b"\0" * (ZIP_SLACK + 4096 + (2 << 20)))
    with pytest.raises(FormatError, match="inflates past"):
        read_bounded(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(big)), ZIP_SLACK + 4096, "x")
    ok = zstandard.ZstdCompressor().compress(b"\1" * 4096)
    assert read_bounded(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(ok)), 4096, "x") == b"\1" * 4096
