"""No silent wrong output: a checkpoint whose metadata is wrong in a way the loaders would paper over (a DCP
tensor whose chunks leave a gap, negative storage offsets, a safetensors header the safetensors library refuses)
is an error finding in inspect, a refused export (exit code 1, nothing written) and a clean `verify` message —
never a tensor filled from ``torch.empty``, a traceback, or "verified ✓" on a file the library will not read.

Each hostile input is a real framework-written file plus the smallest change: a DCP ``.metadata`` rewritten with
torch's own ``Metadata`` classes (a chunk removed, one duplicated, a storage offset made negative), a safetensors
file whose JSON header is rewritten."""

from __future__ import annotations

import copy
import json
import pickle
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_tui.core.formats import FormatError
from ckpt_tui.core.formats.dcp import reader as dcpfmt
from ckpt_tui.core.formats.safetensors import header as stfmt

TENSOR = "model.model.layers.0.self_attn.q_proj.weight"  # (64, 64), two chunks of 32 rows in hf-fsdp1


def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def clean(r) -> None:
    """A message and an exit code, never a traceback or an internal error."""
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr, r.stderr


def findings(path) -> tuple[int, list[dict]]:
    r = cli("inspect", path, "--json")
    clean(r)
    return r.returncode, json.loads(r.stdout)["findings"]


# ---- DCP ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_model(tmp_path_factory):
    """hf-fsdp1's model DCP folder, and a good export of it (for verify against the hostile copies)."""
    from tests.fixtures import fixture_path

    base = tmp_path_factory.mktemp("dcp")
    src = base / "good"
    shutil.copytree(fixture_path("hf-fsdp1") / "checkpoint-2" / "pytorch_model_fsdp_0", src)
    r = cli("export", src, "--out", base / "good-out")
    assert r.returncode == 0, r.stderr
    return src, base / "good-out"


def rewrite(src: Path, dest: Path, change) -> Path:
    """A copy of the DCP folder ``src`` whose .metadata is ``change(metadata)``, re-pickled (torch's classes)."""
    shutil.copytree(src, dest)
    meta = pickle.loads((dest / ".metadata").read_bytes())  # our own trusted fixture
    change(meta)
    (dest / ".metadata").write_bytes(pickle.dumps(meta))
    return dest


def drop_chunk(meta) -> None:
    del meta.state_dict_metadata[TENSOR].chunks[1]


def duplicate_chunk(meta) -> None:
    chunks = meta.state_dict_metadata[TENSOR].chunks
    chunks.append(copy.deepcopy(chunks[0]))


def storage_of(meta):
    return meta.storage_data[next(i for i in meta.storage_data if i.fqn == TENSOR)]


def test_dcp_chunk_gap_is_an_error_and_export_refuses(fsdp_model, tmp_path):
    src, good_out = fsdp_model
    gap = rewrite(src, tmp_path / "gap", drop_chunk)
    rc, fs = findings(gap)
    hits = [f for f in fs if f["code"] == "dcp-chunk-gap"]
    assert rc == 1 and hits and hits[0]["severity"] == "error" and TENSOR in hits[0]["message"]

    r = cli("export", gap, "--out", tmp_path / "out")
    clean(r)
    assert r.returncode == 1 and "dcp-chunk-gap" in r.stderr and not (tmp_path / "out").exists()
    with pytest.raises(FormatError, match="unwritten"):  # the source itself refuses, whoever asks (stats, TUI)
        from ckpt_tui.core.formats.dcp.source import dcp_source

        dcp_source(gap)

    r = cli("verify", good_out, "--against", gap)
    clean(r)
    assert r.returncode == 1 and "unwritten" in r.stderr


def test_dcp_chunk_overlap_is_reported_and_exported_as_torch_reads_it(fsdp_model, tmp_path):
    src, good_out = fsdp_model
    dup = rewrite(src, tmp_path / "dup", duplicate_chunk)
    rc, fs = findings(dup)
    hits = [f for f in fs if f["code"] == "dcp-chunk-overlap"]
    assert hits and hits[0]["severity"] == "warning" and TENSOR in hits[0]["message"]
    assert not [f for f in fs if f["severity"] == "error"]
    r = cli("export", dup, "--out", tmp_path / "out")
    clean(r)
    assert r.returncode == 0 and "verified" in r.stdout
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (good_out / "model.safetensors").read_bytes()


@pytest.mark.parametrize("field,value", [("offset", -5), ("length", -100)])
def test_dcp_negative_storage_offset_is_a_clean_error(fsdp_model, tmp_path, field, value):
    src, good_out = fsdp_model
    bad = rewrite(src, tmp_path / "bad", lambda m: setattr(storage_of(m), field, value))
    rc, fs = findings(bad)
    corrupt = [f for f in fs if f["code"] == "file-corrupt"]
    assert rc == 1 and corrupt and "negative" in corrupt[0]["message"]
    r = cli("export", bad, "--out", tmp_path / "out")
    clean(r)
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    r = cli("verify", good_out, "--against", bad)
    clean(r)
    assert r.returncode == 1 and "negative" in r.stderr


def test_dcp_chunk_outside_its_tensor_is_corrupt(fsdp_model, tmp_path):
    import torch

    def move(meta):
        meta.state_dict_metadata[TENSOR].chunks[1].offsets = torch.Size([48, 0])  # rows 48..80 of 64

    bad = rewrite(fsdp_model[0], tmp_path / "bad", move)
    rc, fs = findings(bad)
    assert rc == 1 and any(f["code"] == "file-corrupt" and "outside" in f["message"] for f in fs)
    r = cli("export", bad, "--out", tmp_path / "out")
    clean(r)
    assert r.returncode == 1


# the tiling check itself: (tensor shape, [(offsets, sizes)]) -> (gap, overlap)
COVER = [
    ((8, 4), [((0, 0), (4, 4)), ((4, 0), (4, 4))], (False, False)),  # FSDP: dim 0
    ((8, 4), [((0, 0), (4, 4)), ((4, 0), (3, 4))], (True, False)),
    ((8, 4), [((0, 0), (5, 4)), ((4, 0), (4, 4))], (False, True)),
    ((8, 4), [((0, 0), (4, 4)), ((4, 0), (4, 4)), ((8, 0), (0, 4))], (False, False)),  # torch.chunk's empty tail
    ((8, 4), [((0, 0), (8, 4)), ((3, 0), (0, 4))], (False, False)),  # an empty chunk overlaps nothing
    ((8, 4), [((0, 0), (4, 2)), ((0, 2), (4, 2)), ((4, 0), (4, 2)), ((4, 2), (4, 2))], (False, False)),  # TP x FSDP
    ((8, 4), [((0, 0), (4, 2)), ((0, 2), (4, 2)), ((4, 0), (4, 2))], (True, False)),
    ((8, 4), [((0, 0), (4, 2)), ((0, 2), (4, 2)), ((4, 0), (4, 2)), ((4, 2), (4, 2)), ((4, 2), (4, 2))], (False, True)),
    ((8, 4), [((0, 0), (8, 2)), ((0, 2), (4, 2)), ((4, 2), (4, 2))], (False, False)),  # irregular, exact
    ((8, 4), [((0, 0), (8, 2)), ((0, 2), (4, 2)), ((5, 2), (3, 2))], (True, False)),
    ((8, 4), [((0, 0), (8, 3)), ((0, 2), (8, 2))], (False, True)),
    ((8, 4), [((0, 0), (6, 3)), ((2, 1), (6, 3))], (True, True)),  # both: volume 36 of 32, two corners empty
    ((), [((), ())], (False, False)),
    ((), [], (True, False)),
    ((0, 4), [], (False, False)),
    ((2, 3, 4), [((0, 0, 0), (2, 3, 2)), ((0, 0, 2), (2, 3, 2))], (False, False)),
]


@pytest.mark.parametrize("shape,chunks,expect", COVER)
def test_tiling_check(shape, chunks, expect):
    offs = [o for o, _ in chunks]
    sizes = [s for _, s in chunks]
    assert dcpfmt.chunk_cover(shape, offs, sizes) == expect


@pytest.mark.parametrize("chunks", [[((0, -1), (8, 4))], [((0, 0), (8, 5))], [((0,), (8,))], [((0, 0.0), (8, 4))]])
def test_tiling_check_refuses_a_chunk_outside(chunks):
    with pytest.raises(FormatError):
        dcpfmt.chunk_cover((8, 4), [o for o, _ in chunks], [s for _, s in chunks])


# ---- safetensors --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_st() -> tuple[dict, bytes]:
    """A real safetensors file (transformers' save_pretrained shard): its header and its data block."""
    from tests.fixtures import fixture_path

    raw = (fixture_path("hf-model-sharded") / "model-00001-of-00005.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_st(path: Path, header_bytes: bytes, data: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
    return path


def first(h: dict) -> str:
    return next(k for k in h if k != "__metadata__")


def edit(fn):
    """A mutation of the parsed header (a deep copy), written back as JSON."""

    def go(h, data):
        h = copy.deepcopy(h)
        fn(h)
        return json.dumps(h).encode(), data

    return go


def raw_sub(old: str, new: str):
    """A mutation of the header's text (what JSON cannot say once parsed: duplicate keys, -0, NaN, bytes)."""

    def go(h, data):
        text = json.dumps(h)
        assert old in text
        return text.replace(old, new, 1).encode(), data

    return go


def entry(fn):
    return edit(lambda h: fn(h[first(h)]))


def set_offsets(fn):
    return entry(lambda e: e.__setitem__("data_offsets", fn(e["data_offsets"])))


def second_last(h):
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])
    return h[names[-1]]


MUTATIONS = {
    "as-written": edit(lambda h: None),
    "float-offsets": set_offsets(lambda o: [float(o[0]), float(o[1])]),
    "one-float-offset": set_offsets(lambda o: [o[0], float(o[1])]),
    "bool-offset": set_offsets(lambda o: [False, o[1]] if o[0] == 0 else [o[0], o[1]]),
    "string-offset": set_offsets(lambda o: [str(o[0]), o[1]]),
    "three-offsets": set_offsets(lambda o: [o[0], o[1], o[1]]),
    "offsets-object": set_offsets(lambda o: {"begin": o[0], "end": o[1]}),
    "negative-offset": set_offsets(lambda o: [o[0] - 4, o[1] - 4]),
    "huge-offset": set_offsets(lambda o: [o[0] + 2**64, o[1] + 2**64]),
    "float-shape": entry(lambda e: e.__setitem__("shape", [float(d) for d in e["shape"]])),
    "bool-shape": entry(lambda e: e.__setitem__("shape", [True] + e["shape"])),
    "string-shape": entry(lambda e: e.__setitem__("shape", [str(d) for d in e["shape"]])),
    "scalar-shape": entry(lambda e: e.__setitem__("shape", e["shape"][0])),
    "overflow-shape": entry(lambda e: e.__setitem__("shape", [2**32, 2**32, 4] + e["shape"])),
    "negative-shape": entry(lambda e: e.__setitem__("shape", [-d for d in e["shape"]])),
    "lowercase-dtype": entry(lambda e: e.__setitem__("dtype", e["dtype"].lower())),
    "unknown-dtype": entry(lambda e: e.__setitem__("dtype", "F12")),
    "dtype-not-string": entry(lambda e: e.__setitem__("dtype", 4)),
    "missing-dtype": entry(lambda e: e.pop("dtype")),
    "extra-field": entry(lambda e: e.__setitem__("note", {"any": [1, 2.5, None]})),
    "entry-as-array": edit(
        lambda h: h.__setitem__(first(h), [h[first(h)][k] for k in ("dtype", "shape", "data_offsets")])
    ),
    "entry-null": edit(lambda h: h.__setitem__(first(h), None)),
    "entry-string": edit(lambda h: h.__setitem__(first(h), "F32")),
    "metadata-int-value": edit(lambda h: h["__metadata__"].__setitem__("step", 3)),
    "metadata-null-value": edit(lambda h: h["__metadata__"].__setitem__("step", None)),
    "metadata-nested": edit(lambda h: h["__metadata__"].__setitem__("cfg", {"a": "b"})),
    "metadata-null": edit(lambda h: h.__setitem__("__metadata__", None)),
    "metadata-absent": edit(lambda h: h.pop("__metadata__")),
    "metadata-empty": edit(lambda h: h.__setitem__("__metadata__", {})),
    "metadata-list": edit(lambda h: h.__setitem__("__metadata__", [])),
    "metadata-empty-string": edit(lambda h: h.__setitem__("__metadata__", "")),
    "metadata-false": edit(lambda h: h.__setitem__("__metadata__", False)),
    "header-array": lambda h, data: (json.dumps([h]).encode(), data),
    "header-not-json": lambda h, data: (b"{" + json.dumps(h).encode(), data),
    "gap-between": lambda h, data: _gap(h, data),
    "gap-at-start": lambda h, data: (json.dumps(_shift_all(h, 8)).encode(), b"\0" * 8 + data),
    "trailing-bytes": lambda h, data: (json.dumps(h).encode(), data + b"\0" * 8),
    "short-data": lambda h, data: (json.dumps(h).encode(), data[:-4]),
    "overlap": lambda h, data: _overlap(h, data),
    "empty-tensor-inside": edit(lambda h: h.__setitem__("e", {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]})),
    "empty-tensor-at-end": lambda h, data: (
        json.dumps({**h, "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [len(data), len(data)]}}).encode(),
        data,
    ),
    "empty-tensor-at-start": edit(
        lambda h: h.__setitem__("e", {"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]})
    ),
    "size-mismatch": entry(lambda e: e.__setitem__("shape", e["shape"][:-1] + [e["shape"][-1] - 1])),
    "duplicate-tensor-name": lambda h, data: _duplicate_name(h, data),
    "duplicate-field": raw_sub('"dtype": ', '"dtype": "F32", "dtype": '),
    "duplicate-metadata": raw_sub('"__metadata__": ', '"__metadata__": {}, "__metadata__": '),
    "exponent-int": lambda h, data: (_offsets_text(h).replace("[0, ", "[0e0, ", 1).encode(), data),
    "negative-zero": lambda h, data: (_offsets_text(h).replace("[0, ", "[-0, ", 1).encode(), data),
    "nan": lambda h, data: (_offsets_text(h).replace("[0, ", "[NaN, ", 1).encode(), data),
    "leading-space": lambda h, data: (b"  " + json.dumps(h).encode(), data),
    "trailing-space": lambda h, data: (json.dumps(h).encode() + b"    ", data),
    "trailing-nul": lambda h, data: (json.dumps(h).encode() + b"\0", data),
    "invalid-utf8-name": lambda h, data: (json.dumps(h).encode().replace(b'"model.', b'"\xffmodel.', 1), data),
    "lone-surrogate-name": raw_sub('"model.', '"\\ud800model.'),
    "paired-surrogate-name": raw_sub('"model.', '"\\ud83d\\ude00model.'),
    "escape-in-name": raw_sub('"model.', '"\\u001b]0;x\\u0007model.'),
}


def _offsets_text(h: dict) -> str:
    return json.dumps(h).replace('"data_offsets": [0,', '"data_offsets": [0, ', 1)


def _shift_all(h: dict, k: int) -> dict:
    h = copy.deepcopy(h)
    for name, e in h.items():
        if name != "__metadata__":
            e["data_offsets"] = [e["data_offsets"][0] + k, e["data_offsets"][1] + k]
    return h


def _gap(h, data):
    """Every tensor after the first moved 8 bytes on (the data block grows by 8 zero bytes after the first)."""
    h = copy.deepcopy(h)
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])
    end0 = h[names[0]]["data_offsets"][1]
    for k in names[1:]:
        h[k]["data_offsets"] = [x + 8 for x in h[k]["data_offsets"]]
    return json.dumps(h).encode(), data[:end0] + b"\0" * 8 + data[end0:]


def _overlap(h, data):
    """The second tensor's first 4 bytes are the first tensor's last 4 (the data block 4 bytes shorter)."""
    h = copy.deepcopy(h)
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])
    end0 = h[names[0]]["data_offsets"][1]
    for k in names[1:]:
        h[k]["data_offsets"] = [x - 4 for x in h[k]["data_offsets"]]
    return json.dumps(h).encode(), data[: end0 - 4] + data[end0:]


def _duplicate_name(h, data):
    """The first tensor named twice in the text (JSON's last one wins in both parsers)."""
    text = json.dumps(h)
    name = first(h)
    frag = f'"{name}": {json.dumps(h[name])}'
    return text.replace(frag, frag + ", " + frag, 1).encode(), data


def library_accepts(path: Path) -> bool:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_slice(k)
        return True
    except SafetensorError:
        return False


def we_accept(path: Path) -> bool:
    try:
        stfmt.read_header(path)
        return True
    except FormatError:
        return False


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_safetensors_header_accepted_exactly_when_the_library_accepts_it(real_st, tmp_path, mutation):
    h, data = real_st
    header, block = MUTATIONS[mutation](h, data)
    path = write_st(tmp_path / "model.safetensors", header, block)
    assert we_accept(path) == library_accepts(path), mutation


def test_the_mutation_table_is_not_one_sided(real_st, tmp_path):
    """The table holds headers the library reads and headers it refuses (both sides are tested)."""
    h, data = real_st
    verdicts = set()
    for name, m in MUTATIONS.items():
        header, block = m(h, data)
        verdicts.add(library_accepts(write_st(tmp_path / f"{name}.safetensors", header, block)))
    assert verdicts == {True, False}


@pytest.mark.parametrize("mutation", ["float-offsets", "metadata-int-value"])
def test_safetensors_the_library_refuses_is_never_verified(real_st, tmp_path, mutation):
    """The issue's two inputs: inspect calls the file corrupt, export refuses it, verify says why."""
    h, data = real_st
    good = tmp_path / "good"
    good.mkdir()
    write_st(good / "model.safetensors", json.dumps(h).encode(), data)
    r = cli("export", good, "--out", tmp_path / "good-out")
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    header, block = MUTATIONS[mutation](h, data)
    write_st(bad / "model.safetensors", header, block)
    assert not library_accepts(bad / "model.safetensors")

    rc, fs = findings(bad)
    assert rc == 1 and [f for f in fs if f["code"] == "file-corrupt" and f["path"] == "model.safetensors"]
    r = cli("export", bad, "--out", tmp_path / "out")
    clean(r)
    assert r.returncode == 1 and "file-corrupt" in r.stderr and not (tmp_path / "out").exists()
    r = cli("verify", tmp_path / "good-out", "--against", bad)
    clean(r)
    assert r.returncode == 1 and "model.safetensors" in r.stderr


def test_safetensors_dtype_the_library_knows_but_ckpt_tui_does_not_read(real_st, tmp_path):
    """F8_E8M0 is a valid header (the library reads it): not corrupt, but ckpt-tui says it cannot list it."""
    h, data = real_st
    h = copy.deepcopy(h)
    e = h[first(h)]
    e["dtype"] = "F8_E8M0"
    e["shape"] = [e["data_offsets"][1] - e["data_offsets"][0]]
    path = write_st(tmp_path / "model.safetensors", json.dumps(h).encode(), data)
    assert library_accepts(path)
    with pytest.raises(FormatError, match="F8_E8M0") as err:
        stfmt.read_header(path)
    assert err.value.kind == "unreadable"


@pytest.mark.parametrize("gathered,protocol", [(True, 4), (False, 4), (True, 5), (True, 2)])
@pytest.mark.parametrize("change", ["none", "drop", "duplicate"])
def test_tiling_verdict_same_from_every_reader(tmp_path, monkeypatch, gathered, protocol, change):
    """The folding reader (rewritten records' tokens, or tuples) and the general reader give the same gaps and
    overlaps, over a 64-rank layout (dim-0 splits with empty tail chunks, a tensor-parallel split, a 0-d tensor)."""
    from tests.functional.core.test_dcp_metadata_reader import general_read, write_many_chunks

    folder = tmp_path / "dcp"
    write_many_chunks(folder, gathered=gathered, protocol=protocol)
    if change != "none":
        meta = pickle.loads((folder / ".metadata").read_bytes())  # our own trusted file
        for key in ("layers.0.tp", "emb.weight"):
            chunks = meta.state_dict_metadata[key].chunks
            if change == "drop":
                del chunks[3]
            else:
                chunks.append(copy.deepcopy(chunks[5]))
        (folder / ".metadata").write_bytes(pickle.dumps(meta, protocol=protocol))
    fast, slow = dcpfmt.read(folder), general_read(folder, monkeypatch)
    expect = [] if change == "none" else ["emb.weight", "layers.0.tp"]
    assert sorted(fast.chunk_gaps) == sorted(slow.chunk_gaps) == (expect if change == "drop" else [])
    assert sorted(fast.chunk_overlaps) == sorted(slow.chunk_overlaps) == (expect if change == "duplicate" else [])
