"""Inspecting never runs code from a pickle: real torch.save files with a payload."""

import os
import pickle

import pytest
import torch

from ckpt_tui.core.formats import FormatError
from ckpt_tui.core.formats.torch_save import torchfile
from ckpt_tui.core.formats.unpickle import TensorRef, safe_loads
from ckpt_tui.core.report import inspect


class _Payload:
    def __init__(self, canary):
        self.canary = canary

    def __reduce__(self):
        return (open, (self.canary, "w"))


def test_payload_is_reported_and_never_run(tmp_path):
    canary = tmp_path / "canary"
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"w": torch.ones(3), "evil": _Payload(str(canary))}, ck / "model.pt")
    rep = inspect(ck)
    assert not canary.exists()
    unsafe = [f for f in rep.findings if f.code == "unsafe-pickle"]
    assert unsafe and unsafe[0].severity == "error"
    assert "open" in unsafe[0].message and unsafe[0].path == "model.pt"
    # trusting turns it into information, still without running it
    rep = inspect(ck, trust_pickles=True)
    assert [f.severity for f in rep.findings if f.code == "unsafe-pickle"] == ["info"]
    assert not canary.exists()


def test_plain_state_dict_reads_as_tensor_refs_without_data(tmp_path):
    p = tmp_path / "m.pt"
    sd = {"a": torch.zeros(4, 3, dtype=torch.bfloat16), "b": torch.nn.Parameter(torch.ones(2)), "n": torch.tensor(7)}
    sd["tied"] = sd["a"]
    torch.save(sd, p)
    tf = torchfile.read(p)
    assert not tf.unsafe
    a, b, n = tf.obj["a"], tf.obj["b"], tf.obj["n"]
    assert isinstance(a, TensorRef) and a.shape == (4, 3) and a.dtype == "bfloat16" and a.nbytes == 24
    assert b.shape == (2,) and b.dtype == "float32" and b.requires_grad
    assert n.shape == () and n.dtype == "int64"
    assert tf.obj["tied"].storage.key == a.storage.key


def test_truncated_and_zero_byte_torch_files(tmp_path):
    p = tmp_path / "m.pt"
    torch.save({"a": torch.randn(64, 64)}, p)
    data = p.read_bytes()
    for cut in (0, 10, len(data) // 2, len(data) - 10):
        q = tmp_path / f"cut{cut}.pt"
        q.write_bytes(data[:cut])
        with pytest.raises(FormatError) as e:
            torchfile.read(q)
        assert e.value.kind == "truncated", (cut, e.value)


def test_restricted_unpickler_rejects_garbage_without_crashing():
    for blob in (b"", b"\x80\x04garbage", pickle.dumps(os.system)[:-1], b"\x80\x02}q\x00(X"):
        with pytest.raises(FormatError):
            safe_loads(blob)
    up = safe_loads(pickle.dumps({"f": os.system}))
    assert up.unsafe == {"posix.system"} or up.unsafe == {"os.system"}
