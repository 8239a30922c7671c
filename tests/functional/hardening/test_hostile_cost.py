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

from ckpt_tui.core.formats.torch_save import MAX_KEY_CHARS, MAX_KEYS
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
    from ckpt_tui.core.formats.plain_files import MAX_FACT_CHARS, MAX_FACT_ITEMS

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
    doc = {"s": hostile, "n": [1, -2, 2.5, float("nan"), float("inf"), -float("inf"), True, False, None, 10 ** 30],
           "e": [[], {}, (), [{}]], "k": {7: 1, 2.5: 2, True: 3, False: 0, None: 4, hostile: 5}, "t": (1, ("x",))}
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
    assert out.getvalue() == json_safe(json.dumps({"schema_version": 1, "s": hostile}, indent=2,
                                                  ensure_ascii=False)) + "\n"
