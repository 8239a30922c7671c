"""Writes stay where they belong (issue 20, "Data lost or written outside"), against a careless user and
against someone who shares an output folder or hands over a checkpoint. Every case is a real framework
checkpoint (the shared fixtures, copied) plus the smallest hand-made change, and asserts the exit code, the
message and that nothing outside the checkpoint and OUT changed: the whole test folder (the source and a
sentinel file beside it) is snapshotted -- names, types, sizes, mtimes, link targets, content hashes.

- OUT may not be, hold or lie inside a source (the checkpoint, its tag, its components, the run above),
  compared as real paths, for every writer; ``--overwrite`` never removes a folder that holds a source.
- The export lock and every file a writer creates are new files (``O_CREAT|O_EXCL|O_NOFOLLOW``): a link
  planted under their name is refused, never written through.
- ``fix`` never writes through a symlinked tag folder (or file): the dry run and the run say so, exit 1.
- Side files (config, tokenizer) are copied only as regular files of the checkpoint; a link to a private
  file elsewhere, or a corrupt config.json, is not copied, and the export says so.
- Object-store keys that would leave the prefix (``..``) or nest a folder into itself (``ckpt//x``) are
  refused, for the listing and for verify's download.
- What a killed run leaves (universal's temp folder, the TUI "both" export's staging folders) is swept by
  the next run; a live run's never is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt_tui.cli import main_group
from tests.util import FileLease

ROOT = Path(__file__).resolve().parents[3]
SOURCE_REFUSAL = "ckpt-tui never writes into or removes a source"


def tree(root: Path) -> dict:
    """Everything below ``root`` (links not followed): type, size, mtime, link target, content hash."""
    out = {}
    for dp, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dp) / n
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mtime_ns)
            else:
                out[rel] = ("file", st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def cli(*args):
    """ckpt-tui in this process (the cwd is the test's folder): (exit code, stdout, stderr)."""
    r = CliRunner().invoke(main_group, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def world(real_ckpt_copy, tmp_path, monkeypatch):
    """tmp/hf-ds-zero2/checkpoint-2 (an HF Trainer + DeepSpeed ZeRO-2 run, real), a sentinel file and a
    private file beside it; the cwd is tmp."""
    run = real_ckpt_copy("hf-ds-zero2")
    (tmp_path / "sentinel.txt").write_text("keep me\n")
    (tmp_path / "private.json").write_text('{"secret": "do not copy"}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path, run, run / "checkpoint-2"


def changed_outside(before: dict, after: dict, *allowed: str) -> list[str]:
    return sorted(
        k
        for k in set(before) | set(after)
        if before.get(k) != after.get(k) and not any(k == a or k.startswith(a + "/") for a in allowed)
    )


# ------------------------------------------------------------------ 1. OUT and the source


@pytest.mark.parametrize("component", ["model", "optimizer"])
def test_export_out_may_not_be_hold_or_lie_inside_a_source(world, component):
    tmp, run, ck = world
    os.symlink("hf-ds-zero2/checkpoint-2", tmp / "link-to-ck")
    before = tree(tmp)
    cases = {  # --out -> how it relates to a source
        "hf-ds-zero2/checkpoint-2": "is the source",  # the issue: left 3 files, optimizer states gone
        "hf-ds-zero2": "holds the source",  # the run folder above: the whole run deleted
        ".": "holds the source",
        "hf-ds-zero2/checkpoint-2/sub": "is inside the source",  # written into the source
        "hf-ds-zero2/checkpoint-2/global_step2": "is the source",  # the tag (the component)
        "hf-ds-zero2/checkpoint-2/global_step2/sub": "is inside the source",
        "link-to-ck": "is the source",  # a link to the checkpoint: compared as real paths
        "link-to-ck/new": "is inside the source",
    }
    for out, said in cases.items():
        code, _, err = cli("export", "hf-ds-zero2/checkpoint-2", "--out", out, "--overwrite", "--component", component)
        assert code == 1, (out, err)
        assert said in err and SOURCE_REFUSAL in err and "Traceback" not in err, (out, err)
    # the dry run says it too (and so the TUI's wizard, which plans the same way)
    code, out, err = cli(
        "export", "hf-ds-zero2/checkpoint-2", "--out", "hf-ds-zero2", "--dry-run", "--component", component
    )
    assert code == 1 and "holds the source" in err and out == "", err
    # the run folder as SRC: OUT inside it is inside the source
    code, _, err = cli("export", "hf-ds-zero2", "--out", "hf-ds-zero2/merged", "--component", component)
    assert code == 1 and "is inside the source hf-ds-zero2" in err, err
    assert changed_outside(before, tree(tmp)) == []
    # beside the run it is fine, and only OUT appears
    code, _, err = cli("export", "hf-ds-zero2/checkpoint-2", "--out", "merged", "--component", component)
    assert code == 0, err
    assert changed_outside(before, tree(tmp), "merged") == []


def test_the_tui_both_export_may_not_write_a_source(world):
    from ckpt_tui.core.export.api import plan_export
    from ckpt_tui.core.export.both import execute_both
    from ckpt_tui.core.export.write import ExportError

    tmp, run, ck = world
    before = tree(tmp)
    pm, _ = plan_export(ck, tmp / "merged")
    po, _ = plan_export(ck, tmp / "merged", component="optimizer")
    for out, said in ((ck, "is the source"), (run, "holds the source"), (ck / "sub", "is inside the source")):
        for component in ("model", "optimizer"):  # the wizard plans them as export does: refused there
            with pytest.raises(ExportError, match=said):
                plan_export(ck, out, component=component)
        # and the writer refuses them itself, however the plans were made
        with pytest.raises(ExportError, match=said):
            execute_both(dataclasses.replace(pm, out=out), dataclasses.replace(po, out=out))
    assert changed_outside(before, tree(tmp)) == []


def test_conversions_may_not_write_a_source(world):
    tmp, run, ck = world
    before = tree(tmp)
    for args, said in (
        (("universal", ck, "--out", ck / "global_step2" / "u"), "is inside the source"),
        (("universal", ck, "--out", ck), "holds the source"),
        (("convert", ck, "--to", "torch-dcp", "--out", ck / "dcp"), "is inside the source"),
        (("convert", ck, "--to", "torch-dcp", "--out", run), "holds the source"),
    ):
        code, _, err = cli(*args, "--dry-run")
        assert code == 1 and said in err and "Traceback" not in err, (args, err)
    assert changed_outside(before, tree(tmp)) == []


# ------------------------------------------------------------------ 2. no write through a planted link


def test_a_lock_planted_as_a_symlink_is_refused_not_written_through(world):
    tmp, run, ck = world
    os.symlink(tmp / "sentinel.txt", tmp / ".merged.ckpt-tui.lock")  # someone sharing the output folder
    before = tree(tmp)
    code, _, err = cli("export", "hf-ds-zero2/checkpoint-2", "--out", "merged")
    assert code == 1 and "is a symbolic link" in err and "Traceback" not in err, err
    assert (tmp / "sentinel.txt").read_text() == "keep me\n"
    assert changed_outside(before, tree(tmp)) == []
    # a killed export's lock (a regular file) is reused, and removed afterwards
    os.unlink(tmp / ".merged.ckpt-tui.lock")
    (tmp / ".merged.ckpt-tui.lock").write_bytes(b"")
    code, _, err = cli("export", "hf-ds-zero2/checkpoint-2", "--out", "merged")
    assert code == 0, err
    assert not (tmp / ".merged.ckpt-tui.lock").exists()


def test_created_files_are_new_files_never_through_a_link(tmp_path):
    from ckpt_tui.core.fsutil import copy_new, create_new, write_synced

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    for name in ("a", "b", "c"):
        os.symlink(victim, tmp_path / name)
    with pytest.raises(FileExistsError):
        create_new(tmp_path / "a")
    with pytest.raises(FileExistsError):
        write_synced(tmp_path / "b", b"x")
    (tmp_path / "src").write_text("data")
    with pytest.raises(FileExistsError):
        copy_new(tmp_path / "src", tmp_path / "c")
    assert victim.read_text() == "keep me\n"


# ------------------------------------------------------------------ 3. repairs never through a link


def test_fix_refuses_a_symlinked_tag_folder(real_ckpt_copy, tmp_path, monkeypatch):
    """ck/global_step2 is a link to another checkpoint's tag: `fix` would add universal_checkpoint_info to
    the other checkpoint's model states."""
    run = real_ckpt_copy("hf-ds-zero2")
    other = run / "checkpoint-2"
    ck = tmp_path / "ck"
    ck.mkdir()
    os.symlink(other / "global_step2", ck / "global_step2")
    (ck / "latest").write_text("global_step2")
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    code, out, err = cli("fix", "ck", "--dry-run")
    assert code == 1 and "ck/global_step2 is a symbolic link" in out, out + err
    code, out, err = cli("fix", "ck", "--yes")
    assert code == 1 and "ck/global_step2 is a symbolic link" in out and "Traceback" not in err, out + err
    assert changed_outside(before, tree(tmp_path)) == []
    # the core refuses it too, however it is called
    from ckpt_tui.core.repair.atomic import RepairError, replace_file

    with pytest.raises(RepairError, match="symbolic link"):
        replace_file(
            ck / "global_step2" / "mp_rank_00_model_states.pt", lambda f: f.write(b"x"), backup=True, needed=1, root=ck
        )
    assert changed_outside(before, tree(tmp_path)) == []


def test_fix_refuses_a_symlinked_latest(real_ckpt_copy, tmp_path, monkeypatch):
    ck = real_ckpt_copy("hf-ds-zero2") / "checkpoint-2"
    (tmp_path / "elsewhere").write_text("global_step9")
    (ck / "latest").unlink()
    os.symlink(tmp_path / "elsewhere", ck / "latest")  # names no tag: latest-dangling, fixable
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    code, out, err = cli("fix", ck, "--only", "latest", "--yes")
    assert code == 1 and "latest is a symbolic link" in out, out + err
    assert changed_outside(before, tree(tmp_path)) == []


# ------------------------------------------------------------------ 4. side files


def test_side_files_linked_out_of_the_checkpoint_or_corrupt_are_not_copied(world):
    tmp, run, ck = world
    (ck / "config.json").unlink()
    os.symlink(tmp / "private.json", ck / "config.json")  # a private file elsewhere
    os.symlink("/etc/hostname", ck / "tokenizer.json")
    (ck / "generation_config.json").write_text("{not json")  # inspect calls it corrupt
    before = tree(tmp)
    code, out, err = cli("export", "hf-ds-zero2/checkpoint-2", "--out", "merged")
    assert code == 0, err
    got = sorted(p.name for p in (tmp / "merged").iterdir())
    assert got == ["model.safetensors"], got
    assert "config.json in hf-ds-zero2/checkpoint-2 was not copied: it is a symbolic link" in out, out
    assert "tokenizer.json in hf-ds-zero2/checkpoint-2 was not copied" in out
    assert "generation_config.json in hf-ds-zero2/checkpoint-2 was not copied: it is not valid JSON" in out
    assert changed_outside(before, tree(tmp), "merged") == []


def test_a_symlinked_rng_state_is_not_carried_into_a_conversion(world):
    from ckpt_tui.core.convert.torch_dcp import torch_dcp_plan

    tmp, run, ck = world
    (ck / "rng_state_1.pth").unlink()
    os.symlink(tmp / "private.json", ck / "rng_state_1.pth")
    plan = torch_dcp_plan(ck, tmp / "dcp")
    assert [f.name for f in plan.carried] == ["rng_state_0.pth"]
    assert any(x.startswith("rng_state_1.pth: it is a symbolic link") for x in plan.not_carried), plan.not_carried


# ------------------------------------------------------------------ 5. object-store keys


@pytest.fixture(scope="module")
def hostile_s3(tmp_path_factory):
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install 'ckpt-tui[s3]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (the test extra)")
    from tests.fixtures import fixture_path
    from tests.functional.storage.conftest import MotoServer

    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto_server.log")
    try:
        s3 = server.client()
        s3.create_bucket(Bucket="hostile")
        ck = fixture_path("hf-ds-zero2") / "checkpoint-2"
        server.upload("hostile", ck, "clean")
        for prefix, extra in (("dotdot", "global_step2/../../../../escaped.txt"), ("empty", "global_step2//x.pt")):
            # a real file of the checkpoint beside the planted key: refused at the listing, nothing is read
            s3.upload_file(
                str(ck / "global_step2" / "mp_rank_00_model_states.pt"),
                "hostile",
                f"{prefix}/global_step2/mp_rank_00_model_states.pt",
            )
            s3.put_object(Bucket="hostile", Key=f"{prefix}/{extra}", Body=b"planted")
        yield server
    finally:
        server.stop()


def test_object_keys_that_leave_the_prefix_are_refused(hostile_s3, tmp_path, monkeypatch):
    for k, v in hostile_s3.env.items():
        monkeypatch.setenv(k, v)
    from ckpt_tui.core import storage

    monkeypatch.setattr(storage, "_fs_cache", {})  # this server's filesystem, not left for later tests
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("export", "s3://hostile/clean", "--out", "merged")
    assert code == 0, err
    # a verify killed while it downloads leaves its temp folder (owned, its lock held until the kill) ...
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from ckpt_tui.core.fsutil import owned_temp; "
            f"print(owned_temp({str(base)!r}, 'ckpt-tui-verify-'), flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    killed = Path(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert killed.is_dir()
    # ... which the next verify sweeps; it downloads every key under its own temp folder and removes it
    code, _, err = cli("verify", "merged", "--against", "s3://hostile/clean")
    assert code == 0 and list(base.iterdir()) == [], err
    before = tree(tmp_path)
    for prefix, what in (("dotdot", "a `..` segment"), ("empty", "an empty segment")):
        code, out, err = cli("inspect", f"s3://hostile/{prefix}")
        assert code == 2 and what in err and "Traceback" not in err, err
        code, out, err = cli("verify", "merged", "--against", f"s3://hostile/{prefix}")
        assert code == 2 and what in err and "Traceback" not in err, err
    assert changed_outside(before, tree(tmp_path), "tmp") == [] and list(base.iterdir()) == []  # temp: removed
    assert not list(tmp_path.rglob("escaped.txt")) and not (tmp_path.parent / "escaped.txt").exists()


# ------------------------------------------------------------------ 6. what killed runs leave


BOTH_KILL = """
import sys
from pathlib import Path
from ckpt_tui.core.export.api import plan_export
from ckpt_tui.core.export.both import execute_both

src, out = sys.argv[1], Path(sys.argv[2])
pm, _ = plan_export(src, out)
po, _ = plan_export(src, out, component="optimizer")
print("PLANNED", flush=True)
sys.stdin.readline()
execute_both(pm, po)
"""


def test_the_both_export_sweeps_what_a_killed_one_left(world):
    """kill -9 of the TUI's "both" export while it copies config.json into its staging folder (held by a
    lease: the point is certain) leaves that folder (``.merged.tmp-PID``) and OUT's lock beside OUT; the next run
    removes them."""
    tmp, run, ck = world
    script = tmp / "both_kill.py"
    script.write_text(BOTH_KILL)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ck), str(tmp / "merged")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    lease = None
    try:
        assert proc.stdout.readline() == "PLANNED\n", proc.stderr.read()
        lease = FileLease(ck / "config.json")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        lease.wait_blocked(proc=proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if lease is not None:
            lease.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = sorted(p.name for p in tmp.iterdir())
    assert any(n.startswith(".merged.tmp-") for n in left), left  # the one staging folder of both plans
    assert ".merged.ckpt-tui.lock" in left, left  # OUT's own lock
    assert not (tmp / "merged").exists()
    from ckpt_tui.core.export.api import plan_export
    from ckpt_tui.core.export.both import execute_both

    pm, _ = plan_export(ck, tmp / "merged")
    po, _ = plan_export(ck, tmp / "merged", component="optimizer")
    execute_both(pm, po)
    assert sorted(p.name for p in tmp.iterdir() if "merged" in p.name) == ["merged"]
    assert {"model.safetensors", "optimizer.safetensors", "config.json"} <= {p.name for p in (tmp / "merged").iterdir()}


UNIVERSAL_KILL = """
import sys
from pathlib import Path
from ckpt_tui.core.convert.universal import convert_to_universal, universal_plan

class Stop:  # asked in the wait loop, once the temp folder and the converter exist: hold there
    def is_set(self):
        print("RUNNING", flush=True)
        sys.stdin.readline()
        return False

plan = universal_plan(sys.argv[1])
convert_to_universal(plan, cancel=Stop())
"""


def test_universal_sweeps_the_temp_folder_a_killed_run_left(world):
    from ckpt_tui.core.convert.universal import convert_to_universal, universal_plan
    from ckpt_tui.core.convert.universal.plan import TMP_PREFIX
    from ckpt_tui.core.fsutil import owned_temp, remove_temp
    from ckpt_tui.core.progress import Cancelled
    from tests.functional.core.test_universal import wait_gone

    tmp, run, ck = world
    script = tmp / "universal_kill.py"
    script.write_text(UNIVERSAL_KILL)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ck)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout.readline() == "RUNNING\n", proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    staging = f".{universal_plan(ck).out.name}.universal-"  # its staging folder, beside OUT
    left = [p for p in ck.iterdir() if p.name.startswith(staging)]
    assert len(left) == 1, left
    assert wait_gone(str(left[0]), 30) == [], "the converter outlived ckpt-tui"
    live = owned_temp(ck, TMP_PREFIX)  # a live run's temp folder (as older versions made it): never swept
    try:
        cancel = threading.Event()
        cancel.set()  # the next run: it sweeps, then stops at once (cancelled)
        with pytest.raises(Cancelled):
            convert_to_universal(universal_plan(ck), cancel=cancel)
        assert not left[0].exists()
        assert live.is_dir()
        assert [p for p in ck.iterdir() if p.name.startswith(TMP_PREFIX)] == [live]
        assert [p for p in ck.iterdir() if p.name.startswith(staging)] == []
    finally:
        remove_temp(live)


def test_a_folder_not_provably_ours_is_never_swept(tmp_path):
    from ckpt_tui.core.fsutil import OWNER_FILE, sweep_stale

    (tmp_path / ".ckpt-tui-universal-nolock").mkdir()  # no owner lock: not known to be ours
    (tmp_path / ".ckpt-tui-universal-nolock" / "data").write_text("x")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / OWNER_FILE).write_text("")
    (tmp_path / "target" / "data").write_text("x")
    os.symlink(tmp_path / "target", tmp_path / ".ckpt-tui-universal-link")  # a link: never followed
    assert sweep_stale(tmp_path, ".ckpt-tui-universal-") == []
    assert (tmp_path / ".ckpt-tui-universal-nolock" / "data").exists() and (tmp_path / "target" / "data").exists()
    assert json.dumps(sorted(os.listdir(tmp_path)))


def test_an_overwrite_killed_between_its_renames_gets_the_old_out_back(world):
    """A kill -9 between `OUT -> .OUT.old-PID` and `.OUT.tmp-PID -> OUT` leaves no OUT: the next export into OUT
    puts the old one back (never sweeps it) and, without --overwrite, does not replace it."""
    tmp, run, ck = world
    old = tmp / ".merged.old-999999"
    old.mkdir()
    (old / "mine.txt").write_text("the user's old output\n")
    code, _, err = cli("export", "hf-ds-zero2/checkpoint-2", "--out", "merged")
    assert code == 1 and "appeared and is not empty" in err, err
    assert (tmp / "merged" / "mine.txt").read_text() == "the user's old output\n" and not old.exists()


def test_a_tag_given_as_src_protects_its_checkpoint_from_removal(world):
    """SRC is the tag folder: OUT may not be (or hold) its checkpoint, whose `latest` and files it reads; a new
    folder beside the tag, where `fix`'s advice and the TUI put the export, is allowed."""
    tmp, run, ck = world
    before = tree(tmp)
    code, _, err = cli(
        "export", "hf-ds-zero2/checkpoint-2/global_step2", "--out", "hf-ds-zero2/checkpoint-2", "--overwrite"
    )
    assert code == 1 and "holds the source" in err, err
    assert changed_outside(before, tree(tmp)) == []
    code, _, err = cli(
        "export", "hf-ds-zero2/checkpoint-2/global_step2", "--out", "hf-ds-zero2/checkpoint-2/global_step2_exported"
    )
    assert code == 0, err
    # only the new folder, and the mtime of the folder that holds it
    assert changed_outside(before, tree(tmp), "hf-ds-zero2/checkpoint-2/global_step2_exported") == [
        "hf-ds-zero2/checkpoint-2"
    ]
