"""The pickled-int codec the DCP .metadata rewrite folds records with, against what the pickler writes."""

import pickle

import pytest

from ckpt_tui.core.formats.dcp import stream as dcp_stream

VALUES = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40, -1, -(2**31), -(2**31) - 1, -(2**40)]


@pytest.mark.parametrize("v", VALUES)
def test_int_round_trip(v):
    tok = dcp_stream.encode_int(v)
    assert pickle.loads(b"\x80\x02" + tok + b".") == v  # what a pickler writes, read back by pickle
    assert dcp_stream.decode_ints(tok) == (v,)


@pytest.mark.parametrize(
    "values",
    [
        [0, 5, 300, 70000, 2**31 - 1],  # BININT1/2/BININT only: the C-level pass
        [0, 2**31, 2**33],  # LONG1 among them
        [3, -1],  # a negative BININT
        [],
    ],
)
def test_ints(values):
    assert dcp_stream._ints([dcp_stream.encode_int(v) for v in values]) == values


@pytest.mark.parametrize("t", [(), (7,), (0, 4096), (1, 2, 3), (1, 2, 3, 4)])
def test_tuples_as_the_pickler_writes_them(t):
    first, rest = dcp_stream.encode_offsets(t)
    assert dcp_stream.decode_ints(first) + dcp_stream.decode_ints(rest) == t
    sizes = dcp_stream.encode_sizes(t)
    assert dcp_stream.decode_ints(sizes) == t
    if 1 <= len(t) <= 3:  # the form the chunk pattern captures: the pickler's own ops (memoizing aside)
        assert pickle.dumps(t, 4)[11:-2] == first + rest == sizes
        assert pickle.loads(b"\x80\x02" + sizes + b".") == t


def test_frames():
    data = pickle.dumps({"a": list(range(100_000))}, protocol=4)
    spans = dcp_stream.frames(data)
    assert len(spans) > 1
    assert sum(b - a for a, b in spans) == len(data) - 2 - 9 * len(spans)
    assert dcp_stream.frames(pickle.dumps({"a": 1}, protocol=2)) is None
    assert dcp_stream.frames(data[:-5]) is None  # a frame longer than what is left
