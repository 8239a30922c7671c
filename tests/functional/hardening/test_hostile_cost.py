"""Bounded cost on any input (issue 20, point 5): one file's facts have a size cap in the report, and inspect
(the scan, the findings, the JSON document and the text report) does work linear in the number of files and
findings. Not timed: the work is counted (every Python and builtin call, through cProfile) at n and 4n files,
so a loaded machine cannot turn these red and a quadratic step cannot hide behind a fast one."""

import contextlib
import cProfile
import io
import json
import pstats
import shutil

import pytest
import torch

from ckpt_tui.core.formats.torch_save.format import MAX_KEY_CHARS, MAX_KEYS
from ckpt_tui.core.report import inspect

FACTS_CAP = 16 * 1024  # bytes of one node's facts in the JSON document, however the file is built


def test_a_torch_file_with_200k_keys_and_huge_keys_has_bounded_facts(real_ckpt, tmp_path):
    """The HF pytorch_model.bin re-saved with 200,000 extra top-level keys, the first few of them tuples that
    repeat one 1,000-character string 2,000 times (the pickle stores it once: a key costs ~4 kB in the file and
    2 MB as text): the `keys` fact lists MAX_KEYS keys, each cut to MAX_KEY_CHARS, and counts them all."""
    sd = torch.load(real_ckpt("hf-model-bin") / "pytorch_model.bin", weights_only=True)
    s = "k" * 1000
    big = {(i,) + (s,) * 2000: i for i in range(4)}
    big.update(sd)
    big.update({f"extra_{i}": i for i in range(200_000)})
    path = tmp_path / "pytorch_model.bin"
    torch.save(big, path)
    rep = inspect(path)
    node = rep.inventory.root
    facts = node.facts
    assert "error" not in facts, facts
    assert len(json.dumps(facts)) <= FACTS_CAP
    assert len(json.dumps(rep.to_json())) <= FACTS_CAP + 4096
    assert len(facts["keys"]) == MAX_KEYS and all(len(k) <= MAX_KEY_CHARS for k in facts["keys"])
    assert facts["keys"][0].startswith("(0, 'kkk") and facts["keys"][0].endswith("…")
    assert facts["keys_total"] == len(big)
    assert facts["tensor_count"] == len(sd)  # the weights are still read as before


def test_a_short_key_list_is_listed_whole_without_a_count(real_ckpt):
    facts = inspect(real_ckpt("hf-model-bin") / "pytorch_model.bin").inventory.root.facts
    assert len(facts["keys"]) == min(MAX_KEYS, facts["tensor_count"])
    assert ("keys_total" in facts) == (facts["tensor_count"] > MAX_KEYS)


def _calls(fn) -> int:
    """Every function call (Python and builtin) ``fn()`` makes."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    return sum(s[0] for s in pstats.Stats(prof).stats.values())


def _inspect_json(path):
    """What `ckpt-tui inspect --json` does: the scan, the findings and the JSON document."""
    from ckpt_tui.core.jsondoc import write_json

    rep = inspect(path)
    write_json(rep.to_json(), lambda piece: None, indent=2, ensure_ascii=False)
    return rep


def _print_text(rep) -> None:
    """What `ckpt-tui inspect` prints after the same scan."""
    from ckpt_tui.cli.output import print_report

    with contextlib.redirect_stdout(io.StringIO()):
        print_report(rep, False)


def _broken_copies(real, folder, names) -> None:
    """Files cut short while they were copied: the first 64 bytes of a real torch zip each."""
    head = real.read_bytes()[:64]
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(head)


def _flat(real, root, n):
    _broken_copies(real, root, [f"part_{i:06d}.bin" for i in range(n)])


def _beside_a_big_checkpoint(real, root, n):
    """checkpoint-1 with n broken files beside checkpoint-2 with n intact ones: each broken file's finding names
    the newest intact checkpoint beside it, which must not be searched again per file."""
    _broken_copies(real, root / "checkpoint-1", [f"part_{i:06d}.bin" for i in range(n)])
    ok = root / "checkpoint-2"
    ok.mkdir()
    cfg = (real.parent / "config.json").read_bytes()
    for i in range(n):
        (ok / f"config_{i:06d}.json").write_bytes(cfg)


def _many_checkpoints(real, root, n):
    """n/10 checkpoints of a run, ten broken files each."""
    for c in range(n // 10):
        _broken_copies(real, root / f"checkpoint-{c + 1}", [f"part_{i}.bin" for i in range(10)])
    (root / "checkpoint-1" / "model.safetensors").write_bytes(b"")


@pytest.mark.parametrize("build, text", [(_flat, True), (_beside_a_big_checkpoint, False), (_many_checkpoints, False)])
def test_inspect_work_is_linear_in_files_and_findings(real_ckpt, tmp_path, build, text):
    """The JSON document for each shape of tree; the text report (which prints every finding) for one."""
    real = real_ckpt("hf-model-bin") / "pytorch_model.bin"
    n = 150
    small, large = tmp_path / "small", tmp_path / "large"
    build(real, small, n)
    build(real, large, 4 * n)
    _print_text(_inspect_json(small))  # imports and first-use caches out of the count
    reps = {}
    a, b = (_calls(lambda p=p: reps.setdefault(p, _inspect_json(p))) for p in (small, large))
    # linear: 4x the files is at most ~4x the calls (fixed costs make it less); a quadratic step makes it up to 16x
    assert b <= 4.5 * a, ("inspect --json", a, b, b / a)
    if text:
        ta, tb = (_calls(lambda p=p: _print_text(reps[p])) for p in (small, large))
        assert tb <= 4.5 * ta, ("inspect", ta, tb, tb / ta)
    shutil.rmtree(large)


def test_a_config_json_of_huge_values_has_bounded_facts(real_ckpt, tmp_path):
    """The real config.json with `architectures` a list of 10,000 strings of 1,000 characters (10 MB, under the
    16 MB a JSON file may have) and `model_type` one 1 MB string: the facts quote them cut, not in full."""
    from ckpt_tui.core.formats.plain.format import MAX_FACT_CHARS, MAX_FACT_ITEMS

    ck = tmp_path / "ck"
    shutil.copytree(real_ckpt("hf-model-bin"), ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["architectures"] = ["A" * 1000] * 10_000
    cfg["model_type"] = "m" * 1_000_000
    (ck / "config.json").write_text(json.dumps(cfg))
    facts = inspect(ck).inventory.node("config.json").facts
    assert "error" not in facts, facts
    assert len(facts["architectures"]) == MAX_FACT_ITEMS and facts["architectures"][0] == "A" * 1000
    assert len(facts["model_type"]) == MAX_FACT_CHARS and facts["model_type"].endswith("…")
    assert len(json.dumps(facts)) <= FACTS_CAP + MAX_FACT_ITEMS * 1010


def test_nodes_and_findings_write_the_json_their_fields_declare(real_ckpt):
    """Node.to_json and Finding.to_json are written out for speed (one per file): they must stay what as_json
    of their declared keys gives."""
    from ckpt_tui.core.jsondoc import as_json
    from ckpt_tui.core.types import Finding, Node

    rep = inspect(real_ckpt("hf-ds-zero2"))
    assert rep.findings
    for n in rep.inventory.nodes():
        assert n.to_json() == as_json(n, Node.json_keys)
        assert list(n.to_json()) == list(Node.json_keys)
    for f in rep.findings:
        assert f.to_json() == as_json(f, Finding.json_keys) and list(f.to_json()) == list(as_json(f))


def test_the_streamed_json_is_the_bytes_json_dumps_writes(real_ckpt, tmp_path):
    """emit_json writes the document in pieces (never one 120 MB string): the pieces join to json.dumps' text for
    every kind of value, each indent and ensure_ascii, and json_safe per piece (pieces of 1 part, so every
    boundary is tried) escapes C1, bidi and lone surrogates as it does on the whole text."""
    from ckpt_tui.cli.output import emit_json
    from ckpt_tui.core.jsondoc import write_json
    from ckpt_tui.core.safetext import json_safe

    hostile = "a\x1b[2J\x9b31m\u202e\u2028\udc80é"
    doc = {
        "s": hostile,
        "n": [1, -2, 2.5, float("nan"), float("inf"), -float("inf"), True, False, None, 10**30],
        "e": [[], {}, (), [{}]],
        "k": {7: 1, 2.5: 2, True: 3, False: 0, None: 4, hostile: 5},
        "t": (1, ("x",)),
    }
    doc["real"] = inspect(real_ckpt("hf-model-bin")).to_json()
    for indent in (1, 2):
        for ascii_ in (True, False):
            want = json.dumps(doc, indent=indent, ensure_ascii=ascii_)
            for chunk in (1, 7, 1 << 14):
                pieces: list = []
                write_json(doc, pieces.append, indent=indent, ensure_ascii=ascii_, chunk=chunk)
                assert "".join(pieces) == want
                assert "".join(json_safe(p) for p in pieces) == json_safe(want)
    with pytest.raises(ValueError, match="Circular"):
        loop: list = []
        loop.append(loop)
        write_json(loop, lambda p: None, indent=2, ensure_ascii=True)
    with pytest.raises(TypeError):
        write_json({"x": object()}, lambda p: None, indent=2, ensure_ascii=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        emit_json({"s": hostile}, ensure_ascii=False)
    assert (
        out.getvalue()
        == json_safe(json.dumps({"schema_version": 1, "s": hostile}, indent=2, ensure_ascii=False)) + "\n"
    )


def _many_long_globals(n: int = 100, width: int = 300) -> list:
    """``n`` functions of a module, each named by ``width`` characters: a pickle of them names n globals outside
    the allowlist (the screen records them, nothing calls them), each long."""
    import sys
    import types

    mod = types.ModuleType("evil_" + "m" * 40)
    sys.modules[mod.__name__] = mod
    out = []
    for i in range(n):

        def fn():
            return None

        fn.__name__ = fn.__qualname__ = f"f{i:04d}_" + "x" * width
        fn.__module__ = mod.__name__
        setattr(mod, fn.__name__, fn)
        out.append(fn)
    return out


def _assert_bounded_unsafe(facts: dict) -> None:
    from ckpt_tui.core.formats.torch_save.format import MAX_UNSAFE

    assert facts["unsafe_globals"], facts
    assert len(facts["unsafe_globals"]) <= MAX_UNSAFE and all(len(g) <= MAX_KEY_CHARS for g in facts["unsafe_globals"])
    assert len(json.dumps(facts)) <= FACTS_CAP


def test_dcp_and_deepspeed_unsafe_globals_are_bounded(real_ckpt, tmp_path):
    """A real DCP .metadata and a real DeepSpeed optimizer-states file each re-pickled with 100 functions of
    300-character names beside their contents: unsafe_globals lists at most MAX_UNSAFE, each cut as torch files'
    are, and the file is still flagged."""
    import pickle

    funcs = _many_long_globals()
    dcp = tmp_path / "dcp"
    shutil.copytree(real_ckpt("fsdp1-dcp"), dcp)
    meta = pickle.loads((dcp / ".metadata").read_bytes())  # our own trusted fixture, before the change
    meta.storage_meta = funcs
    (dcp / ".metadata").write_bytes(pickle.dumps(meta))
    ds = tmp_path / "checkpoint-2"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ds)
    opt = ds / "global_step2" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    sd = torch.load(opt, weights_only=False)
    sd["extra"] = funcs
    torch.save(sd, opt)
    rep = inspect(dcp)
    _assert_bounded_unsafe(rep.inventory.root.facts)
    assert "unsafe-pickle" in {f.code for f in rep.findings}
    rep = inspect(ds)
    _assert_bounded_unsafe(rep.inventory.node("global_step2/" + opt.name).facts)
    assert "unsafe-pickle" in {f.code for f in rep.findings}


def test_dcp_containers_are_bounded_and_counted(real_ckpt, tmp_path):
    """A real DCP .metadata with 5,000 more top-level entries (bytes entries, 300-character names): containers
    lists the first MAX_CONTAINERS, each cut, containers_total counts them."""
    import pickle

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from ckpt_tui.core.formats.dcp.format import MAX_CONTAINERS

    dcp = tmp_path / "dcp"
    shutil.copytree(real_ckpt("fsdp1-dcp"), dcp)
    meta = pickle.loads((dcp / ".metadata").read_bytes())
    before = len({k.split(".", 1)[0] for k in meta.state_dict_metadata})
    for i in range(5000):
        meta.state_dict_metadata[f"c{i:04d}" + "y" * 300] = BytesStorageMetadata()
    (dcp / ".metadata").write_bytes(pickle.dumps(meta))
    facts = inspect(dcp).inventory.root.facts
    assert len(facts["containers"]) == MAX_CONTAINERS and all(len(c) <= MAX_KEY_CHARS for c in facts["containers"])
    assert facts["containers_total"] == 5000 + before
    assert len(json.dumps(facts)) <= FACTS_CAP
    assert "containers_total" not in inspect(real_ckpt("fsdp1-dcp")).inventory.root.facts


def _rewrite_safetensors_header(path, change) -> None:
    """``path``'s JSON header changed by ``change(header)``, the tensor bytes after it as they were."""
    b = path.read_bytes()
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b[8 + n :])


def test_safetensors_header_metadata_values_are_bounded(real_ckpt, tmp_path):
    """A real safetensors shard whose __metadata__ holds one 1,000,000-character value (and a long key): the fact
    quotes it cut to MAX_FACT_CHARS."""
    from ckpt_tui.core.formats.plain.format import MAX_FACT_CHARS

    ck = tmp_path / "ck"
    shutil.copytree(real_ckpt("hf-model-sharded"), ck)
    shard = ck / "model-00001-of-00005.safetensors"
    _rewrite_safetensors_header(shard, lambda h: h["__metadata__"].update({"big": "v" * 1_000_000, "k" * 5000: "x"}))
    facts = inspect(ck).inventory.node(shard.name).facts
    assert "error" not in facts, facts
    md = facts["header_metadata"]
    assert md["format"] == "pt" and len(md["big"]) == MAX_FACT_CHARS and md["big"].endswith("…")
    assert all(len(k) <= MAX_FACT_CHARS for k in md)
    assert len(json.dumps(facts)) <= FACTS_CAP


def test_safetensors_index_fact_names_are_bounded(real_ckpt, tmp_path):
    """A real sharded model's index naming 40 tensors of 100,000-character names in a shard that does not hold
    them, and 100 shard files of 300-character names that are not there: the index_* facts quote at most 32
    names, each cut to MAX_KEY_CHARS."""
    ck = tmp_path / "ck"
    shutil.copytree(real_ckpt("hf-model-sharded"), ck)
    idx = ck / "model.safetensors.index.json"
    doc = json.loads(idx.read_text())
    doc["weight_map"].update({f"t{i:02d}" + "n" * 100_000: "model-00001-of-00005.safetensors" for i in range(40)})
    doc["weight_map"].update({f"x{i:03d}": f"m{i:03d}" + "f" * 300 + ".safetensors" for i in range(100)})
    idx.write_text(json.dumps(doc))
    rep = inspect(ck)
    facts = rep.inventory.root.facts
    for key in ("index_missing_tensors", "index_missing_files"):
        assert 0 < len(facts[key]) <= 32 and all(len(n) <= MAX_KEY_CHARS for n in facts[key]), key
    assert len(json.dumps({k: v for k, v in facts.items() if k.startswith("index_")})) <= FACTS_CAP
    assert "index-mismatch" in {f.code for f in rep.findings} or rep.has_errors


def test_an_index_naming_many_shard_files_has_bounded_facts_and_is_still_checked_in_full(real_ckpt, tmp_path):
    """A real sharded model's index naming 5,000 more shard files (300-character names) that are not there: its
    shard_files fact lists 1,024, each cut, with shard_files_total counting them; the folder check still reads the
    names in full from the index (the real shards' facts are summed, the missing files found)."""
    from ckpt_tui.core.formats.safetensors.format import MAX_SHARD_FILES

    ck = tmp_path / "ck"
    shutil.copytree(real_ckpt("hf-model-sharded"), ck)
    want = inspect(real_ckpt("hf-model-sharded")).inventory.node("model.safetensors.index.json").facts
    idx = ck / "model.safetensors.index.json"
    doc = json.loads(idx.read_text())
    doc["weight_map"].update({f"x{i:04d}": f"m{i:04d}" + "f" * 300 + ".safetensors" for i in range(5000)})
    idx.write_text(json.dumps(doc))
    rep = inspect(ck)
    facts = rep.inventory.node("model.safetensors.index.json").facts
    assert len(facts["shard_files"]) == MAX_SHARD_FILES and facts["shard_files_total"] == 5000 + len(
        want["shard_files"]
    )
    assert all(len(n) <= MAX_KEY_CHARS for n in facts["shard_files"])
    assert len(json.dumps(facts)) <= MAX_SHARD_FILES * (MAX_KEY_CHARS + 4) + FACTS_CAP  # not 5,000 names of 312
    assert facts["param_count"] == want["param_count"]  # the real shards, found by their full names
    assert "index-mismatch" in {f.code for f in rep.findings}
    assert "shard_files_total" not in want  # a real index: listed whole, no count


def test_a_long_dcp_sharding_info_is_still_read_in_full(real_ckpt, tmp_path):
    """header_metadata quotes values cut, but a DCP-in-safetensors folder's DCP_SHARDING_INFO (over 1,024
    characters in any real model: one entry per tensor) is read from the header in full: the real fixture with its
    sharding info re-written with padding (the same JSON value) is the same DCP."""
    from ckpt_tui.core.formats.plain.format import MAX_FACT_CHARS

    ck = tmp_path / "ck"
    shutil.copytree(real_ckpt("dcp-safetensors"), ck)
    want = inspect(real_ckpt("dcp-safetensors")).inventory.node("sharded").facts
    for shard in (ck / "sharded").glob("*.safetensors"):

        def pad(h):
            info = json.loads(h["__metadata__"]["DCP_SHARDING_INFO"])
            h["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info, indent=64)
            assert len(h["__metadata__"]["DCP_SHARDING_INFO"]) > MAX_FACT_CHARS

        _rewrite_safetensors_header(shard, pad)
    got = inspect(ck).inventory.node("sharded").facts
    assert (
        got["tensor_count"] == want["tensor_count"] > 0 and got.get("storage") == want.get("storage") == "safetensors"
    )


def test_tensor_names_under_a_huge_non_string_key_are_bounded(real_ckpt, tmp_path):
    """The HF pytorch_model.bin's weights re-saved under a tuple key repeating one 1,000-character string 2,000
    times (2 MB as text, stored once): the walk names them by a bounded part for that key, never str() of it."""
    from ckpt_tui.core.formats.torch_save import torchfile
    from ckpt_tui.core.formats.unpickle import iter_tensors

    sd = torch.load(real_ckpt("hf-model-bin") / "pytorch_model.bin", weights_only=True)
    path = tmp_path / "pytorch_model.bin"
    torch.save({(0,) + ("k" * 1000,) * 2000: sd}, path)
    names = [n for n, _ in iter_tensors(torchfile.read(path).obj)]
    assert len(names) == len(sd) and all(len(n) <= 300 for n in names), max(map(len, names))
