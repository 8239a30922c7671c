"""Advice that runs as printed.

For every fixture layout (and a representative corruption of each kind), inspect it as a user
would -- ``ckpt-tui inspect NAME`` from the folder holding it, and ``ckpt-tui inspect /abs/NAME``
from an unrelated folder -- collect every command ckpt-tui suggests (the findings' ``command``, the
backticked commands of their messages, the commands the results of those commands print), and run
each exactly as printed (by bash, from that folder): with ``--dry-run`` first where it writes, then
for real on a copy. After each real run, re-inspection must show what the advice promised (the
finding gone, the universal checkpoint there, the export loadable by the snippet it printed). Peer
commands (``accelerate merge-weights`` ...) run once per (peer, layout).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from tests.fixtures import REGISTRY, SKIPPED, fixture_path
from tests.snippets import run_load_snippets, snippet_after

from . import advice
from .advice import Tally, commands_in, run, subcommand, with_dir, writes

TALLY = Tally()
PEERS_RUN: set = set()
SNIPPETS: list[tuple] = []  # (printed load code, folder it was printed in, fixture) of every export run


def _entry(root: Path) -> tuple[Path, str]:
    """(folder the user is in, what they type) for a fixture's copy at ``root``: the one
    checkpoint-N of a Trainer output folder, the .ckpt of a Lightning run, else the folder itself."""
    ckpts = [c for c in root.iterdir() if c.is_dir() and c.name.startswith("checkpoint-")]
    if len(ckpts) == 1:
        return root, ckpts[0].name
    run = root / "run"  # a PEFT run (samples/hf_peft.py): the Trainer's output_dir beside its base-model/
    if run.is_dir():
        ckpts = [c for c in run.iterdir() if c.is_dir() and c.name.startswith("checkpoint-")]
        if len(ckpts) == 1:
            return run, ckpts[0].name
    lit = root / "checkpoints"
    if (lit / "latest_checkpointed_iteration.txt").is_file():  # a Megatron --save folder (megatron-dist)
        return root, "checkpoints"
    if lit.is_dir():
        names = sorted(c.name for c in lit.iterdir() if c.name.endswith(".ckpt"))
        if names:
            return lit, names[0]
    return root.parent, root.name


# ---------------------------------------------------------------- corruptions (one of each kind)


def _rm(rel):
    return lambda d: os.remove(d / rel)


def _write(rel, data: bytes):
    return lambda d: (d / rel).write_bytes(data)


def _truncate(rel):
    def go(d):
        p = d / rel
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) // 2)

    return go


def _rename(rel, new):
    return lambda d: os.replace(d / rel, d / new)


def _index_outside(d):
    p = d / "model.safetensors.index.json"
    doc = json.loads(p.read_text())
    doc["weight_map"][sorted(doc["weight_map"])[0]] = "../../etc/passwd"
    p.write_text(json.dumps(doc))


def _broken_newer_sibling(d):
    shutil.copytree(d / "checkpoint-2", d / "checkpoint-4")
    os.remove(d / "checkpoint-4" / "pytorch_model_fsdp_0" / ".metadata")


OPT1 = "global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
CORRUPTIONS = {
    # name: (fixture, the edit made to a copy of it)
    "latest-missing": ("ds-zero2-bf16", _rm("latest")),
    "latest-dangling": ("ds-zero2-bf16", _write("latest", b"global_step99")),
    "latest-universal-missing": ("universal-zero2", _rm("latest_universal")),
    "dcp-metadata-tmp": ("fsdp1-dcp", _rename(".metadata", ".metadata.tmp")),
    "dcp-shard-missing": ("fsdp1-dcp", _rm("__1_0.distcp")),
    "optim-file-missing": ("hf-ds-zero2", _rm("checkpoint-2/" + OPT1)),
    "optim-file-truncated": ("ds-zero2-bf16", _truncate(OPT1)),
    "safetensors-truncated": ("accelerate-save-state", _truncate("model.safetensors")),
    "index-outside": ("hf-model-sharded", _index_outside),
    "run-newest-broken": ("hf-fsdp1", _broken_newer_sibling),
}

CASES = sorted(v for v in REGISTRY if v not in SKIPPED) + [f"corrupt:{k}" for k in CORRUPTIONS]


def _materialise(case: str, base: Path) -> Path:
    """A private copy of the case under ``base`` (its own folder name), edited for a corruption."""
    if case.startswith("corrupt:"):
        name = case.split(":", 1)[1]
        fixture, edit = CORRUPTIONS[name]
        d = base / name
        shutil.copytree(fixture_path(fixture), d, symlinks=True)
        edit(d)
        return d
    d = base / case
    shutil.copytree(fixture_path(case), d, symlinks=True)
    return d


# ---------------------------------------------------------------- one form (relative or absolute)


def _inspect(cwd: Path, entry: str) -> tuple[dict, str]:
    q = shlex.quote(entry)
    human = run(f"ckpt-tui inspect {q}", cwd)
    assert human.rc in (0, 1), human
    assert "Traceback" not in human.out + human.err, human
    js = run(f"ckpt-tui inspect {q} --json", cwd)
    assert js.rc in (0, 1), js
    return json.loads(js.out), human.out


def _suggested(doc: dict, human: str) -> list[str]:
    """Every command of the report: each finding's ``command`` and the commands of its message, each
    shown in the human output too (whitespace-normalised: rich wraps long lines at spaces)."""
    flat = " ".join(human.split())
    out = []
    for f in doc["findings"]:
        cmds = commands_in(f["message"])
        if f.get("command"):
            assert f["command"] in cmds, f"finding {f['code']}: its command is not in its message: {f}"
        out += cmds
    for c in out:
        assert " ".join(c.split()) in flat, f"{c!r} is in the JSON but not in the human output"
    return list(dict.fromkeys(out))


def _check_paths(doc: dict, cwd: Path, entry: str) -> None:
    """Every backticked path of a message that names something in the checkpoint exists from ``cwd``."""
    for f in doc["findings"]:
        for span in advice.backticked(f["message"]):
            if advice.is_command(span):
                continue
            try:
                toks = shlex.split(span)
            except ValueError:
                continue
            if len(toks) == 1 and (toks[0] == entry or toks[0].startswith(entry.rstrip("/") + "/")):
                assert (cwd / toks[0].rstrip("/")).exists() or os.path.lexists(cwd / toks[0].rstrip("/")), (
                    f"{f['code']}: `{span}` does not exist from {cwd}"
                )


def _finding_still_there(doc: dict, cmd: str) -> list[dict]:
    return [f for f in doc["findings"] if f.get("command") == cmd or f"`{cmd}`" in f["message"]]


def _follow(cmd: str, cwd: Path, entry: str, layout: str, fixture: str, out_dir: Path, done: set, depth=0) -> None:
    """Run ``cmd`` as printed (dry run first where it writes), check what it promised, then follow
    the commands its own output suggests."""
    if cmd in done or depth > 2:
        return
    done.add(cmd)
    prog = shlex.split(cmd)[0]
    if prog != "ckpt-tui" and prog != "echo":  # a peer: once per (peer, layout), for real
        key = (" ".join(shlex.split(cmd)[:2]), layout)
        if key in PEERS_RUN:
            return
        PEERS_RUN.add(key)
        out_dir.mkdir(exist_ok=True)
        real = run(with_dir(cmd, str(out_dir / f"peer-{len(done)}")), cwd)
        assert real.rc == 0, real
        TALLY.peers += 1
        return
    out_dir.mkdir(exist_ok=True)
    target = str(out_dir / f"out-{len(done)}")
    if not Path(entry).is_absolute():
        target = os.path.relpath(target, cwd)
    line = with_dir(cmd, target)
    if writes(cmd):
        dry = run(line + " --dry-run", cwd)
        assert dry.rc == 0, dry
        assert "Traceback" not in dry.out + dry.err, dry
        TALLY.dry_runs += 1
    real = run(line, cwd, answer_yes=subcommand(cmd) == "fix")
    assert real.rc == 0 or (subcommand(cmd) == "inspect" and real.rc == 1), real  # inspect: 1 = errors found
    assert "Traceback" not in real.out + real.err, real
    TALLY.commands += 1
    sub = subcommand(cmd)
    after, _ = _inspect(cwd, entry)
    if sub in ("fix", "echo"):
        assert not _finding_still_there(after, cmd), f"after `{cmd}` re-inspection still reports {after['findings']}"
    elif sub == "universal":
        assert any(n["format"] == "deepspeed-universal" for n in after["nodes"]), after["nodes"]
        assert not any(f["code"] == "universal-info-missing" and f["severity"] != "info" for f in after["findings"])
    elif sub == "export":
        out = cwd / target
        assert list(out.glob("*.safetensors")), list(out.iterdir())
        SNIPPETS.append((snippet_after(real.out), cwd, fixture))  # executed together at the end
    for nxt in commands_in(real.out + "\n" + real.err):
        _follow(nxt, cwd, entry, layout, fixture, out_dir, done, depth + 1)


def _fixture_of(case: str) -> str:
    return CORRUPTIONS[case.split(":", 1)[1]][0] if case.startswith("corrupt:") else case


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The cases' folders: kept until the end of the module, where the printed load snippets run."""
    return tmp_path_factory.mktemp("advice")


@pytest.mark.parametrize("case", CASES)
def test_advice_runs_as_printed(case, base):
    tmp_path = base / case.replace(":", "-")
    tmp_path.mkdir()
    fixture = _fixture_of(case)
    # 1. the relative form, from the folder above the checkpoint
    copy_a = _materialise(case, tmp_path / "a")
    cwd, entry = _entry(copy_a)
    doc, human = _inspect(cwd, entry)
    cmds = _suggested(doc, human)
    _check_paths(doc, cwd, entry)
    for f in doc["findings"]:
        if f.get("fix") in ("latest", "universal-info", "dcp-metadata"):
            assert f.get("command"), f"{f['code']} offers fix {f['fix']} but no command: {f}"
    done: set = set()
    for c in cmds:
        _follow(c, cwd, entry, doc["layout"], fixture, tmp_path / "a-out", done)
    # 2. the absolute form, from an unrelated folder
    copy_b = _materialise(case, tmp_path / "b")
    cwd_b, entry_b = _entry(copy_b)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    absolute = str(cwd_b / entry_b)
    doc_b, human_b = _inspect(elsewhere, absolute)
    cmds_b = _suggested(doc_b, human_b)
    assert len(cmds_b) == len(cmds)
    for c in cmds_b:
        w = shlex.split(c)
        assert any(x.startswith(absolute) for x in w[1:]), f"{c!r}: no absolute path in the absolute form"
    done_b: set = set()
    for c in cmds_b:
        _follow(c, elsewhere, absolute, doc_b["layout"], fixture, tmp_path / "b-out", done_b)
    TALLY.cases += 1


def test_every_printed_load_snippet_loads_its_export():
    """Runs after the cases above (file order): each "Load it with" code an export printed, run from
    the folder it was printed in, loads its export with no missing or unexpected key (one process)."""
    if not SNIPPETS:
        pytest.skip("no export ran in this selection of cases")
    reports = run_load_snippets(SNIPPETS)
    TALLY.snippets = len(reports)
