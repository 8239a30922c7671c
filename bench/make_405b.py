"""A llama-405B-shaped torch.distributed.checkpoint folder: 1,024 ranks, 1,137 tensors, 1.16 M chunk records.

    python bench/make_405b.py [ROOT] [--ranks 1024] [--layers 126] [--check]

The model is Llama-3.1-405B as HF names it (``model.embed_tokens.weight``, 126 × ``model.layers.N.{self_attn.
{q,k,v,o}_proj, mlp.{gate,up,down}_proj}.weight`` + two RMSNorm weights, ``model.norm.weight``,
``lm_head.weight``; hidden 16384, intermediate 53248, 128 query heads and 8 KV heads of 128, vocab 128256),
bf16, saved flat (``dcp.save(model.state_dict())``) by FSDP2 on ``ranks`` ranks: every tensor is split along
dim 0 into ``ranks`` chunks. Where dim 0 does not divide (the 128,256-row embedding and head), the split is
torch's (``torch.chunk``, as FSDP2's ``Shard(0)`` does): chunks of ceil(rows / ranks) rows, the last one
shorter and the ranks past the end holding an empty chunk (0 rows, offset at the end of the dimension) —
each rank still records one chunk per tensor, so the metadata has ranks × tensors chunk records.

``.metadata`` is built from torch's own classes the way ``FileSystemWriter.finish`` builds it on the
coordinator: the chunk records come from the gathered local plans, ``storage_data`` from the gathered write
results, and a gather is a pickle round trip per rank (``all_gather_object``), so each rank's strings and
``torch.Size`` objects are its own (as in a real save; nothing is shared across ranks in the pickle memo).
Then ``pickle.dump(metadata, f)``. The 1,024 ``__{rank}_0.distcp`` files are sparse (``os.truncate``) to the
sizes the metadata declares (~812 GB). Cached: an existing folder with the same parameters is reused.
Not run in CI (it takes about a minute and ~3 GB of memory).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
BF16 = 2
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 16384, 53248, 128, 8, 128, 128256


def shapes(layers: int = 126) -> list[tuple[str, tuple[int, ...]]]:
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
            (p + "mlp.gate_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
        ]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def dim0_split(rows: int, ranks: int) -> list[tuple[int, int]]:
    """(offset, rows) of each rank's chunk, as ``torch.chunk`` / FSDP2 ``Shard(0)`` splits."""
    per = -(-rows // ranks)
    out = []
    for r in range(ranks):
        start = min(r * per, rows)
        out.append((start, min(per, rows - start)))
    return out


def folder(root: Path, ranks: int, layers: int) -> Path:
    return Path(root) / f"llama405b-r{ranks}-l{layers}"


def make(root: Path, ranks: int = 1024, layers: int = 126, *, force: bool = False) -> Path:
    d = folder(root, ranks, layers)
    if (d / ".metadata").is_file() and not force:
        return d  # cached: no torch import (a benchmark that measures the app must not pay for it)
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    d.mkdir(parents=True, exist_ok=True)
    tensors = shapes(layers)
    file_sizes = [0] * ranks
    plans = []  # per rank: [(fqn, offsets, sizes)]
    results = []  # per rank: [(fqn, offsets, index, file, offset, length)]
    splits = {shape[0]: dim0_split(shape[0], ranks) for _, shape in tensors}
    for r in range(ranks):
        plan, res = [], []
        name = f"__{r}_0.distcp"
        for fqn, shape in tensors:
            start, rows = splits[shape[0]][r]
            rest = shape[1:]
            offs = (start,) + (0,) * len(rest)
            sizes = (rows,) + rest
            length = rows * BF16
            for x in rest:
                length *= x
            plan.append((fqn, offs, sizes))
            res.append((fqn, offs, r, name, file_sizes[r], length))
            file_sizes[r] += length
        plans.append(plan)
        results.append(res)

    sdm: dict = {}
    bf16 = TensorProperties(dtype=torch.bfloat16)
    for fqn, shape in tensors:
        sdm[fqn] = TensorStorageMetadata(properties=bf16, size=torch.Size(shape), chunks=[])
    storage_data: dict = {}
    for r in range(ranks):
        # all_gather_object of the local plan: a pickle round trip, so this rank's objects are its own
        plan = pickle.loads(pickle.dumps([(fqn, torch.Size(o), torch.Size(s)) for fqn, o, s in plans[r]]))
        for fqn, offs, sizes in plan:
            sdm[fqn].chunks.append(ChunkStorageMetadata(offsets=offs, sizes=sizes))
    for r in range(ranks):
        res = pickle.loads(
            pickle.dumps(
                [
                    (
                        MetadataIndex(fqn=fqn, offset=torch.Size(o), index=idx),
                        _StorageInfo(relative_path=name, offset=off, length=length),
                    )
                    for fqn, o, idx, name, off, length in results[r]
                ]
            )
        )
        storage_data.update(res)
    del plans, results
    md = Metadata(state_dict_metadata=sdm, planner_data={fqn: (fqn,) for fqn, _ in tensors})
    md.version = "1.0.0"
    md.storage_data = storage_data
    md.storage_meta = StorageMeta(checkpoint_id=str(d), save_id=str(uuid.uuid4()))
    tmp = d / ".metadata.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(md, f)
    for r, size in enumerate(file_sizes):
        with open(d / f"__{r}_0.distcp", "wb") as f:
            os.truncate(f.fileno(), size)
    os.replace(tmp, d / ".metadata")
    return d


def describe(d: Path) -> dict:
    shards = sorted(d.glob("*.distcp"))
    return {
        "path": str(d),
        "metadata_bytes": (d / ".metadata").stat().st_size,
        "shard_files": len(shards),
        "declared_bytes": sum(p.stat().st_size for p in shards),
        "allocated_bytes": sum(p.stat().st_blocks * 512 for p in d.iterdir()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(HERE / "out" / "scale405b"))
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=126)
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--check", action="store_true", help="read .metadata back with torch's FileSystemReader")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    d = make(Path(a.root), a.ranks, a.layers, force=a.force)
    info = describe(d)
    info["build_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(info, indent=2))
    if a.check:
        from torch.distributed.checkpoint import FileSystemReader

        md = FileSystemReader(str(d)).read_metadata()
        print(
            f"torch FileSystemReader: {len(md.state_dict_metadata)} tensors, "
            f"{sum(len(m.chunks) for m in md.state_dict_metadata.values())} chunks, "
            f"{len(md.storage_data)} storage entries, version {md.version}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
