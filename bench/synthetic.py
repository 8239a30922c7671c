"""A synthetic "scale" checkpoint: an HF Trainer + FSDP checkpoint saved by 1,024 ranks, ~1 TB declared.

Layout (what HF Trainer / Accelerate write with ``SHARDED_STATE_DICT``, optimizer left out)::

    checkpoint-1000/
      trainer_state.json                 {"global_step": 1000, ...}
      pytorch_model_fsdp_0/
        .metadata                        pickled torch.distributed.checkpoint Metadata
        __0_0.distcp ... __1023_0.distcp sparse files (os.truncate), sizes match .metadata

``.metadata`` is built from torch's own DCP classes and pickled exactly as
``FileSystemWriter.finish`` does (``pickle.dump(metadata, f)``), so
``FileSystemReader(path).read_metadata()`` reads it back. Each tensor is split along dim 0
into ``ranks`` equal chunks (FSDP-style); rank ``r``'s chunks are laid back to back in
``__{r}_0.distcp`` in key order. The shard files hold no data (holes), so building the
layout costs a few MB of disk whatever ``target_bytes`` says.

Keys are what Accelerate's ``save_fsdp_model`` writes: the model's state dict nested under
``"model"``, i.e. fqn ``model.model.layers.N.self_attn.q_proj.weight`` with planner_data
``("model", "model.layers.N.self_attn.q_proj.weight")``.

    python bench/synthetic.py [ROOT] [--ranks 1024] [--target-bytes 1099511627776] [--layers N] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import uuid
from pathlib import Path
from typing import Optional

BF16 = 2


def _shapes(target_bytes: int, ranks: int, layers: Optional[int]) -> list[tuple[str, tuple[int, ...]]]:
    """A Llama-like model of bf16 weights whose total is close to ``target_bytes``.

    Dim 0 of every tensor is a multiple of ``ranks`` so each rank gets an equal chunk.
    Few, large tensors (5 per layer) keep ``.metadata`` (which has ranks entries per tensor)
    at a few MB. Pass ``layers`` to fix the tensor count; the hidden size then scales.
    """

    def r(x: int) -> int:  # round up to a multiple of ranks
        return max(ranks, -(-x // ranks) * ranks)

    vocab = r(131072)

    def model_bytes(h: int, n: int) -> int:
        inter = r(h * 3)
        per_layer = 2 * h * h + 2 * h * h // 4 + 3 * inter * h  # q,o + k,v (GQA 4x) + gate,up,down
        return (n * per_layer + 2 * vocab * h) * BF16

    if layers is None:
        layers = 16 if target_bytes >= (1 << 36) else 4
    # hidden size: the largest multiple of ranks whose model fits target_bytes
    lo, hi = 1, 1
    while model_bytes(hi * ranks, layers) <= target_bytes:
        hi *= 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if model_bytes(mid * ranks, layers) <= target_bytes:
            lo = mid
        else:
            hi = mid - 1
    h = max(1, lo) * ranks
    inter = r(h * 3)
    kv = r(h // 4)
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.kv_proj.weight", (2 * kv, h)),  # k and v fused: one tensor instead of two
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_up_proj.weight", (2 * inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
    out.append(("lm_head.weight", (vocab, h)))
    return out


def make_scale_layout(
    root: Path, ranks: int = 1024, target_bytes: int = 1 << 40, *, layers: Optional[int] = None, step: int = 1000
) -> Path:
    """Write ``root/checkpoint-{step}`` (see module doc) and return its path."""
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

    ckpt = Path(root) / f"checkpoint-{step}"
    model_dir = ckpt / "pytorch_model_fsdp_0"
    model_dir.mkdir(parents=True, exist_ok=True)

    sdm: dict = {}
    planner_data: dict = {}
    storage_data: dict = {}
    file_names = [f"__{rank}_0.distcp" for rank in range(ranks)]
    file_sizes = [0] * ranks
    for inner, shape in _shapes(target_bytes, ranks, layers):
        fqn = "model." + inner
        planner_data[fqn] = ("model", inner)
        rows = shape[0] // ranks
        rest = tuple(shape[1:])
        row_bytes = BF16
        for d in rest:
            row_bytes *= d
        length = rows * row_bytes
        chunk_sizes = torch.Size((rows, *rest))
        chunks = []
        for rank in range(ranks):
            offsets = torch.Size((rank * rows, *([0] * len(rest))))
            chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=chunk_sizes))
            storage_data[MetadataIndex(fqn=fqn, offset=offsets)] = _StorageInfo(
                relative_path=file_names[rank], offset=file_sizes[rank], length=length
            )
            file_sizes[rank] += length
        sdm[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=torch.bfloat16), size=torch.Size(shape), chunks=chunks
        )

    md = Metadata(state_dict_metadata=sdm, planner_data=planner_data)
    # FileSystemWriter.finish: version, storage_data, storage_meta, then pickle.dump
    md.version = "1.0.0"
    md.storage_data = storage_data
    md.storage_meta = StorageMeta(checkpoint_id=str(model_dir), save_id=str(uuid.uuid4()))
    tmp = model_dir / ".metadata.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(md, f)
    os.replace(tmp, model_dir / ".metadata")

    for name, size in zip(file_names, file_sizes):
        with open(model_dir / name, "wb") as f:
            os.truncate(f.fileno(), size)

    (ckpt / "trainer_state.json").write_text(
        json.dumps(
            {
                "global_step": step,
                "epoch": 1.0,
                "max_steps": 10 * step,
                "log_history": [],
                "best_metric": None,
                "best_model_checkpoint": None,
                "is_world_process_zero": True,
            },
            indent=2,
        )
    )
    return ckpt


def describe(ckpt: Path) -> dict:
    d = Path(ckpt) / "pytorch_model_fsdp_0"
    shards = sorted(d.glob("*.distcp"))
    return {
        "path": str(ckpt),
        "metadata_bytes": (d / ".metadata").stat().st_size,
        "shard_files": len(shards),
        "declared_bytes": sum(p.stat().st_size for p in shards),
        "allocated_bytes": sum(p.stat().st_blocks * 512 for p in d.iterdir()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).parent / "out" / "scale"))
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--target-bytes", type=int, default=1 << 40)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--check", action="store_true", help="read .metadata back with torch's FileSystemReader")
    a = ap.parse_args(argv)
    ckpt = make_scale_layout(Path(a.root), a.ranks, a.target_bytes, layers=a.layers)
    info = describe(ckpt)
    print(json.dumps(info, indent=2))
    if a.check:
        from torch.distributed.checkpoint import FileSystemReader

        md = FileSystemReader(str(ckpt / "pytorch_model_fsdp_0")).read_metadata()
        print(
            f"torch FileSystemReader: {len(md.state_dict_metadata)} tensors, "
            f"{len(md.storage_data)} storage entries, version {md.version}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
