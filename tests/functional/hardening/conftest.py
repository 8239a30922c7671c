"""Shared by the hostile-input suite (issue 20).

Every test here runs under :func:`_nothing_written_outside`: the promise "no file outside the checkpoint and OUT
changes" checked around each test, not only where a test thinks to look.

Also the payload builders and the fixtures of the hostile pickles (a DCP ``.metadata`` whose payload hides after a
chunk-record-like string, torch zips with two ``data.pkl``), used by test_hostile_pickles.py and test_hostile_tui.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from ckpt_tui.core.formats.dcp import stream as dcp_stream

# ---- the guard: nothing outside the checkpoint and OUT changes ------------------------------------------------

# what a test may leave in its HOME: ckpt-tui's own cache of screened metadata digests (core/formats/pickles.py)
OWN_CACHE = (".cache", ".cache/ckpt-tui", ".cache/ckpt-tui/screened")
SENTINEL = {
    ".bashrc": b"echo hello\n",
    "victim.txt": b"precious\n",
    ".ssh/authorized_keys": b"ssh-ed25519 AAAA\n",
    "work/run/notes.md": b"# notes\n",
    "work/run/checkpoint-9/latest": b"global_step9",
}


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): its kind, mode, size, mtime and content digest."""
    out: dict[str, tuple] = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                out[rel] = ("other", st.st_mode, st.st_mtime_ns if not p.is_dir() else 0)
    return out


def _canaries(*roots: Path) -> list[str]:
    """Every entry named CANARY under ``roots`` (unreadable folders skipped; links not followed)."""
    return [
        os.path.join(d, n) for root in roots for d, dirs, files in os.walk(root) for n in dirs + files if n == "CANARY"
    ]


def guard_problems(guard: dict) -> list[str]:
    """What changed outside: files in the cwd ``elsewhere/``, in HOME (ckpt-tui's screened cache apart), the
    sentinel tree, and any CANARY under the test's folders."""
    problems = []
    left = sorted(_tree(guard["elsewhere"]))
    if left:
        problems.append(f"written into the working folder: {left}")
    home = [
        p for p in sorted(_tree(guard["home"])) if p not in OWN_CACHE and not p.startswith(".cache/ckpt-tui/screened/")
    ]
    if home:
        problems.append(f"written into HOME: {home}")
    now = _tree(guard["sentinel"])
    changed = sorted(k for k in set(now) | set(guard["before"]) if now.get(k) != guard["before"].get(k))
    if changed:
        problems.append(f"the sentinel tree outside changed: {changed}")
    canaries = _canaries(*guard["roots"])
    if canaries:
        problems.append(f"a payload ran: {canaries}")
    return problems


@pytest.fixture(autouse=True)
def _nothing_written_outside(request, tmp_path, tmp_path_factory, monkeypatch):
    """Around every hardening test: the working folder is a fresh empty ``elsewhere/`` (a relative write, such as
    the TUI's screenshot action, lands there), HOME a fresh empty folder (ckpt-tui's cache with it, the fixture
    cache kept where it is, so nothing is regenerated), and a sentinel tree of someone's files sits outside.
    After the test: ``elsewhere/`` and HOME hold nothing (ckpt-tui's screened-metadata cache apart), the sentinel
    is byte for byte as it was, and no file named CANARY exists under the test's folders."""
    from tests.fixtures import cache_dir

    fixtures = cache_dir()  # resolved before HOME moves
    base = tmp_path_factory.mktemp("guard")
    guard = {"elsewhere": base / "elsewhere", "home": base / "home", "sentinel": base / "sentinel"}
    for d in guard.values():
        d.mkdir()
    for rel, data in SENTINEL.items():
        p = guard["sentinel"] / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (guard["sentinel"] / "work" / "link-to-bashrc").symlink_to(guard["sentinel"] / ".bashrc")
    guard["before"] = _tree(guard["sentinel"])
    monkeypatch.setenv("CKPT_TUI_FIXTURE_CACHE", str(fixtures))
    monkeypatch.setenv("HOME", str(guard["home"]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(guard["home"] / ".cache"))
    monkeypatch.chdir(guard["elsewhere"])
    try:  # the fuzzer's hypothesis keeps its own files (.hypothesis/ in the cwd): the test tool's, not ckpt-tui's
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:
        set_hypothesis_home_dir = None
    if set_hypothesis_home_dir is not None:
        set_hypothesis_home_dir(base / "hypothesis")
        request.addfinalizer(lambda: set_hypothesis_home_dir(None))
    roots = [tmp_path, base]
    if "shared_tmp" in request.fixturenames:
        roots.append(request.getfixturevalue("shared_tmp"))
    guard["roots"] = roots
    yield guard
    problems = guard_problems(guard)
    assert not problems, "outside the checkpoint and OUT: " + "; ".join(problems)


# ---- hostile pickles: a real file plus the smallest change ----------------------------------------------------


class Payload:
    def __init__(self, canary):
        self.canary = str(canary)

    def __reduce__(self):
        return (open, (self.canary, "w"))


def _frame(piece: bytes) -> bytes:
    return b"\x95" + len(piece).to_bytes(8, "little") + piece


def _open_canary_ops(canary: Path) -> bytes:
    """GLOBAL builtins.open, ("<canary>", "w"), REDUCE, POP: creates the canary when unpickled; no memo slot."""
    p = str(canary).encode()
    return b"cbuiltins\nopen\nX" + len(p).to_bytes(4, "little") + p + b"X\x01\x00\x00\x00w\x86R0"


def metadata_payload_after_string(data: bytes, canary: Path) -> bytes:
    """A real framed ``.metadata`` with one frame added after its first chunk record: a BINBYTES string holding
    copies of that record, then the payload, then POP. Rewriting the records inside the string shortens it by
    exactly the payload's length, so a reader of the rewritten stream sees the payload as the string's bytes;
    pickle.load (and torch's DCP reader) runs it."""
    spans = dcp_stream.frames(data)
    first = dcp_stream.CHUNK_RE.search(data)
    assert spans and first, "the fixture's .metadata is framed and has regular chunk records"
    j = next(i for i, (lo, hi) in enumerate(spans) if lo <= first.end() <= hi)
    lo, hi = spans[j]
    core = _open_canary_ops(canary)

    def build(n: int, pay: bytes) -> tuple[bytes, int]:
        s = first.group(0) * n
        mine = b"B" + len(s).to_bytes(4, "little") + s + pay + b"0"
        pieces = (
            [data[a:b] for a, b in spans[:j]]
            + [data[lo : first.end()], mine, data[first.end() : hi]]
            + [data[a:b] for a, b in spans[j + 1 :]]
        )
        cand = data[:2] + b"".join(map(_frame, pieces))
        out, *_ = dcp_stream.compact(cand)
        return cand, len(mine) - len(out[2 + 2 * (j + 1)])  # how much the rewrite took out of the string

    for n in range(1, 64):
        _, k = build(n, core)
        if k >= len(core) + 2:
            pad = k - len(core)
            fill = b"N0" * (pad // 2) if pad % 2 == 0 else b"K\x000" + b"N0" * ((pad - 3) // 2)
            cand, k2 = build(n, core + fill)
            assert k2 == k == len(core + fill)
            return cand
    raise AssertionError("no record count fits the payload")


def _zip_entries(path: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _write_zip(path: Path, entries: list[tuple[str, bytes]]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names, on purpose
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            for name, data in entries:
                zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)


def two_data_pkl(path: Path, canary: Path) -> None:
    """Rewrite the real torch zip at ``path``: first ``P/sub/data.pkl`` (the file's own pickle, its storages under
    ``P/sub/data/``: what a reader of the first ``*/data.pkl`` sees), then the file as torch.save writes it with a
    payload added to its object: ``P/data.pkl``, the record torch.load picks (``P`` is the first entry's folder)."""
    import torch

    orig = _zip_entries(path)
    prefix = orig[0][0].split("/", 1)[0]
    benign = [
        (f"{prefix}/sub/{n[len(prefix) + 1 :]}", d)
        for n, d in orig
        if n == f"{prefix}/data.pkl" or n.startswith(f"{prefix}/data/")
    ]
    obj = torch.load(path, map_location="cpu", weights_only=False)  # our own trusted fixture, before the payload
    obj["zz_hook"] = Payload(canary)
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    with zipfile.ZipFile(buf) as zf:
        hostile = [(prefix + "/" + i.filename.split("/", 1)[1], zf.read(i)) for i in zf.infolist()]
    _write_zip(path, benign + hostile)


# ---- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture
def canary(tmp_path):
    return tmp_path / "CANARY"


@pytest.fixture
def dcp_hidden(real_ckpt, tmp_path, canary):
    """hf-fsdp1's checkpoint-2 with its model .metadata's payload hidden after a chunk-record-like string."""
    ck = tmp_path / "fsdp" / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", ck)
    meta = ck / "pytorch_model_fsdp_0" / ".metadata"
    meta.write_bytes(metadata_payload_after_string(meta.read_bytes(), canary))
    return ck


@pytest.fixture
def zip_two_pkl(real_ckpt, tmp_path, canary):
    """hf-ds-zero2's checkpoint-2 whose DeepSpeed model states hold two data.pkl, beside a plain torch file
    (its model.safetensors re-saved as pytorch_model.bin) holding two data.pkl."""
    import torch
    from safetensors.torch import load_file

    ck = tmp_path / "ds" / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    two_data_pkl(ck / "global_step2" / "mp_rank_00_model_states.pt", canary)
    single = tmp_path / "single"
    single.mkdir()
    torch.save(load_file(ck / "model.safetensors"), single / "pytorch_model.bin")
    two_data_pkl(single / "pytorch_model.bin", canary)
    return {"ds": ck, "single": single / "pytorch_model.bin"}
