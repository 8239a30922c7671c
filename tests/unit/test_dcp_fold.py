"""The folds the DCP .metadata reader applies as records arrive, against the one-record-at-a-time rule: records
read the ordinary way (tuples) and records the rewrite took out (their pickled tokens)."""

import pytest

from ckpt_tui.core.formats.dcp.reader import storage_ends, storage_ends_fast
from ckpt_tui.core.formats.dcp.stream import ChunkFold, encode_offsets, encode_sizes
from ckpt_tui.core.formats.dcp.summary import TupleFold


def from_tokens(size, offs, sizes):
    pairs = [encode_offsets(o) for o in offs]
    return ChunkFold(size, [f for f, _ in pairs], [r for _, r in pairs], [encode_sizes(s) for s in sizes])


def slow_dims(size, states):
    dims = set()
    for s in states:
        for d, (o, z) in enumerate(zip(s["offsets"], s["sizes"])):
            if len(size) > d and (o != 0 or z != size[d]):
                dims.add(d)
    return dims


@pytest.mark.parametrize(
    "size,chunks",
    [
        ((8, 4), [((0, 0), (4, 4)), ((4, 0), (4, 4))]),  # dim 0
        ((8, 4), [((0, 0), (8, 2)), ((0, 2), (8, 2))]),  # dim 1 (tensor parallel)
        ((8, 4), [((0, 0), (4, 2)), ((0, 2), (4, 2)), ((4, 0), (4, 2)), ((4, 2), (4, 2))]),  # 2-D
        ((8, 4), [((0, 0), (8, 4))]),  # whole
        ((8, 4), [((0, 0), (8, 4)), ((0, 0), (8, 4))]),  # replicated
        ((5, 4), [((0, 0), (3, 4)), ((3, 0), (2, 4)), ((5, 0), (0, 4))]),  # uneven, an empty chunk past the end
        ((), [((), ())]),  # 0-d
        ((8, 4), []),  # no chunks
        ((8, 4), [((0,), (8,)), ((0, 0, 0), (8, 4, 1))]),  # ragged records: the general rule
    ],
)
@pytest.mark.parametrize("fold", [TupleFold, from_tokens], ids=["tuples", "tokens"])
def test_fold_chunks_dims_match_the_per_record_rule(size, chunks, fold):
    states = [{"offsets": o, "sizes": s} for o, s in chunks]
    got = fold(size, [o for o, _ in chunks], [s for _, s in chunks])
    assert got.split_dims == slow_dims(size, states)
    assert got.count == len(chunks) and got.offsets == {o for o, _ in chunks} and got.distinct == len(got.offsets)
    firsts = [o[:1] for o in got.offsets]  # the most distinct offsets sharing one first coordinate
    assert got.per_first == max((firsts.count(f) for f in firsts), default=0)


def slow_ends(states):
    files = {}
    for d in states:
        if d.get("relative_path") is None:
            continue
        end = int(d.get("offset") or 0) + int(d.get("length") or 0)
        files[d["relative_path"]] = max(files.get(d["relative_path"], -1), end)
    return files


@pytest.mark.parametrize(
    "states,fast",
    [
        (
            [
                {"relative_path": "a", "offset": 0, "length": 5},
                {"relative_path": "a", "offset": 5, "length": 5},
                {"relative_path": "b", "offset": 0, "length": 3},
            ],
            True,
        ),
        # the last entry of a file is not its furthest: the fast pass declines, the general one answers
        ([{"relative_path": "a", "offset": 5, "length": 5}, {"relative_path": "a", "offset": 0, "length": 5}], False),
        ([{"relative_path": "a", "length": 4}], True),  # no offset: 0
        ([{"offset": 1, "length": 2}], False),  # no path
        ([], True),
    ],
)
def test_storage_ends(states, fast):
    for step in (1, 2, 65_536):  # the fast pass works in slices: their seams must not matter
        files: dict = {}
        assert storage_ends_fast(states, files, step) is fast
        assert files == (slow_ends(states) if fast else {})
    files = {}
    storage_ends(states, files)
    assert files == slow_ends(states)
