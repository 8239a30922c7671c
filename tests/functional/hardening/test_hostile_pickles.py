"""Pickles built to slip past the screen, each made from a real framework file plus the smallest change, and run
through every command that could hand them to a loader (issue 20, "Code runs"): no canary appears, each command
exits non-zero with a clear message and no traceback.

- a DCP ``.metadata`` whose payload sits right after a bytes string that looks like chunk records (the fast reader
  rewrote the records inside the string, the string then swallowed the payload, and the screen saw data);
- a torch zip with two ``data.pkl`` (``P/sub/data.pkl`` first, ``P/data.pkl`` the one torch.load reads), as a
  plain torch file and as DeepSpeed's ``mp_rank_00_model_states.pt``; duplicate names; entries outside the prefix;
- an ``OrderedDict`` stand-in changed by a BUILD in one file, which must not change how a later file reads;
- allowlisted callables asked for huge allocations, and a dict graph of shared children (bounded cost).
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt_tui.cli import main_group
from tests.functional.hardening.conftest import (  # the builders and fixtures live there, shared with the TUI's tests
    Payload,
    _open_canary_ops,
    _write_zip,
    _zip_entries,
    metadata_payload_after_string,
)


def cli(*args) -> tuple[int, str]:
    """Run one command in this process (torch is imported once): (exit code, stdout + stderr). An exception that
    escaped the command is a failure of this test (a traceback the user would see)."""
    res = CliRunner().invoke(main_group, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        raise AssertionError("".join(traceback.format_exception(res.exception)))
    return res.exit_code, res.output


def exported(fixture: Path, tmp_path: Path) -> Path:
    """A clean copy of ``fixture``'s checkpoint-2 exported (unverified) to ``tmp_path/o``: what verify compares a
    hostile source with."""
    clean = tmp_path / "clean"
    shutil.copytree(fixture / "checkpoint-2", clean)
    code, out = cli("export", clean, "--out", tmp_path / "o", "--no-verify")
    assert code == 0, out
    return tmp_path / "o"


def refused(code: int, out: str, *words: str) -> bool:
    return code != 0 and "Traceback" not in out and all(w in out for w in words)


# ---- DCP: the payload after a string of chunk-record bytes ----------------------------------------------------


def test_hidden_dcp_payload_is_what_pickle_load_runs(dcp_hidden, canary, tmp_path):
    """The input is what it claims: pickle.load of the .metadata (what DCP's reader does) creates the canary."""
    meta = dcp_hidden / "pytorch_model_fsdp_0" / ".metadata"
    code = f"import pickle; pickle.loads(open({str(meta)!r}, 'rb').read())"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert canary.exists()
    canary.unlink()


def test_hidden_dcp_payload_is_found_and_refused_by_every_command(dcp_hidden, canary, tmp_path):
    code, out = cli("inspect", dcp_hidden, "--json")
    doc = json.loads(out)
    unsafe = [f for f in doc["findings"] if f["code"] == "unsafe-pickle"]
    assert code == 1 and unsafe and unsafe[0]["path"] == "pytorch_model_fsdp_0"
    assert "builtins.open" in unsafe[0]["message"]
    for args in (
        ("export", dcp_hidden, "--out", tmp_path / "o1"),
        ("stats", dcp_hidden),
        ("diff", dcp_hidden, dcp_hidden),
    ):
        code, out = cli(*args)
        assert refused(code, out, "unsafe-pickle"), (args, code, out)
        assert not canary.exists(), args
    assert not (tmp_path / "o1").exists()


def test_hidden_dcp_payload_never_reaches_dcp_loader_in_verify(dcp_hidden, real_ckpt, canary, tmp_path):
    exported(real_ckpt("hf-fsdp1"), tmp_path)
    code, out = cli("verify", tmp_path / "o", "--against", dcp_hidden)
    assert refused(code, out, "unsafe-pickle"), out
    assert not canary.exists()


# ---- torch zips with two data.pkl ------------------------------------------------------------------------------


def test_two_data_pkl_is_what_torch_load_runs(zip_two_pkl, canary):
    code = f"import torch; torch.load({str(zip_two_pkl['single'])!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert canary.exists()
    canary.unlink()


def test_two_data_pkl_is_refused_by_every_command(zip_two_pkl, canary, tmp_path):
    single, ds = zip_two_pkl["single"], zip_two_pkl["ds"]
    for path, where in ((single, "."), (ds, "global_step2/mp_rank_00_model_states.pt")):
        code, out = cli("inspect", path, "--json")
        doc = json.loads(out)
        bad = [f for f in doc["findings"] if f["path"] == where and f["severity"] == "error"]
        assert code == 1 and bad, out
        assert "data.pkl" in bad[0]["message"], bad
    for args in (
        ("export", single, "--out", tmp_path / "o1"),
        ("export", ds, "--out", tmp_path / "o2"),
        ("stats", single),
        ("stats", ds),
        ("diff", single, ds),
        ("universal", ds, "--out", tmp_path / "u"),
        ("convert", ds, "--to", "torch-dcp", "--out", tmp_path / "c"),
        ("fix", ds, "--yes"),
    ):
        code, out = cli(*args)
        if args[0] == "fix":
            assert "Traceback" not in out and not canary.exists()
            continue
        assert refused(code, out, "data.pkl"), (args, code, out)
        assert not canary.exists(), args
    for d in ("o1", "o2", "u", "c"):
        assert not (tmp_path / d).exists(), d


def test_two_data_pkl_never_reaches_torch_load_or_zero_to_fp32_in_verify(zip_two_pkl, real_ckpt, canary, tmp_path):
    exported(real_ckpt("hf-ds-zero2"), tmp_path)
    for against in (zip_two_pkl["ds"], zip_two_pkl["single"]):
        code, out = cli("verify", tmp_path / "o", "--against", against)
        assert refused(code, out, "data.pkl"), out
        assert not canary.exists()


@pytest.mark.parametrize("shape", ["duplicate", "outside"])
def test_shadowed_and_stray_zip_entries_are_refused(real_ckpt, tmp_path, shape):
    """A second entry of the same name (which one a reader takes is the reader's choice), or one outside the folder
    every entry of a torch.save archive shares: refused before anything reads the pickle."""
    from ckpt_tui.core.formats import FormatError
    from ckpt_tui.core.formats.torch_save import torchfile

    src = real_ckpt("hf-ds-zero2") / "checkpoint-2" / "global_step2" / "mp_rank_00_model_states.pt"
    path = tmp_path / "mp_rank_00_model_states.pt"
    entries = _zip_entries(src)
    prefix = entries[0][0].split("/", 1)[0]
    pkl = dict(entries)[f"{prefix}/data.pkl"]
    if shape == "duplicate":
        entries.append((f"{prefix}/data.pkl", pkl))
    else:
        entries.append(("other/data.pkl", pkl))
    _write_zip(path, entries)
    with pytest.raises(FormatError) as e:
        torchfile.read(path)
    assert ("twice" if shape == "duplicate" else "outside") in str(e.value)


@pytest.fixture
def other_rank(real_ckpt, tmp_path, canary):
    """hf-ds-zero2's checkpoint-2 whose rank-1 optimizer states (a file inspect reads only the zip directory of)
    hold a payload: zero_to_fp32 and ds_to_universal torch.load every rank's file."""
    import torch

    ck = tmp_path / "ds" / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    opt = ck / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    sd = torch.load(opt, map_location="cpu", weights_only=False)  # our own trusted fixture, before the payload
    sd["zz_hook"] = Payload(canary)
    torch.save(sd, opt)
    return ck


def test_every_rank_file_is_screened_before_deepspeed_reads_it(other_rank, real_ckpt, canary, tmp_path):
    exported(real_ckpt("hf-ds-zero2"), tmp_path)
    code, out = cli("verify", tmp_path / "o", "--against", other_rank)
    assert refused(code, out, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "open"), out
    assert not canary.exists()
    code, out = cli("universal", other_rank, "--out", tmp_path / "u")
    assert refused(code, out, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"), out
    assert not canary.exists() and not (tmp_path / "u").exists()
    code, out = cli("convert", other_rank, "--to", "torch-dcp", "--out", tmp_path / "c")
    assert not canary.exists()


# ---- stand-ins hold no state shared between files ------------------------------------------------------------

# BUILD on the OrderedDict global itself, slot state {"items": builtins.set}: without a fresh stand-in per read,
# every later dict of that class in the process answers .items() with an empty set (its tensors vanish)
PLANT_ODICT = b"\x80\x02ccollections\nOrderedDict\nN}X\x05\x00\x00\x00itemscbuiltins\nset\ns\x86b."


def _replace_pickle(src: Path, dst: Path, pkl: bytes) -> None:
    """``src`` (a real torch zip) with its data.pkl replaced by ``pkl``: every other entry kept."""
    entries = _zip_entries(src)
    prefix = entries[0][0].split("/", 1)[0]
    _write_zip(dst, [(n, pkl if n == f"{prefix}/data.pkl" else d) for n, d in entries])


def test_a_planted_build_cannot_change_how_a_later_file_reads(real_ckpt, tmp_path):
    """A real rng_state file whose data.pkl BUILDs the OrderedDict class, read first; then the real model states
    file of the same checkpoint, in the same process: it reads exactly as it does alone."""
    ck = real_ckpt("hf-ds-zero2") / "checkpoint-2"
    planted = tmp_path / "rng_state_0.pth"
    _replace_pickle(ck / "rng_state_0.pth", planted, PLANT_ODICT)
    code = (
        "import sys, json\n"
        "from ckpt_tui.core.formats.torch_save import torchfile\n"
        "from ckpt_tui.core.formats.unpickle import iter_tensors\n"
        "def count(p):\n"
        "    return len(list(iter_tensors(torchfile.read(p).obj)))\n"
        "ms = sys.argv[1]\n"
        "alone = count(ms)\n"
        "try:\n"
        "    torchfile.read(sys.argv[2])\n"
        "except Exception:\n"
        "    pass\n"
        "print(json.dumps([alone, count(ms)]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(ck / "global_step2" / "mp_rank_00_model_states.pt"), str(planted)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    alone, after = json.loads(r.stdout)
    assert alone > 0 and after == alone


def test_a_planted_build_cannot_hide_a_checkpoints_parameters(real_ckpt, tmp_path):
    """The same through inspect: the planted file first in the scan beside the tag, the tag's facts unchanged."""
    ck = tmp_path / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    clean = json.loads(cli("inspect", ck, "--json")[1])
    _replace_pickle(ck / "rng_state_0.pth", ck / "aaa.pt", PLANT_ODICT)
    r = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "inspect", str(ck), "--json"], capture_output=True, text=True, timeout=120
    )
    doc = json.loads(r.stdout)

    def tag(d):
        return next(n["facts"] for n in d["nodes"] if n["path"] == "global_step2")

    assert tag(doc).get("module_params") == tag(clean).get("module_params") > 0
    assert tag(doc).get("param_count") == tag(clean).get("param_count")


# ---- bounded cost: allowlisted callables have caps; graphs are walked once per object -------------------------

COSTLY = {
    # 33 bytes: bytearray(2**31)
    "bytearray": b"\x80\x02cbuiltins\nbytearray\n\x8a\x05\x00\x00\x00\x80\x00\x85R.",
    # set(range(10**8))
    "set-range": b"\x80\x02cbuiltins\nset\ncbuiltins\nrange\nJ\x00\xe1\xf5\x05\x85R\x85R.",
    # torch.Size(range(3 * 10**8))
    "size-range": b"\x80\x02ctorch\nSize\ncbuiltins\nrange\nJ\x00\xa3\xe1\x11\x85R\x85R.",
    # set(a stand-in): iterating it through __getitem__ would never end
    "set-stub": b"\x80\x02cbuiltins\nset\ncargparse\nNamespace\n)R\x85R.",
    # frozenset of a list, 10,000 times over: each call within its cap, the file over its budget
    "budget": (
        b"\x80\x02cbuiltins\nfrozenset\nq\x00]q\x01(" + b"K\x01" * 1000 + b"e(" + b"h\x00h\x01\x85R" * 5000 + b"l."
    ),
}


def _dag(levels: int = 60) -> bytes:
    d: dict = {}
    for _ in range(levels):
        d = {"a": d, "b": d}
    return pickle.dumps(d, 2)


def test_costly_pickles_give_a_finding_quickly_under_a_memory_limit(real_ckpt, tmp_path):
    from tests.functional.hardening.test_corpus import ROOT

    rng = real_ckpt("hf-ds-zero2") / "checkpoint-2" / "rng_state_0.pth"
    cases = dict(COSTLY, dag=_dag())
    assert len(cases["bytearray"]) <= 33 and len(cases["dag"]) < 1400
    paths = []
    for name, pkl in cases.items():
        p = tmp_path / f"{name}.pt"
        _replace_pickle(rng, p, pkl)
        paths.append(p)
    r = subprocess.run(
        [sys.executable, "-m", "tests.functional.hardening.corpus_runner", "1024", "10", *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = {Path(d["path"]).stem: d for d in map(json.loads, r.stdout.splitlines())}
    for name in cases:
        assert got[name]["outcome"] == "ok", got[name]
        if name != "dag":
            assert "file-corrupt" in got[name]["codes"], got[name]


def test_the_cap_is_named_in_the_finding(real_ckpt, tmp_path):
    from ckpt_tui.core.formats import FormatError
    from ckpt_tui.core.formats.unpickle import MAX_BYTES, MAX_DIMS, MAX_ITEMS, safe_loads

    for name, cap in (("bytearray", MAX_BYTES), ("set-range", MAX_ITEMS), ("size-range", MAX_DIMS)):
        with pytest.raises(FormatError) as e:
            safe_loads(COSTLY[name])
        assert f"{cap:,}" in str(e.value), str(e.value)


def test_a_graph_of_shared_children_is_walked_once_per_object():
    from ckpt_tui.core.formats.unpickle import iter_tensors, safe_loads

    assert list(iter_tensors(safe_loads(_dag(60)).obj)) == []


def test_a_shared_graph_beside_the_weights_exports_and_verifies(real_ckpt, tmp_path):
    """A real model's weights saved with a 60-level graph of shared dicts beside them (2^60 paths): inspect, export
    and verify (torch.load, then its result walked) each visit every dict once and finish."""
    import signal

    import torch
    from safetensors.torch import load_file

    d: dict = {}
    for _ in range(60):
        d = {"a": d, "b": d}
    p = tmp_path / "pytorch_model.bin"
    torch.save({**load_file(real_ckpt("hf-ds-zero2") / "checkpoint-2" / "model.safetensors"), "graph": d}, p)

    def too_long(*_):
        raise TimeoutError("a walk per path")

    old = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(120)
    try:
        code, out = cli("export", p, "--out", tmp_path / "o")
        assert code == 0, out
        code, out = cli("verify", tmp_path / "o", "--against", p)
        assert code == 0 and "0 mismatched" in out, out
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    "name, rel", [("hf-fsdp1", "checkpoint-2/pytorch_model_fsdp_0"), ("hf-fsdp1", "checkpoint-2/optimizer_0")]
)
def test_dcps_reader_gets_the_metadata_ckpt_tui_unpickled(real_ckpt, name, rel):
    """Defence in depth: torch's DCP reader is handed the Metadata ckpt-tui's allowlist unpickler built with torch's
    own classes (equal to what pickle.load gives), and never unpickles the file itself."""
    import torch.distributed.checkpoint.filesystem as fs

    from ckpt_tui.core.formats import screen

    folder = real_ckpt(name) / rel
    want = pickle.loads((folder / ".metadata").read_bytes())  # our own trusted fixture
    reader = screen.dcp_reader(folder)
    real_load = fs.pickle.load
    fs.pickle.load = None  # torch's reader may not call it
    try:
        got = reader.read_metadata()
    finally:
        fs.pickle.load = real_load
    assert got.state_dict_metadata == want.state_dict_metadata and got.storage_data == want.storage_data
    assert got.planner_data == want.planner_data and got.storage_meta.load_id == reader.load_id


def test_the_fast_reader_never_takes_records_from_inside_a_string(real_ckpt, tmp_path):
    """A clean .metadata (no payload) with a string of chunk-record bytes: even when its bytes are known clean (the
    fast reader allowed), its facts are those of the read as written: the records inside the string are data."""
    from ckpt_tui.core.formats.dcp import reader as dcp
    from ckpt_tui.core.formats.unpickle import mark_screened_clean

    folder = tmp_path / "m"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2" / "pytorch_model_fsdp_0", folder)
    meta = folder / ".metadata"
    data = metadata_payload_after_string(meta.read_bytes(), tmp_path / "CANARY")
    core = _open_canary_ops(tmp_path / "CANARY")
    n = len(core)
    clean = b"N0" * (n // 2) if n % 2 == 0 else b"K\x000" + b"N0" * ((n - 3) // 2)  # no-ops, no net stack effect
    data = data.replace(core, clean, 1)  # the payload gone: a clean stream
    assert b"builtins" not in data
    want = dcp.read(folder)  # before: the original file
    meta.write_bytes(data)
    mark_screened_clean(data)
    got = dcp.read(folder)
    assert got.chunk_count == want.chunk_count and got.files == want.files and not got.unsafe
    assert [t.name for t in got.tensors] == [t.name for t in want.tensors]


def test_bytes_read_in_full_and_clean_get_the_fast_reader(real_ckpt, tmp_path, monkeypatch):
    """The fast reader still serves inspect for bytes already screened in full (its rewritten chunk runs folded:
    ChunkFold), and only for those: unknown bytes are read as written (TupleFold)."""
    from ckpt_tui.core.formats.dcp import reader as dcp
    from ckpt_tui.core.formats.dcp import stream as dcp_stream
    from ckpt_tui.core.formats.dcp.summary import TupleFold
    from ckpt_tui.core.formats.unpickle import mark_screened_clean

    meta = tmp_path / ".metadata"
    data = (real_ckpt("hf-fsdp1") / "checkpoint-2" / "pytorch_model_fsdp_0" / ".metadata").read_bytes()
    meta.write_bytes(data)

    def kinds():
        obj = dcp.read_metadata_summary(meta)[0]
        return {
            type(md.__dict__["chunks"])
            for md in obj.__dict__["state_dict_metadata"].values()
            if "chunks" in md.__dict__
        }

    with monkeypatch.context() as m:
        m.setattr(dcp, "screened_clean", lambda d: False)  # bytes never seen: the read as written
        assert kinds() == {TupleFold}
    mark_screened_clean(data)
    assert kinds() == {dcp_stream.ChunkFold}


# ---- defence in depth: torch's own reader as a second screen ----------------------------------------------------


@pytest.fixture
def ds_payload(real_ckpt, tmp_path, canary):
    """hf-ds-zero2's checkpoint-2 whose DeepSpeed model states carry a payload beside the weights (re-saved by
    torch), the way test_safe_loading.py builds it."""
    import torch

    ck = tmp_path / "ds" / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    ms = ck / "global_step2" / "mp_rank_00_model_states.pt"
    sd = torch.load(ms, weights_only=False)  # our own trusted fixture, before the payload
    sd["client_state_extra"] = Payload(canary)
    torch.save(sd, ms)
    return ck


def test_a_screen_that_missed_a_payload_is_caught_by_torchs_own_reader(
    ds_payload, real_ckpt, canary, tmp_path, monkeypatch
):
    """Were ckpt-tui's screen ever to pass a payload (here: made to pass everything), the loaders still read the
    file through torch's weights_only unpickler, which finds the global ckpt-tui's allowlist does not admit: verify
    refuses, no canary. DeepSpeed's zero_to_fp32 reads every file of the tag this way too."""
    from ckpt_tui.core.formats import screen
    from ckpt_tui.core.formats import unpickle as pickles

    exported(real_ckpt("hf-ds-zero2"), tmp_path)
    seeing = pickles.RestrictedUnpickler.find_class

    def blind(self, module, name):  # the first screen fails open: it reads the global and reports nothing
        found = seeing(self, module, name)
        self._result.unsafe.clear()
        return found

    monkeypatch.setattr(pickles.RestrictedUnpickler, "find_class", blind)
    monkeypatch.setattr(screen, "_SCREENED", {})
    code, out = cli("verify", tmp_path / "o", "--against", ds_payload)
    assert refused(code, out, "torch's own reader", "outside ckpt-tui's allowlist"), out
    assert not canary.exists()
    with pytest.raises(screen.ScreenError, match="io.open"):
        screen.torch_load(ds_payload / "global_step2" / "mp_rank_00_model_states.pt", map_location="cpu")
    assert not canary.exists()


def test_torchs_restricted_reader_reads_real_deepspeed_files(real_ckpt, monkeypatch):
    """On the files DeepSpeed writes (model states with ZeroStageEnum and LossScaler, optimizer states with
    fragment_address), the second screen is torch's weights_only unpickler, never the unrestricted one: the
    framework classes ckpt-tui's allowlist admits are the safe_globals torch is given."""
    import torch

    from ckpt_tui.core.formats import screen

    real_load = torch.load
    modes = []

    def load(f, *a, weights_only=None, **k):
        modes.append(weights_only)
        return real_load(f, *a, weights_only=weights_only, **k)

    monkeypatch.setattr(torch, "load", load)
    tag = real_ckpt("ds-resume-zero2") / "checkpoint" / "global_step2"
    files = sorted(tag.glob("*.pt"))
    assert len(files) >= 2
    for f in files:
        modes.clear()
        screen.torch_load(f, map_location="cpu")
        assert modes[-1] is True and False not in modes, (f.name, modes)
