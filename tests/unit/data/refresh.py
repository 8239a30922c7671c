"""Re-copy the checked-in headers of tests/unit from the real-framework fixtures.

    python tests/unit/data/refresh.py            # every variant in VARIANTS (generates missing fixtures)
    python tests/unit/data/refresh.py hf-fsdp1   # only these

For each file of a fixture (tests/fixtures.py, written by the real frameworks) this keeps the
bytes the inspector reads and records the rest as holes in manifest.json:

- torch zips (DeepSpeed model/optim states, rng_state, training_args.bin, .bin/.pt): everything
  but the tensor payloads (the ``<archive>/data/<key>`` entries' data): local headers, data.pkl,
  the central directory are kept byte for byte;
- safetensors: the 8-byte length and the JSON header; the data block is a hole;
- ``.distcp`` shards and ``.py`` scripts: one hole of the file's size (never read);
- everything else (DCP ``.metadata``, json, ``latest``, ...): verbatim.

``data/<variant>/<path>`` holds a file's kept bytes in order (absent when it has none);
tests/unit/trees.py writes them back at their offsets, the holes as sparse zeros, so a tree has
the real sizes and the real headers at their real offsets. After packing, each variant is
rebuilt and must give the same ``inspect()`` report as the real checkpoint.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

# variant -> why tests/unit needs it
VARIANTS = {
    "hf-fsdp1": "hf-trainer-fsdp (first user report), accelerate-fsdp, run folders, DCP corruptions",
    "hf-ds-zero2": "hf-trainer-deepspeed (second user report), run-folder, hf-trainer, unsafe-pickle",
    "ds-zero2-bf16": "deepspeed ZeRO-2, accelerate-deepspeed, latest and rank-file corruptions",
    "ds-zero2-3ranks": "rank files of another world size mixed into ds-zero2-bf16",
    "ds-zero2-frozen": "frozen-params (recorded frozen_param_shapes)",
    "ds-zero1-frozen": "frozen-params (ZeRO-1: not recorded, only in the module)",
    "ds-zero2-tied": "tied-weights (shared_params)",
    "lightning-ds-zero2": "lightning-deepspeed",
    "lightning-fsdp": "lightning-fsdp",
    "fsdp1-dcp": "dcp (model only)",
    "fsdp2-dcp": "dcp (model + optimizer)",
    "dcp-ranklocal": "dcp with rank-local __{rank}.metadata",
    "torchtitan": "torchtitan (CheckpointManager: step-1 full, step-2 model-only bf16)",
    "verl-fsdp2": "verl-fsdp (verl's FSDP2 DTensor rank files), its missing-rank and world-size findings",
    "verl-fsdp1": "verl-fsdp (verl's FSDP1 ShardedTensor rank files)",
    "universal-zero2": "universal",
    "hf-model-sharded": "hf-model (safetensors index), index-mismatch, mixed-dtypes, safetensors corruptions",
    "hf-model-bin": "hf-model (pytorch_model.bin)",
    "accelerate-save-state": "accelerate, safetensors-file",
    "fsdp-full": "fsdp-full",
    "fsdp-local": "fsdp-local",
    "megatron-legacy": "megatron-legacy, latest_checkpointed_iteration.txt",
    "megatron-dist": "megatron-dist (Megatron-Core dist_checkpointing, TP=2, stacked layers)",
    "megatron-dist-019": "megatron-core 0.19 (common_state/ entry, no common.pt): megatron-common-state, TP=2",
    "megatron-pp2": "megatron-core 0.19, PP=2: TP and PP from the chunk offsets and the args",
    "megatron-tp2pp2": "megatron-core 0.19, TP=2 x PP=2: TP and PP from the chunk offsets and the args",
    "megatron-hf-tp2": "a Llama-family megatron-core 0.19 GPT (TP=2, GQA, SwiGLU, args recorded): to-hf",
    "hf-killed-save": "checkpoint-incomplete (killed in _save_rng_state), rng-state-missing",
    "hf-rotation-killed": "checkpoint-incomplete (a rotation killed mid-delete)",
    "hf-model-only": "resume-model-only (save_only_model, one process)",
    "hf-ds-model-only": "resume-model-only (save_only_model under DeepSpeed)",
    "dcp-optim-nograd": "optimizer-state-missing (a parameter that never got a gradient)",
    "zero3-ungathered": "weights-empty (ungathered ZeRO-3 save_pretrained and torch.save)",
    "zero3-peft-ungathered": "weights-empty (ungathered and tensorless PEFT adapters)",
    "fsdp2-rank0-slice": "weights-empty (rank 0's FSDP2 slice beside the whole DCP)",
    "ds-zero3-bf16": "deepspeed ZeRO-3: no universal-info-missing, ZeRO-3 model-states files, resume-world-size",
    "plain-pt": "torch-file, lightning (.ckpt file), tied-weights in a torch file",
}


def _distcp_holes(path: Path, size: int) -> list[list[int]]:
    """A .distcp shard is never read but for its non-tensor entries (an optimizer's param_groups objects, which
    the inspector reads for the parameters they list): those byte ranges are kept, the rest is one hole each."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    try:
        meta = dcp.FileSystemReader(str(path.parent)).read_metadata()
    except Exception:
        return [[0, size]] if size else []
    kept = sorted(
        (st.offset, st.length)
        for idx, st in (meta.storage_data or {}).items()
        if st.relative_path == path.name and isinstance(meta.state_dict_metadata.get(idx.fqn), BytesStorageMetadata)
    )
    out, at = [], 0
    for off, length in kept:
        if off > at:
            out.append([at, off - at])
        at = max(at, off + length)
    if size > at:
        out.append([at, size - at])
    return out


def holes_of(path: Path, size: int) -> list[list[int]]:
    """[[offset, length], ...] of the bytes the inspector never reads."""
    name = path.name
    if name.endswith(".distcp"):
        return _distcp_holes(path, size)
    if name.endswith(".py"):
        return [[0, size]] if size else []
    if name.endswith(".safetensors"):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
        return [[8 + n, size - 8 - n]] if size > 8 + n else []
    if zipfile.is_zipfile(path):
        out = []
        with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
            for i in zf.infolist():
                if "/data/" not in i.filename or i.compress_size == 0:
                    continue  # keep data.pkl, byteorder, version, ...; holes only for tensor storages
                f.seek(i.header_offset)
                local = f.read(30)
                n, m = struct.unpack("<HH", local[26:30])
                out.append([i.header_offset + 30 + n + m, i.compress_size])
        return sorted(out)
    return []


def pack(src: Path, dest: Path) -> dict:
    files = {}
    shutil.rmtree(dest, ignore_errors=True)
    for p in sorted(src.rglob("*")):
        if p.is_dir() or p.is_symlink():
            continue
        rel = p.relative_to(src).as_posix()
        size = p.stat().st_size
        holes = holes_of(p, size)
        data = p.read_bytes()
        kept, pos = [], 0
        for off, length in holes:
            kept.append(data[pos:off])
            pos = off + length
        kept.append(data[pos:])
        blob = b"".join(kept)
        if blob:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(blob)
        files[rel] = {"size": size, "holes": holes}
    return files


def same_report(packed: Path, real: Path) -> bool:
    """inspect() says the same of the packed tree as of the real checkpoint (paths aside)."""
    from ckpt_tui.core.report import inspect

    def doc(root: Path) -> str:
        d = inspect(root).to_json()
        d.pop("path")
        return json.dumps(d, sort_keys=True).replace(str(root.resolve()), "<root>")

    return doc(packed) == doc(real)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.fixtures import fixture_path  # generates a missing fixture group with the real frameworks
    from tests.unit import trees

    manifest_path = HERE / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    variants = argv or list(VARIANTS)
    for variant in variants:
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}; add it to VARIANTS with the reason")
        manifest[variant] = {"why": VARIANTS[variant], "files": pack(fixture_path(variant), HERE / variant)}
    manifest = {k: manifest[k] for k in VARIANTS if k in manifest}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            kept = sum(p.stat().st_size for p in (HERE / variant).rglob("*") if p.is_file())
            same = same_report(trees.tree(variant, Path(tmp)), fixture_path(variant))
            print(
                f"{variant:24} {len(manifest[variant]['files']):4} files {kept:8} bytes kept  "
                f"{'same report' if same else 'REPORT DIFFERS'}",
                flush=True,
            )
            if not same:
                bad.append(variant)
    if bad:
        print(f"inspect() reads bytes that were made holes in: {', '.join(bad)}; fix holes_of()", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
