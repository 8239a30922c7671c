"""verify's reference for the DCP layouts torch's loader cannot read in one process: rank-local metadata
only (torch alone reads rank 0's chunks: the reference said 16 of 17 tensors mismatched a bit-exact export)
and data files written with serialization_format=SAFETENSORS (torch's FileSystemReader torch.load's them and
raised a CheckpointException, a BaseException, which escaped as every rank's traceback)."""

import subprocess
import sys

import pytest
from safetensors import safe_open

LAYOUTS = {
    "dcp-ranklocal": "torch.distributed.checkpoint",
    "dcp-fs-safetensors": "safetensors (the .distcp files are safetensors files)",
}


def cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_verify_agrees_with_a_bit_exact_export_and_says_nothing_of_torch(name, real_ckpt, tmp_path):
    src = real_ckpt(name)
    assert cli("export", str(src), "--out", "out", cwd=tmp_path).returncode == 0
    r = cli("verify", "out", "--against", str(src), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"17 tensors compared with {LAYOUTS[name]}: 0 mismatched, 0 missing" in r.stdout, r.stdout
    # torch's fallback warning (with its traceback) stays out of the user's terminal
    assert "Traceback" not in r.stderr and "Global metadata" not in r.stderr, r.stderr


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_verify_finds_one_changed_tensor(name, real_ckpt, tmp_path):
    # the reference reads every rank's chunks: a changed element in the export's second half is found
    src = real_ckpt(name)
    assert cli("export", str(src), "--out", "out", cwd=tmp_path).returncode == 0
    path = tmp_path / "out" / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    victim = next(k for k, t in tensors.items() if t.dim() == 2 and t.shape[0] > 1)
    tensors[victim][-1, -1] += 1.0  # the last row: rank 1's chunk of a tensor split along dim 0
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    r = cli("verify", "out", "--against", str(src), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 mismatched" in r.stdout and f"mismatch: {victim}" in r.stdout, r.stdout
