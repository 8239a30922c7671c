"""The DCP ``.metadata`` reader that folds chunk records as they arrive (``dcp.read``) gives the facts torch's own
``FileSystemReader.read_metadata()`` gives, and the facts the general reader (every record kept) gives — on the
real fixtures and on a many-chunk metadata written with torch's classes (64 ranks, uneven, empty and 2-D chunks)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from ckpt_tui.core.formats.dcp import reader as dcpfmt
from ckpt_tui.core.formats.dcp import stream as dcp_stream
from ckpt_tui.core.formats.dcp import summary
from tests.fixtures import fixture_path

FIXTURES = ("fsdp2-dcp", "hf-fsdp2", "megatron-dist", "torchtitan", "dcp-mixed")


def _dcp_folders():
    out = []
    for name in FIXTURES:
        root = fixture_path(name)
        for m in sorted(root.rglob(".metadata")):
            out.append(pytest.param(m.parent, id=f"{name}/{m.parent.relative_to(root)}"))
    return out


def torch_facts(folder: Path) -> dict:
    """The facts, from torch's own reader and classes."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(folder)).read_metadata()
    tensors, offsets, dims, count, bytes_entries = {}, {}, set(), 0, []
    for key, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            size = tuple(m.size)
            tensors[key] = (size, str(m.properties.dtype).removeprefix("torch."))
            uniq = {tuple(c.offsets) for c in m.chunks}
            per_first: dict = {}
            for o in uniq:
                per_first[o[:1]] = per_first.get(o[:1], 0) + 1
            offsets[key] = (len(uniq), max(per_first.values(), default=0))
            count += len(m.chunks)
            for c in m.chunks:
                for d, (o, s) in enumerate(zip(c.offsets, c.sizes)):
                    if o != 0 or s != size[d]:
                        dims.add(d)
        else:
            bytes_entries.append(key)
    files: dict = {}
    for st in md.storage_data.values():
        files[st.relative_path] = max(files.get(st.relative_path, -1), st.offset + st.length)
    return {
        "tensors": tensors,
        "offsets": offsets,
        "split_dims": dims,
        "chunks": count,
        "bytes_entries": bytes_entries,
        "files": files,
    }


def our_facts(info: dcpfmt.DcpInfo) -> dict:
    return {
        "tensors": {t.name: (t.shape, t.dtype) for t in info.tensors},
        "offsets": dcpfmt.chunk_layout(info),
        "split_dims": info.chunk_dims,
        "chunks": info.chunk_count,
        "bytes_entries": info.bytes_entries,
        "files": info.files,
    }


def general_read(folder: Path, monkeypatch) -> dcpfmt.DcpInfo:
    """``dcp.read`` through the general reader (every record a stand-in), as before the folding reader."""

    def refuse(f, facts=None):
        raise summary.SummaryMismatch("forced")

    with monkeypatch.context() as m:
        m.setattr(dcpfmt, "load_dcp_summary", refuse)
        return dcpfmt.read(folder)


def assert_same(folder: Path, monkeypatch) -> None:
    info = dcpfmt.read(folder)
    assert our_facts(info) == torch_facts(folder)
    old = general_read(folder, monkeypatch)
    assert our_facts(info) == our_facts(old)
    assert (info.planner_data, info.version, info.unsafe, info.keys, info.metadata_bytes) == (
        old.planner_data,
        old.version,
        old.unsafe,
        old.keys,
        old.metadata_bytes,
    )
    assert dcpfmt.megatron_tensor_parallel(info) == dcpfmt.megatron_tensor_parallel(old)
    assert dcpfmt.megatron_stacked(info) == dcpfmt.megatron_stacked(old)


@pytest.mark.parametrize("folder", _dcp_folders())
def test_fixture_facts_equal_torch(folder, monkeypatch):
    assert_same(folder, monkeypatch)


def test_folding_reader_used_on_fsdp2():
    _, unsafe, _, storage = dcpfmt.read_metadata_summary(fixture_path("fsdp2-dcp") / ".metadata")
    assert storage is not None and not unsafe  # not the fallback


def write_many_chunks(
    folder: Path, ranks: int = 64, *, gathered: bool = True, base: int = 0, protocol: int = pickle.DEFAULT_PROTOCOL
) -> None:
    """A DCP .metadata of ``ranks`` ranks written with torch's classes as FileSystemWriter.finish does: tensors
    split on dim 0 (even, uneven with empty chunks past the end), one split on dim 1 (tensor-parallel), a 1-D and
    a 0-d tensor, a bytes entry; each rank's records its own objects (a pickle round trip, as gathered), or with
    ``gathered=False`` the chunks of one size sharing one ``torch.Size`` (a save without a process group keeps
    the planner's objects: the pickle refers back to the first). Each shard file's data starts at byte ``base``."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    shapes = {
        "emb.weight": (1000, 8),
        "layers.0.w": (128, 16),
        "layers.0.tp": (16, 256),
        "norm.weight": (256,),
        "step": (),
    }
    sdm: dict = {
        k: TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(s), []) for k, s in shapes.items()
    }
    sdm["extra"] = BytesStorageMetadata()
    storage: dict = {}
    shared: dict = {}  # one torch.Size per distinct chunk size, where not gathered
    sizes = [base] * ranks
    for r in range(ranks):
        name = f"__{r}_0.distcp"
        recs = []
        for k, s in shapes.items():
            if k == "step":
                if r:
                    continue
                offs, sz = (), ()
            else:
                d = 1 if k == "layers.0.tp" else 0
                per = -(-s[d] // ranks)
                start = min(r * per, s[d])
                offs = tuple(start if i == d else 0 for i in range(len(s)))
                sz = tuple(min(per, s[d] - start) if i == d else s[i] for i in range(len(s)))
            n = 4
            for x in sz:
                n *= x
            sz = torch.Size(sz) if gathered else shared.setdefault(sz, torch.Size(sz))
            recs.append((k, torch.Size(offs), sz, name, sizes[r], n))
            sizes[r] += n
        if r == 0:
            recs.append(("extra", None, None, name, sizes[r], 7))
            sizes[r] += 7
        if gathered:
            recs = pickle.loads(pickle.dumps(recs))
        for k, offs, sz, fname, off, n in recs:
            if offs is not None:
                sdm[k].chunks.append(ChunkStorageMetadata(offsets=offs, sizes=sz))
        res = [
            (MetadataIndex(k, offs, len(sdm[k].chunks) - 1 if offs is not None else None), _StorageInfo(fname, off, n))
            for k, offs, sz, fname, off, n in recs
        ]
        storage.update(pickle.loads(pickle.dumps(res)) if gathered else res)
    md = Metadata(state_dict_metadata=sdm, planner_data={k: (k,) for k in sdm})
    md.version = "1.0.0"
    md.storage_data = storage
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(md, f, protocol=protocol)
    for r, n in enumerate(sizes):
        with open(folder / f"__{r}_0.distcp", "wb") as f:
            os.truncate(f.fileno(), n)


def test_many_chunks_facts_equal_torch(tmp_path, monkeypatch):
    folder = tmp_path / "dcp64"
    write_many_chunks(folder)
    _, _, _, storage = dcpfmt.read_metadata_summary(folder / ".metadata")
    assert storage is not None  # the folding reader, not the fallback
    assert_same(folder, monkeypatch)
    info = dcpfmt.read(folder)
    assert info.chunk_count == 4 * 64 + 1 and info.chunk_dims == {0, 1}
    assert info.bytes_entries == ["extra"]


def test_unknown_global_still_a_finding(tmp_path):
    """A .metadata naming code outside the allowlist: the folding reader hands it to the general one, which
    records the global and runs nothing."""
    import pickletools

    folder = tmp_path / "evil"
    write_many_chunks(folder, ranks=2)
    data = (folder / ".metadata").read_bytes()
    bad = data.replace(b"\x8c\x08Metadata", b"\x8c\x08Mallware", 1)
    assert bad != data
    pickletools.dis(bad, out=open(os.devnull, "w"))  # still a well-formed stream
    (folder / ".metadata").write_bytes(bad)
    _, unsafe, _, storage = dcpfmt.read_metadata_summary(folder / ".metadata")
    assert storage is None and unsafe == {"torch.distributed.checkpoint.metadata.Mallware"}
    assert dcpfmt.read(folder).unsafe == unsafe


def compacted(folder: Path) -> tuple[int, int]:
    """(chunk records, storage entries) the rewrite took out of ``folder``'s .metadata."""
    _, nchunks, nstorage, _ = dcp_stream.compact((folder / ".metadata").read_bytes())
    return nchunks, nstorage


def assert_compacted(folder: Path) -> None:
    """The records of 1- to 3-d tensors went the fast way: all but the first of each kind and those a frame
    boundary cuts (a 0-d tensor's empty offsets, a bytes entry's missing ones: the ordinary way)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(folder)).read_metadata()
    regular = {
        k for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata) and 1 <= len(m.size) <= 3
    }
    chunks = sum(len(md.state_dict_metadata[k].chunks) for k in regular)
    entries = sum(1 for idx in md.storage_data if idx.fqn in regular)
    cut = 2 + (folder / ".metadata").stat().st_size // 65536
    nchunks, nstorage = compacted(folder)
    assert chunks - cut <= nchunks <= chunks and chunks
    assert entries - cut <= nstorage <= entries and entries


@pytest.mark.parametrize("folder", _dcp_folders())
def test_fixtures_are_compacted(folder):
    assert_compacted(folder)


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"ranks": 1100}, id="1100-ranks"),  # lists of over 1,000 records (APPENDS batches), many frames
        pytest.param({"ranks": 16, "gathered": False}, id="shared-sizes"),  # torch.Size references, not tuples
        pytest.param({"ranks": 8, "base": 3 << 31}, id="past-4GiB"),  # LONG1 offsets
        pytest.param({"ranks": 8, "protocol": 2}, id="protocol-2"),  # no frames: not rewritten
        pytest.param({"ranks": 8, "protocol": 0}, id="protocol-0"),  # text opcodes: read line by line
        pytest.param({"ranks": 64, "protocol": 5}, id="protocol-5"),
    ],
)
def test_compacted_facts_equal_torch(tmp_path, monkeypatch, kw):
    folder = tmp_path / "dcp"
    write_many_chunks(folder, **kw)
    assert_same(folder, monkeypatch)
    if kw.get("protocol") in (0, 2):
        assert compacted(folder) == (0, 0)
        assert dcpfmt.read_metadata_summary(folder / ".metadata")[3] is not None  # folded as written
    elif kw.get("gathered", True):
        assert_compacted(folder)
    else:  # most chunks' sizes refer to an earlier record's, which the rewrite takes out: folded as written
        nchunks, _ = compacted(folder)
        assert nchunks < kw["ranks"]
        assert dcpfmt.read_metadata_summary(folder / ".metadata")[3] is not None  # not the general reader
    info = dcpfmt.read(folder)
    assert info.chunk_count == 4 * kw["ranks"] + 1 and info.chunk_dims == {0, 1}
    assert max(info.files.values()) >= kw.get("base", 0)


def test_a_large_metadata_reports_progress_and_cancels(tmp_path, monkeypatch):
    """Inside a scan, reading a large .metadata reports its bytes (the scan's own progress otherwise sits still
    for seconds at 405B scale) and stops at the scan's cancel."""
    import threading

    from ckpt_tui.core.progress import Cancelled
    from ckpt_tui.core.scan import scan

    folder = tmp_path / "dcp"
    write_many_chunks(folder, ranks=1100)
    monkeypatch.setattr(dcpfmt, "PROGRESS_FROM", 0)
    seen = []
    scan(folder, on_progress=seen.append)
    reads = [p for p in seen if p.unit == "bytes"]
    assert {p.label for p in reads} == {"reading .metadata", "folding .metadata's records"}
    size = (folder / ".metadata").stat().st_size
    assert all(p.total and 0 <= p.done <= p.total for p in reads) and reads[0].total == size
    cancel = threading.Event()

    def stop_at_first_read(p):
        if p.unit == "bytes":
            cancel.set()

    with pytest.raises(Cancelled):
        scan(folder, on_progress=stop_at_first_read, cancel=cancel)
