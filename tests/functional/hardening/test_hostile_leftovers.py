"""What a killed ckpt-tui run leaves is listed by inspect as a leftover, never read (issue 20, point 2: "every temp
or staging folder any command makes is swept by the next run of that command, and listed by inspect as a
leftover").

Each leftover is made by the writer's own code in a process that is then killed with SIGKILL, on a real
framework checkpoint (the shared fixtures, copied): a conversion's and an export's staging folder beside OUT
(``staging.staged_output``, as ``ckpt-tui universal`` and ``ckpt-tui export`` make them: owner lock inside, OUT's
lock beside). Half-written copies of real files are put inside. inspect (text and ``--json``)
lists each one as ``leftover-temp`` with its size and no other finding (the partial files are not read); while
the run is alive it says so (info) and gives no ``rm``; once it is dead the ``rm`` it prints, run as printed
in a shell, removes exactly that and nothing else, and the next inspect is the pristine one again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional.hardening.test_hostile_writes import changed_outside, cli, tree

ROOT = Path(__file__).resolve().parents[3]

KILLED = r"""
import sys
from pathlib import Path

kind, where, src = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
data = src.read_bytes()
if kind == "universal":  # as convert_to_universal stages its output beside it
    from ckpt_tui.core.convert.universal.plan import UniversalError
    from ckpt_tui.core.staging import staged_output

    cm = staged_output(where / "global_step2_universal", writer="universal", error=UniversalError, scratch=True)
    stage = cm.__enter__()  # never left: the process is killed inside
    part = stage.path / "zero" / "model.embed_tokens.weight"
    part.mkdir(parents=True)
    (part / "fp32.pt").write_bytes(data[: len(data) // 2])  # a torch zip cut in half
else:  # as an export into where/merged: its lock, then its staging folder
    from ckpt_tui.core.export.write import ExportError
    from ckpt_tui.core.staging import staged_output

    cm = staged_output(where / "merged", writer="export", error=ExportError)
    stage = cm.__enter__()
    (stage.path / "model.safetensors").write_bytes(data[: len(data) // 2])  # a shard cut in half
tmp = stage.root
print(tmp.name, flush=True)
sys.stdin.read()  # until killed
"""


@pytest.fixture
def world(real_ckpt_copy, tmp_path, monkeypatch):
    run = real_ckpt_copy("hf-ds-zero2")
    (tmp_path / "sentinel.txt").write_text("keep me\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "killed.py").write_text(KILLED)
    return tmp_path, run, run / "checkpoint-2"


class Killable:
    """The writer's own code in a process of its own, killed with SIGKILL (never asked to stop)."""

    def __init__(self, tmp: Path, kind: str, where: Path, src: Path):
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp / "killed.py"), kind, str(where), str(src)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.name = self.proc.stdout.readline().strip()  # written once the temp folder is there: no sleep
        assert self.name, self.proc.stderr.read()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()  # reaped: its locks are gone with it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def inspect_json(path: str) -> dict:
    code, out, err = cli("inspect", path, "--json")
    assert code in (0, 1), err
    return json.loads(out)


def findings(doc: dict) -> set:
    return {(f["code"], f["severity"], f["path"]) for f in doc["findings"]}


def leftover_findings(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == "leftover-temp"]


def check_listed(given: str, doc: dict, pristine: set, names: list[str]) -> list[str]:
    """Each of ``names`` (below ``given``) is one leftover-temp warning, one node with nothing below it, and the
    report is otherwise the pristine one; returns the rm commands the findings print."""
    left = leftover_findings(doc)
    assert sorted(f["path"] for f in left) == sorted(names), left
    assert findings(doc) - {(f["code"], f["severity"], f["path"]) for f in left} == pristine
    nodes = {n["path"]: n for n in doc["nodes"]}
    commands = []
    for f in left:
        assert f["severity"] == "warning" and "killed ckpt-tui" in f["message"], f
        assert nodes[f["path"]]["format"] == "leftover" and nodes[f["path"]]["facts"]["leftover_held"] is False
        assert nodes[f["path"]]["size"] > 0 or f["path"].endswith(".lock")
        assert not [p for p in nodes if p.startswith(f["path"] + "/")], "a leftover is never descended"
        m = re.search(r"`(rm (?:-rf )?-- [^`]+)`", f["message"])
        assert m and m[1].endswith(f"{given}/{f['path']}"), f["message"]
        commands.append(m[1])
    return commands


def run_as_printed(tmp: Path, commands: list[str], gone: list[Path]) -> None:
    before = tree(tmp)
    for c in commands:
        r = subprocess.run(["bash", "-c", c], cwd=tmp, capture_output=True, text=True)
        assert r.returncode == 0, (c, r.stderr)
    assert not [p for p in gone if os.path.lexists(p)]
    rel = [str(p.relative_to(tmp)) for p in gone]
    after = tree(tmp)
    parents = {str(p.parent.relative_to(tmp)) for p in gone}  # a folder's mtime moves when an entry goes
    assert [c for c in changed_outside(before, after, *rel) if not (c in parents and after[c][0] == "dir")] == []


def test_a_killed_conversions_temp_folder_is_listed_not_read_and_its_rm_removes_it(world):
    tmp, run, ck = world
    given = "hf-ds-zero2/checkpoint-2"
    pristine = findings(inspect_json(given))
    lock = ".global_step2_universal.ckpt-tui.lock"
    with Killable(tmp, "universal", ck, ck / "global_step2" / "mp_rank_00_model_states.pt") as w:
        live = leftover_findings(inspect_json(given))  # its run is alive: it holds the owner lock and OUT's
        assert sorted((f["severity"], f["path"]) for f in live) == [("info", lock), ("info", w.name)], live
        assert all("still running" in f["message"] and "rm " not in f["message"] for f in live)
        w.kill()
    assert (ck / w.name / "global_step2_universal").is_dir()  # what the kill left
    doc = inspect_json(given)
    commands = check_listed(given, doc, pristine, [w.name, lock])
    assert all(
        "next ckpt-tui universal writing its output in hf-ds-zero2/checkpoint-2" in f["message"]
        for f in leftover_findings(doc)
    )
    code, text, _ = cli("inspect", given)
    flat = " ".join(text.split())  # the text report wraps its lines
    assert f"leftover-temp {given}/{w.name}" in flat and commands[0] in flat
    assert "file-truncated" not in flat and "file-corrupt" not in flat
    run_as_printed(tmp, commands, [ck / w.name, ck / lock])
    assert findings(inspect_json(given)) == pristine


def test_a_killed_exports_temp_folder_and_lock_are_listed_and_their_rm_removes_them(world):
    tmp, run, ck = world
    given = "hf-ds-zero2"
    pristine = findings(inspect_json(given))
    with Killable(tmp, "export", run, ck / "model.safetensors") as w:
        live = leftover_findings(inspect_json(given))
        assert sorted((f["severity"], f["path"]) for f in live) == [
            ("info", ".merged.ckpt-tui.lock"),
            ("info", w.name),
        ], live
        w.kill()
    doc = inspect_json(given)
    commands = check_listed(given, doc, pristine, [w.name, ".merged.ckpt-tui.lock"])
    assert all("next ckpt-tui export into hf-ds-zero2/merged" in f["message"] for f in leftover_findings(doc))
    run_as_printed(tmp, commands, [run / w.name, run / ".merged.ckpt-tui.lock"])
    assert findings(inspect_json(given)) == pristine


async def test_the_tui_lists_a_killed_runs_leftover_among_its_findings(world):
    from ckpt_tui.ui.app import make_app
    from ckpt_tui.ui.screens.findings import FindingsScreen
    from tests.functional.ui.test_app import press_and_wait, wait_for

    tmp, run, ck = world
    with Killable(tmp, "universal", ck, ck / "global_step2" / "mp_rank_00_model_states.pt") as w:
        w.kill()
    app = make_app(ck)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        assert [n.format for n in app.report.inventory.nodes() if n.path.startswith(w.name)] == ["leftover"]
        await press_and_wait(pilot, "f", lambda: isinstance(app.screen, FindingsScreen))
        table = app.screen.query_one("DataTable")
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert [str(r[2]) for r in rows].count("leftover-temp") == 2, rows  # its staging folder and OUT's lock


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    r = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(r.stdout)


def test_an_overwrites_old_output_and_a_repairs_temp_file_are_listed_and_their_commands_run(world):
    """What a kill -9 leaves between an --overwrite's two renames (the old OUT as ``.OUT.old-PID``, no OUT, the
    lock) and during a repair's write (``.X.ckpt-tui-tmp-PID`` beside its target, made as repair.atomic makes it):
    the old OUT's finding gives the ``mv`` that puts it back, the others their ``rm``; run as printed, they leave
    OUT back in place and nothing else changed."""
    from ckpt_tui.core.fsutil import create_new
    from ckpt_tui.core.repair.atomic import tmp_prefix

    tmp, run, ck = world
    given = "hf-ds-zero2"
    pid = dead_pid()
    old = run / f".merged.old-{pid}"
    old.mkdir()
    (old / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes())
    os.close(create_new(run / ".merged.ckpt-tui.lock"))  # as staging.OutLock.acquire makes it; never released
    part = ck / f"{tmp_prefix(ck / 'latest')}{pid}"
    fd = create_new(part)
    os.write(fd, b"glob")  # half of "global_step2"
    os.close(fd)
    doc = inspect_json(given)
    left = {f["path"]: f for f in leftover_findings(doc)}
    assert sorted(left) == [".merged.ckpt-tui.lock", old.name, f"checkpoint-2/{part.name}"], left
    assert all(f["severity"] == "warning" for f in left.values())
    assert not [f for f in doc["findings"] if f["path"].startswith(old.name + "/")]
    mv = re.search(r"`(mv -- [^`]+)`", left[old.name]["message"])
    assert mv and mv[1] == f"mv -- {given}/{old.name} {given}/merged", left[old.name]["message"]
    assert "rm " not in left[old.name]["message"]  # the user's previous output: put back, never removed
    assert "next ckpt-tui fix that rewrites latest" in left[f"checkpoint-2/{part.name}"]["message"]
    rms = [
        re.search(r"`(rm (?:-rf )?-- [^`]+)`", left[p]["message"])[1]
        for p in (".merged.ckpt-tui.lock", f"checkpoint-2/{part.name}")
    ]
    assert rms == [f"rm -- {given}/.merged.ckpt-tui.lock", f"rm -- {given}/checkpoint-2/{part.name}"]
    want = (ck / "model.safetensors").read_bytes()
    before = tree(tmp)
    for c in [mv[1], *rms]:
        r = subprocess.run(["bash", "-c", c], cwd=tmp, capture_output=True, text=True)
        assert r.returncode == 0, (c, r.stderr)
    assert (run / "merged" / "model.safetensors").read_bytes() == want
    assert not old.exists() and not part.exists() and not (run / ".merged.ckpt-tui.lock").exists()
    moved = {f"{given}/merged", f"{given}/merged/model.safetensors"}
    assert [
        c
        for c in changed_outside(
            before,
            tree(tmp),
            f"{given}/{old.name}",
            f"{given}/.merged.ckpt-tui.lock",
            f"{given}/checkpoint-2/{part.name}",
        )
        if c not in moved and c not in (given, f"{given}/checkpoint-2")
    ] == []
    assert leftover_findings(inspect_json(given)) == []
