"""One staged output for every writer (core/staging.py, issue 21): OUT's own lock, the sweep of what killed runs
left (this version's names and every older one), one wording per refusal, an install that never leaves OUT missing
or half, and the sources' stamps checked by every writer."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ckpt_tui.core import fsutil, staging
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.fsutil import OWNER_FILE, OutputError, create_new

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def world(real_ckpt_copy, tmp_path):
    run = real_ckpt_copy("hf-ds-zero2")
    return tmp_path, run, run / "checkpoint-2"


def plans(ck: Path, out: Path):
    from ckpt_tui.core.export.api import plan_export

    pm, _ = plan_export(ck, out)
    po, _ = plan_export(ck, out, component="optimizer")
    return pm, po


def beside(out: Path) -> list[str]:
    """What lies beside OUT that names it (staging folders, locks, an old OUT)."""
    return sorted(n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.") or n.startswith(f"..{out.name}."))


@pytest.fixture
def sleeper():
    """A live process (its pid names the "live run's" staging)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield p.pid
    p.kill()
    p.wait()


def dead_pid() -> int:
    r = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(r.stdout)


# ------------------------------------------------------------------ OUT's own lock


def test_both_locks_out_itself_a_second_export_into_it_is_refused(world):
    """While the TUI's "both" export into OUT runs (held in its progress callback), an export or another "both" into
    the same OUT is refused with the lock's message -- before, "both" locked only its staging names."""
    from ckpt_tui.core.export.both import execute_both
    from ckpt_tui.core.export.write import execute

    tmp, run, ck = world
    out = tmp / "merged"
    pm, po = plans(ck, out)
    inside, go = threading.Event(), threading.Event()

    def hold(_p) -> None:
        inside.set()
        go.wait(30)

    got: dict[str, object] = {}

    def first() -> None:
        try:
            got["result"] = execute_both(pm, po, verify=False, on_progress=hold)
        except BaseException as e:  # pragma: no cover - reported below
            got["error"] = e

    t = threading.Thread(target=first)
    t.start()
    try:
        assert inside.wait(30), got
        assert (tmp / ".merged.ckpt-tui.lock").is_file()
        want = f"another ckpt-tui is writing {out}; wait for it or choose another --out"
        with pytest.raises(ExportError) as e1:
            execute(pm, verify=False)
        assert str(e1.value) == want
        with pytest.raises(ExportError) as e2:
            execute_both(pm, po, verify=False)
        assert str(e2.value) == want
    finally:
        go.set()
        t.join(60)
    assert "error" not in got, got
    assert {"model.safetensors", "optimizer.safetensors"} <= {p.name for p in out.iterdir()}
    assert beside(out) == []  # the lock let go and removed, the staging folder installed


def test_a_repair_locks_its_target(world):
    """A file target is locked as OUT is: a second writer of the same file is refused, nothing changed."""
    from ckpt_tui.core.repair.atomic import RepairError, replace_file

    tmp, run, ck = world
    target = ck / "latest"
    old = target.read_bytes()
    with staging.staged_output(target, writer="export", error=ExportError, checked=True):
        with pytest.raises(RepairError) as e:
            replace_file(target, lambda fh: fh.write(b"x"), backup=False, needed=1)
    assert str(e.value) == f"another ckpt-tui is writing {target}. Nothing was changed; wait for it."
    assert target.read_bytes() == old
    assert not [n for n in os.listdir(ck) if "ckpt-tui" in n]


# ------------------------------------------------------------------ the sweep


def make_staging(folder: Path, name: str, *, owner: bool = False) -> Path:
    p = folder / name
    p.mkdir()
    (p / "part.safetensors").write_bytes(b"half")
    if owner:  # an older conversion's temp folder (fsutil.owned_temp) holds its owner lock
        os.close(create_new(p / OWNER_FILE))
    return p


def test_the_next_run_sweeps_every_killed_runs_staging_and_leaves_a_live_ones(world, sleeper):
    """Beside OUT: this version's staging folders (an export's, a conversion's), an --overwrite's old OUT where OUT
    is there, an older "both"'s ``.OUT.model-PID`` / ``.OUT.optimizer-PID`` with their own temp folder and lock,
    and the conversions' older ``.ckpt-tui-universal-*`` / ``.ckpt-tui-torch-dcp-*``: those of dead runs are swept
    by the next export into OUT; those of a live pid, an older conversion's whose owner lock is held, and another
    output's are left."""
    from ckpt_tui.core.export.write import execute

    tmp, run, ck = world
    out = tmp / "merged"
    out.mkdir()
    dead, live = dead_pid(), sleeper
    names = [
        f".merged.tmp-{dead}",
        f".merged.universal-{dead}",
        f".merged.torch-dcp-{dead}",
        f".merged.old-{dead}",
        f".merged.model-{dead}",
        f".merged.optimizer-{dead}",
        f"..merged.model-{dead}.tmp-{dead}",
    ]
    for n in names:
        make_staging(tmp, n)
    os.close(create_new(tmp / f"..merged.model-{dead}.ckpt-tui.lock"))
    os.close(create_new(tmp / ".merged.ckpt-tui.lock"))  # a killed run's lock of OUT: reused, then removed
    old_universal = make_staging(tmp, ".ckpt-tui-universal-k1lled", owner=True)
    old_dcp = make_staging(tmp, ".ckpt-tui-torch-dcp-k1lled", owner=True)
    kept = [f".merged.model-{live}", f".merged.tmp-{live}", f".other.tmp-{dead}"]
    for n in kept:
        make_staging(tmp, n)
    held_old = fsutil.owned_temp(tmp, staging.UNIVERSAL_TEMP)  # an older version's live conversion
    try:
        pm, _ = plans(ck, out)
        execute(pm, verify=False, overwrite=True)
        left = sorted(os.listdir(tmp))
        for n in [*names, f"..merged.model-{dead}.ckpt-tui.lock"]:
            assert n not in left, (n, left)
        assert not old_universal.exists() and not old_dcp.exists()
        for n in kept:
            assert n in left, (n, left)
        assert held_old.is_dir()
        assert beside(out) == [f".merged.model-{live}", f".merged.tmp-{live}"]
        assert (out / "model.safetensors").is_file()
    finally:
        fsutil.remove_temp(held_old)


def test_the_sweep_is_the_one_the_conversions_and_repairs_run(world):
    """A conversion's next run sweeps an export's killed staging of the same OUT (one list, every writer)."""
    from ckpt_tui.core.convert.torch_dcp import TorchDcpError

    tmp, run, ck = world
    out = tmp / "dcp"
    dead = dead_pid()
    for n in (f".dcp.tmp-{dead}", f".dcp.model-{dead}", f".dcp.torch-dcp-{dead}"):
        make_staging(tmp, n)
    with staging.staged_output(out, writer="torch-dcp", error=TorchDcpError, scratch=True) as stage:
        assert beside(out) == [".dcp.ckpt-tui.lock", stage.root.name]
        assert not stage.path.exists() and stage.path.parent == stage.root
    assert beside(out) == []
    target = ck / "latest"
    part = ck / f".latest{staging.REPAIR_TEMP_MARK}{dead}"
    part.write_bytes(b"glob")
    from ckpt_tui.core.repair.atomic import RepairError, replace_file

    replace_file(target, lambda fh: fh.write(target.read_bytes()), backup=False, needed=16)
    assert not part.exists()
    with pytest.raises(RepairError):
        replace_file(target, lambda fh: (_ for _ in ()).throw(RepairError("stop")), backup=False, needed=16)
    assert not [n for n in os.listdir(ck) if "ckpt-tui" in n]


def test_leftovers_recognises_every_staging_name(world):
    """core/leftovers.py reads the same list: a staging folder by OUT's lock beside it (whose command: its mark),
    the lock by the staging folder beside it, a repair's lock by the file it replaces."""
    from ckpt_tui.core.leftovers import recognise

    tmp, run, ck = world
    dead = dead_pid()
    for n in (f".m.tmp-{dead}", f".u.universal-{dead}", f".d.torch-dcp-{dead}", f".m.model-{dead}"):
        make_staging(tmp, n)
    make_staging(tmp, f".x.tmp-{dead}")  # no lock beside: not provably ours
    for n in (".m.ckpt-tui.lock", ".u.ckpt-tui.lock", ".d.ckpt-tui.lock"):
        os.close(create_new(tmp / n))
    os.close(create_new(ck / ".latest.ckpt-tui.lock"))
    got = {n: recognise(tmp, n, (tmp / n).is_dir()) for n in os.listdir(tmp) if n.startswith(".")}
    assert got[f".m.tmp-{dead}"]["leftover_of"] == "ckpt-tui export"
    assert got[f".u.universal-{dead}"]["leftover_of"] == "ckpt-tui universal"
    assert got[f".d.torch-dcp-{dead}"]["leftover_of"] == "ckpt-tui convert"
    assert got[f".m.model-{dead}"]["leftover_kind"] == "staging-folder"
    assert got[f".x.tmp-{dead}"] is None
    assert got[".u.ckpt-tui.lock"]["leftover_of"] == "ckpt-tui universal"  # the staging folder beside says whose
    assert got[".d.ckpt-tui.lock"]["leftover_of"] == "ckpt-tui convert"
    assert got[".m.ckpt-tui.lock"]["leftover_of"] == "ckpt-tui export"
    assert not any(f["leftover_held"] for f in got.values() if f)
    assert recognise(ck, ".latest.ckpt-tui.lock", False)["leftover_of"] == "ckpt-tui fix"


# ------------------------------------------------------------------ one wording per refusal


def test_each_refusal_kind_has_one_wording():
    out, parent = Path("/x/out"), Path("/x")
    cases = {
        "missing": (OutputError("missing", parent), "/x does not exist; create it first"),
        "read-only": (
            OutputError("read-only", parent),
            "/x is on a read-only filesystem; choose --out on a writable one",
        ),
        "not-writable": (
            OutputError("not-writable", parent),
            "cannot write in /x: permission denied; choose another --out",
        ),
        "no-space": (
            OutputError("no-space", parent, free=1500, need=2_500_000),
            "no space left on /x: the {what} needs 2.5 MB, 1.5 kB is free",
        ),
        "not-a-folder": (OutputError("not-a-folder", out), "/x/out exists and is not a folder; choose another --out"),
        "not-empty": (OutputError("not-empty", out), "/x/out is not empty; choose another --out{or}"),
        "inside-source": (
            OutputError("inside-source", out, relation="inside", source="/x"),
            "the output folder /x/out is inside the source /x: ckpt-tui never writes into or removes a source; "
            "choose --out outside it",
        ),
    }
    for writer, what, overwrite in (
        ("export", "export", True),
        ("universal", "conversion", False),
        ("torch-dcp", "conversion", False),
    ):
        for kind, (e, want) in cases.items():
            want = want.format(what=what, **{"or": " or pass --overwrite" if overwrite else ""})
            assert staging.refusal(e, writer) == want, (writer, kind)
    holds = OutputError("inside-source", out, relation="holds", source="/x/out/ck")
    assert staging.refusal(holds, "export", out="out") == (
        "the output folder out holds the source /x/out/ck (--overwrite would delete it): ckpt-tui never writes into "
        "or removes a source; choose --out outside it"
    )
    # a file replaced in place (a repair): the same sentence, then that nothing changed and what to do
    assert staging.refusal(OutputError("read-only", parent), "repair") == (
        "/x is on a read-only filesystem. Nothing was changed; copy the checkpoint to a writable place and repair "
        "the copy."
    )
    assert staging.refusal(OutputError("no-space", parent, free=10, need=2000), "repair") == (
        "no space left on /x: the repair needs 2.0 kB, 10 Bytes is free. Nothing was changed."
    )
    assert set(staging.MESSAGES) >= set(OutputError.ERRNO)
    # the export's lock refusals as they were worded before (only "exporting into" became "writing")
    lock = "/x/.out.ckpt-tui.lock"
    assert staging.message("lock-not-regular", "export", lock=lock) == (
        f"{lock} is not a regular file: remove it or choose another --out"
    )
    assert staging.message("lock-link", "export", lock=lock) == (
        f"{lock} is a symbolic link: ckpt-tui never writes through one; remove it (someone else may have planted "
        "it) or choose another --out"
    )
    assert staging.message("lock-unstable", "export", lock=lock) == f"cannot take the lock {lock}: it keeps changing"


def test_a_regular_file_at_out_is_refused_in_the_same_words_by_every_writer(world):
    """The refusal a user meets most: before, the conversions said "already exists and is not empty"."""
    from ckpt_tui.core.convert.torch_dcp import torch_dcp_plan
    from ckpt_tui.core.convert.universal import universal_plan
    from ckpt_tui.core.export.both import execute_both
    from ckpt_tui.core.export.write import execute

    tmp, run, ck = world
    out = tmp / "afile"
    out.write_text("mine\n")
    pm, po = plans(ck, tmp / "merged")
    pm, po = dataclasses.replace(pm, out=out, out_given=""), dataclasses.replace(po, out=out, out_given="")
    want = f"{out} exists and is not a folder; choose another --out"
    for call in (
        lambda: execute(pm),
        lambda: execute_both(pm, po),
        lambda: universal_plan(ck, out=out),
        lambda: torch_dcp_plan(ck, out=out),
    ):
        with pytest.raises(ExportError) as e:
            call()
        assert str(e.value) == want
    assert out.read_text() == "mine\n"


def test_no_space_is_said_in_human_sizes_by_both(world, monkeypatch):
    """The TUI's "both" said the raw kind (``…: no-space (the model and optimizer exports together need …)``)."""
    from ckpt_tui.core.export.both import execute_both

    tmp, run, ck = world
    pm, po = plans(ck, tmp / "merged")
    monkeypatch.setattr(fsutil, "free_bytes", lambda folder: 1000)
    with pytest.raises(ExportError) as e:
        execute_both(pm, po)
    msg = str(e.value)
    assert msg.startswith(f"no space left on {tmp}: the export needs ") and msg.endswith(", 1.0 kB is free"), msg
    assert "no-space" not in msg
    assert not (tmp / "merged").exists() and beside(tmp / "merged") == []


# ------------------------------------------------------------------ the install


def existing_out(tmp: Path) -> Path:
    out = tmp / "merged"
    out.mkdir()
    (out / "mine.txt").write_text("the user's old output\n")
    return out


@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_failed_rename_leaves_the_old_out_whole(world, monkeypatch, fail_at):
    """Fault injection: the first (OUT aside) or second (the new one in) rename of an --overwrite fails: OUT is the
    old one, whole, and nothing else is left beside it."""
    from ckpt_tui.core.export.write import execute

    tmp, run, ck = world
    out = existing_out(tmp)
    pm, _ = plans(ck, out)
    real = os.replace
    calls = []

    def replace(a, b):
        calls.append((a, b))
        if len(calls) == fail_at:
            raise OSError(5, "Input/output error (injected)")
        return real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="injected"):
        execute(pm, overwrite=True, verify=False)
    monkeypatch.setattr(os, "replace", real)
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert beside(out) == []


KILL_BETWEEN = """
import os, signal, sys
from pathlib import Path
from ckpt_tui.core.export.api import plan_export
from ckpt_tui.core.export.write import execute

ck, out, at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
plan, _ = plan_export(ck, out)
real, calls = os.replace, []

def replace(a, b):
    calls.append(1)
    if len(calls) == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(a, b)

os.replace = replace
execute(plan, overwrite=True, verify=False)
"""


@pytest.mark.parametrize("kill_at", [1, 2])
def test_a_kill_between_the_install_steps_loses_nothing(world, kill_at):
    """SIGKILL before the first rename (OUT still the old one) or between the two (OUT aside as ``.OUT.old-PID``):
    the next export into OUT sweeps the staging folder, puts the old OUT back and then replaces it as asked."""
    tmp, run, ck = world
    out = existing_out(tmp)
    script = tmp / "kill_between.py"
    script.write_text(KILL_BETWEEN)
    p = subprocess.run([sys.executable, str(script), str(ck), str(out), str(kill_at)], cwd=ROOT, capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    if kill_at == 1:
        assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    else:
        assert not out.exists()
        (old,) = [n for n in beside(out) if n.startswith(".merged.old-")]
        assert sorted(os.listdir(tmp / old)) == ["mine.txt"]
    assert any(n.startswith(".merged.tmp-") for n in beside(out))  # the staging folder, complete but not installed
    from ckpt_tui.core.export.write import execute

    pm, _ = plans(ck, out)
    said = "is not empty; choose another --out" if kill_at == 1 else "appeared and is not empty; nothing was replaced"
    with pytest.raises(ExportError, match=said):
        execute(pm, verify=False)  # the old OUT is (back) there: without --overwrite it is not replaced
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert beside(out) == [] or kill_at == 1  # refused before the lock (OUT not empty): nothing swept yet
    execute(pm, overwrite=True, verify=False)
    assert "model.safetensors" in {p.name for p in out.iterdir()} and beside(out) == []


# ------------------------------------------------------------------ the sources unchanged, every writer


def touch_once(path: Path):
    """An on_progress that changes ``path``'s mtime the first time it is called (a job still writing)."""
    done = []

    def cb(_p) -> None:
        if not done:
            done.append(1)
            st = os.stat(path)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    return cb


def test_the_export_refuses_a_source_changed_while_it_ran(world):
    from ckpt_tui.core.export.write import execute, source_files

    tmp, run, ck = world
    pm, _ = plans(ck, tmp / "merged")
    src = source_files(pm)[0]
    with pytest.raises(ExportError) as e:
        execute(pm, on_progress=touch_once(src))
    assert str(e.value) == (
        f"the source changed during the export ({src.name}): nothing was written; export again once the checkpoint "
        "is complete"
    )
    assert not (tmp / "merged").exists() and beside(tmp / "merged") == []


def test_both_refuses_a_source_changed_while_it_ran(world):
    from ckpt_tui.core.export.both import execute_both

    tmp, run, ck = world
    pm, po = plans(ck, tmp / "merged")
    opt = sorted((ck / "global_step2").glob("*optim_states.pt"))[0]
    with pytest.raises(ExportError, match=r"^the source changed during the export"):
        execute_both(pm, po, on_progress=touch_once(opt))
    assert not (tmp / "merged").exists() and beside(tmp / "merged") == []


def test_the_torch_dcp_conversion_refuses_a_source_changed_while_it_ran(world):
    from ckpt_tui.core.convert.torch_dcp import TorchDcpError, convert_to_torch_dcp, torch_dcp_plan

    tmp, run, ck = world
    plan = torch_dcp_plan(ck, out=tmp / "dcp")
    src = sorted((ck / "global_step2").glob("*optim_states.pt"))[0]
    with pytest.raises(TorchDcpError, match=r"^the source changed during the conversion \(.*\): nothing was written; "):
        convert_to_torch_dcp(plan, on_progress=touch_once(src))
    assert not (tmp / "dcp").exists() and beside(tmp / "dcp") == []


def test_the_universal_conversion_refuses_a_source_changed_while_it_ran(world):
    from ckpt_tui.core.convert.universal import UniversalError, convert_to_universal, universal_plan

    tmp, run, ck = world
    plan = universal_plan(ck, out=tmp / "u")
    added = ck / "global_step2" / "written-meanwhile.txt"

    def cb(_p) -> None:  # a file appears in the tag folder while the converter runs
        if not added.exists():
            added.write_text("x")

    with pytest.raises(UniversalError, match=r"^the source changed during the conversion \(written-meanwhile"):
        convert_to_universal(plan, on_progress=cb)
    assert not (tmp / "u").exists() and beside(tmp / "u") == []


def test_a_repair_refuses_a_source_changed_while_it_ran(world):
    from ckpt_tui.core.repair.atomic import RepairError, replace_file

    tmp, run, ck = world
    target, watched = ck / "latest", ck / "trainer_state.json"
    old = target.read_bytes()

    def write(fh) -> None:
        fh.write(b"global_step2")
        touch_once(watched)(None)

    with pytest.raises(RepairError) as e:
        replace_file(target, write, backup=True, needed=16, watch=(watched,))
    assert str(e.value) == (
        "the source changed during the repair (trainer_state.json). Nothing was changed; run the repair again once "
        "the checkpoint is complete."
    )
    assert target.read_bytes() == old
    assert not [n for n in os.listdir(ck) if "ckpt-tui" in n]
