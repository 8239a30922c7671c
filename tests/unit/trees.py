"""Synthetic checkpoint trees for tests/unit, made from the real fixtures' checked-in headers.

``tree(variant, base)`` writes ``base/<variant>/`` from ``data/`` (see data/refresh.py): every
file at its real size, the bytes the inspector reads (zip directories, data.pkl, safetensors and
DCP headers, json, markers) at their real offsets, tensor payloads as sparse zeros. The helpers
below it are the corruptions the diagnose table applies to those real bytes. No torch.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
_MANIFEST: dict | None = None


def manifest() -> dict:
    global _MANIFEST
    if _MANIFEST is None:
        _MANIFEST = json.loads((DATA / "manifest.json").read_text())
    return _MANIFEST


def tree(variant: str, base: Path, name: str | None = None) -> Path:
    """Write fixture ``variant`` to ``base/<name or variant>/`` and return that folder."""
    root = Path(base) / (name or variant)
    for rel in manifest()[variant]["files"]:
        write_file(variant, rel, root / rel)
    return root


def write_file(variant: str, rel: str, dest: Path) -> Path:
    """File ``rel`` of fixture ``variant`` at ``dest``: its kept bytes at their offsets, holes sparse."""
    spec = manifest()[variant]["files"][rel]
    src = DATA / variant / rel
    kept = src.read_bytes() if src.exists() else b""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as f:
        pos = 0  # position in ``kept``
        at = 0  # position in the file
        for off, length in spec["holes"]:
            f.seek(at)
            f.write(kept[pos : pos + off - at])
            pos += off - at
            at = off + length
        f.seek(at)
        f.write(kept[pos:])
        f.truncate(spec["size"])  # a trailing hole stays sparse
    if len(kept) != spec["size"] - sum(h[1] for h in spec["holes"]) or dest.stat().st_size != spec["size"]:
        raise AssertionError(f"{variant}/{rel}: data/ does not match manifest.json; run data/refresh.py")
    return dest


def run_folder(variant: str, checkpoint: str, steps, base: Path) -> Path:
    """``base/run/``: an HF Trainer output_dir holding ``variant``'s ``checkpoint`` once per step as
    ``checkpoint-<step>/``, its trainer_state.json's global_step set to match."""
    run = Path(base) / "run"
    for step in steps:
        dest = run / f"checkpoint-{step}"
        os.renames(tree(variant, base, f".tmp-{step}") / checkpoint, dest)
        state = dest / "trainer_state.json"
        if state.exists():
            state.write_text(json.dumps({**json.loads(state.read_text()), "global_step": step}))
    return run


# ------------------------------------------------------------------ corruptions of real files


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def sparse_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def safetensors_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), n


def safetensors_data_bytes(path: Path) -> int:
    return Path(path).stat().st_size - 8 - safetensors_header(path)[1]


def rewrite_safetensors_header(path: Path, header: dict) -> None:
    """Give ``path`` this header, tensors laid out one after the other (payload: zeros)."""
    items = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}
    out, at = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            out[k] = v
            continue
        numel = 1
        for d in v["shape"]:
            numel *= d
        n = numel * items[v["dtype"]]
        out[k] = {**v, "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(out, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + at)


def zip_entry(path: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read(next(i for i in zf.infolist() if i.filename.endswith(suffix)))


def replace_zip_entry(path: Path, suffix: str, data: bytes) -> None:
    """Rewrite the torch zip at ``path`` with the entry ending in ``suffix`` replaced by ``data``;
    the other entries are copied raw (their payloads are the sparse zeros ``tree`` wrote)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(path) as src, open(path, "rb") as raw, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
        for i in src.infolist():
            if i.filename.endswith(suffix):
                body = data
            else:
                raw.seek(i.header_offset + 26)
                n, m = struct.unpack("<HH", raw.read(4))
                raw.seek(i.header_offset + 30 + n + m)
                body = raw.read(i.compress_size)
            dst.writestr(zipfile.ZipInfo(i.filename, i.date_time), body)
    Path(path).write_bytes(buf.getvalue())


def alias_storage(data_pkl: bytes, victim_key: str, target_key: str) -> bytes:
    """The data.pkl of a torch zip with the tensor on storage ``victim_key`` moved onto storage
    ``target_key``: two names then view one storage, as tied weights do. (torch pickles with
    protocol 2: no frames, so a string may change length.)"""
    puts = ("BINPUT", "LONG_BINPUT", "PUT")
    storage_memo: set = set()
    prev = None  # the last op that is not a memo put
    hits = []
    for op, arg, pos in pickletools.genops(data_pkl):
        if op.name in puts:
            if prev is not None and prev[0] == "GLOBAL" and str(prev[1]).endswith("Storage"):
                storage_memo.add(arg)
            continue
        # a persistent id is ('storage', <StorageType>, key, location, numel): the key follows the type
        after_type = prev is not None and (
            (prev[0] == "GLOBAL" and str(prev[1]).endswith("Storage"))
            or (prev[0] in ("BINGET", "LONG_BINGET", "GET") and prev[1] in storage_memo)
        )
        if after_type and op.name == "BINUNICODE" and arg == victim_key:
            hits.append(pos)
        prev = (op.name, arg)
    assert len(hits) == 1, f"storage key {victim_key!r} found {len(hits)} times"
    pos = hits[0]
    old = 1 + 4 + len(victim_key.encode())
    new = target_key.encode()
    return data_pkl[:pos] + b"X" + struct.pack("<I", len(new)) + new + data_pkl[pos + old :]


class Payload:
    """A pickle that would create ``canary`` if anything unpickled it freely."""

    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


def hostile_pickle(canary: Path) -> bytes:
    return pickle.dumps({"args": Payload(canary)}, protocol=2)
