"""`ckpt-tui prune RUN` (issue 28) on copies of real runs: the plan printed is what --yes removes, it keeps what it
must, a SIGKILL at any point leaves every kept file as it was and a checkpoint never `complete` that the next prune
finishes, a pruned run still resumes (HF's resume_from_checkpoint, DeepSpeed's load_checkpoint), ZeRO-3 and
combined DCP are refused, and a symbolic link is never followed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import fixture_path
from tests.util import ckpt_tui

ROOT = Path(__file__).resolve().parents[3]
OPTIM = ("optimizer.pt", "rng_state.pth", "scheduler.pt")


def _copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_path(name), d, symlinks=True)
    return d


def _hf_run(tmp_path: Path, best: int | None = 1) -> Path:
    """hf-killed-save's run/ (checkpoint-2 whole, checkpoint-4 killed before trainer_state.json) with checkpoint-2
    copied as checkpoint-1 and checkpoint-3 (the newest complete); the newest's trainer_state names ``best``."""
    v = _copy("hf-killed-save", tmp_path)
    run = v / "run"
    for n in (1, 3):
        shutil.copytree(run / "checkpoint-2", run / f"checkpoint-{n}")
    state = run / "checkpoint-3" / "trainer_state.json"
    doc = json.loads(state.read_text())
    doc["best_global_step"] = best
    doc["best_model_checkpoint"] = None
    state.write_text(json.dumps(doc))
    return run


def _sums(top: Path) -> dict[str, str]:
    """sha256 of every regular file below ``top`` (links not followed), by path relative to it."""
    out = {}
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                continue
            out[str(p.relative_to(top))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _prune(run: Path, *args: str) -> tuple[int, dict]:
    r = ckpt_tui("prune", str(run), "--json", *args, cwd=run.parent)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def _checkpoints(path: Path) -> dict[str, bool]:
    doc = json.loads(ckpt_tui("inspect", str(path), "--json", cwd=path.parent).stdout)
    return {c["path"]: c["complete"] for c in doc["checkpoints"]}


def _findings(path: Path) -> list[dict]:
    return json.loads(ckpt_tui("inspect", str(path), "--json", cwd=path.parent).stdout)["findings"]


def _planned(doc: dict) -> list[str]:
    return [e["path"] for c in doc["plan"]["checkpoints"] for e in c["remove"]]


# ---------------------------------------------------------------------------------------- the plan, then the plan


def test_the_plan_is_what_yes_removes_and_frees_and_it_keeps_newest_best_and_the_rest(tmp_path):
    run = _hf_run(tmp_path)
    before = _sums(run)
    rc, dry = _prune(run)
    assert rc == 0 and not dry["applied"]
    assert _sums(run) == before  # without --yes nothing changes
    assert _planned(dry) == [f"checkpoint-2/{n}" for n in OPTIM]
    kept = {k["path"]: k["why"] for k in dry["plan"]["kept"]}
    assert "newest complete" in kept["checkpoint-3"] and "best" in kept["checkpoint-1"]
    assert {s["path"] for s in dry["plan"]["skipped"]} == {"checkpoint-4"}  # incomplete: left
    sizes = {p: (run / p).stat().st_size for p in _planned(dry)}
    assert dry["plan"]["bytes"] == sum(sizes.values())
    # the human plan: every path, grouped by checkpoint, the total humanized
    text = ckpt_tui("prune", str(run), cwd=run.parent).stdout
    assert "checkpoint-2/  step 2: would remove 953.8 kB" in text
    assert all(f"  {p}  " in text for p in sizes) and "Nothing was changed" in text
    rc, done = _prune(run, "--yes", "--force")  # --force: the copy's trainer_state.json was just written
    assert rc == 0 and done["applied"] and done["plan"] == dry["plan"]
    assert done["removed"] == _planned(dry) and done["bytes_freed"] == dry["plan"]["bytes"]
    after = _sums(run)
    gone = set(before) - set(after)
    assert gone == set(sizes)
    assert {k: v for k, v in before.items() if k not in gone} == {
        k: v for k, v in after.items() if not k.endswith(".ckpt-tui-prune.json")
    }
    marker = json.loads((run / "checkpoint-2" / ".ckpt-tui-prune.json").read_text())
    assert marker["state"] == "pruned" and marker["remove"] == list(OPTIM) and marker["what"] == "optimizer"
    # inspect: model only, complete (its weights whole), and what resuming means
    assert _checkpoints(run) == {
        "checkpoint-4": False,
        "checkpoint-3": True,
        "checkpoint-2": True,
        "checkpoint-1": True,
    }
    (f,) = [f for f in _findings(run) if f["code"] == "optimizer-pruned"]
    assert f["path"] == "checkpoint-2" and f["severity"] == "info" and "fresh optimizer" in f["message"]
    assert "model only" in f["message"] and "pruned on " in f["message"]
    rc, again = _prune(run)  # nothing left to do
    assert rc == 0 and again["plan"]["checkpoints"] == []


def test_no_keep_best_and_keep_last(tmp_path):
    run = _hf_run(tmp_path)
    rc, doc = _prune(run, "--no-keep-best")
    assert rc == 0 and _planned(doc) == [f"checkpoint-{n}/{f}" for n in (2, 1) for f in OPTIM]
    rc, doc = _prune(run, "--no-keep-best", "--keep-last", "2")
    assert rc == 0 and _planned(doc) == [f"checkpoint-1/{f}" for f in OPTIM]


def test_a_run_written_in_the_last_minute_is_refused_unless_forced(tmp_path):
    run = _hf_run(tmp_path)  # trainer_state.json just written
    before = _sums(run)
    r = ckpt_tui("prune", str(run), "--yes", cwd=run.parent)
    assert r.returncode == 1 and "modified in the last 60 s" in r.stderr and "--force" in r.stderr, r.stderr
    assert "Removing" not in r.stdout and "removing" not in r.stdout, r.stdout  # refused before it says it removes
    assert _sums(run) == before
    r = ckpt_tui("prune", str(run), "--yes", "--quiet-for", "0", cwd=run.parent)
    assert r.returncode == 0, r.stderr


def test_what_checkpoint_removes_old_checkpoints_whole_and_keeps_latest(tmp_path):
    v = _copy("ds-resume-zero2", tmp_path)
    run = v / "checkpoint"
    shutil.copytree(run / "global_step2", run / "global_step1")
    (run / "latest").write_text("global_step1")  # `latest` names the older one: kept too
    rc, doc = _prune(run, "--what", "checkpoint")
    assert rc == 0 and doc["plan"]["checkpoints"] == []
    assert {k["path"] for k in doc["plan"]["kept"]} == {"global_step1", "global_step2"}
    (run / "latest").write_text("global_step2")
    rc, doc = _prune(run, "--what", "checkpoint", "--yes", "--force")
    assert rc == 0 and doc["removed"][-1] == "global_step1" and not (run / "global_step1").exists()
    assert doc["bytes_freed"] == doc["plan"]["bytes"] > 0


# ---------------------------------------------------------------------------------------------- killed at every step

KILL = r"""
import os, signal, sys
from ckpt_tui.core import prune
event, nth = sys.argv[1], int(sys.argv[2])
seen = {"n": 0}
def after(ev, path):
    if ev == event:
        seen["n"] += 1
        if seen["n"] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
prune._after = after
from ckpt_tui.cli import main
main(["prune", sys.argv[3], "--yes", "--force", *sys.argv[4:]])
"""


@pytest.mark.parametrize(
    "what,event,nth",
    [
        ("optimizer", "marker-written", 1),
        ("optimizer", "removed", 1),
        ("optimizer", "removed", 2),
        ("optimizer", "removed", 3),
        ("optimizer", "before-marker-final", 1),
        ("checkpoint", "removed", 2),
        ("checkpoint", "before-marker-final", 1),
    ],
)
def test_a_prune_killed_at_any_point_keeps_every_kept_file_and_the_next_prune_finishes_it(tmp_path, what, event, nth):
    run = _hf_run(tmp_path)
    rc, dry = _prune(run, "--what", what)
    planned = set(_planned(dry))
    before = _sums(run)
    r = subprocess.run(
        [sys.executable, "-c", KILL, event, str(nth), str(run), "--what", what],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == -9, r.stdout + r.stderr
    after = _sums(run)
    kept = {k: v for k, v in before.items() if k not in planned}
    assert {k: after.get(k) for k in kept} == kept  # every kept file, byte for byte
    assert (
        _checkpoints(run).get("checkpoint-2") is False
    )  # half pruned: listed (even emptied to its marker), never complete
    (f,) = [f for f in _findings(run) if f["code"] == "prune-interrupted"]
    assert f["path"] == "checkpoint-2" and f["command"] == f"ckpt-tui prune {run}"
    rc, doc = _prune(run, "--what", what)  # the next prune says it, and finishes it
    assert rc == 0 and [c["finishing"] for c in doc["plan"]["checkpoints"]] == [True]
    rc, doc = _prune(run, "--what", what, "--yes", "--force")
    assert rc == 0, doc
    assert not any((run / p).exists() for p in planned if p != "checkpoint-2")
    now = _sums(run)
    assert {k: now.get(k) for k in kept} == kept
    done = _checkpoints(run)
    if what == "checkpoint":
        assert "checkpoint-2" not in done and not (run / "checkpoint-2").exists()
    else:
        assert done["checkpoint-2"] is True
        assert "optimizer-pruned" in {f["code"] for f in _findings(run)}


# ---------------------------------------------------------------------------------------------- still resumes


def test_a_pruned_hf_run_resumes_from_the_kept_checkpoint_with_hf_resume_from_checkpoint(tmp_path):
    from tests.functional.core.test_whole_and_resume import _resume

    run = _hf_run(tmp_path)
    rc, _ = _prune(run, "--no-keep-best", "--yes", "--force")
    assert rc == 0 and not (run / "checkpoint-1" / "optimizer.pt").exists()
    rc, out = _resume(run.parent, "run/checkpoint-3")  # kept whole
    assert rc == 0 and "RESUMING from step 2" in out, out
    rc, out = _resume(run.parent, "run/checkpoint-1", out="resumed-pruned")  # pruned: a fresh optimizer, as said
    assert rc == 0 and "RESUMING from step 2" in out, out


DS_LOAD = r"""
import json, os, sys
from ckpt_tui.samples._common import TinyLM, finish, init_deepspeed, seed_all
from ckpt_tui.samples.ds_resume import ds_config
init_deepspeed()
import deepspeed, torch.distributed as dist
seed_all()
model = TinyLM()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(2, dist.get_world_size()))
tag = None if sys.argv[2] == "latest" else sys.argv[2]
try:
    path, _ = engine.load_checkpoint(sys.argv[1], tag=tag, load_module_only=tag is not None)
    out = {"loaded": os.path.basename(os.path.dirname(path)), "global_steps": engine.global_steps}
except Exception as e:
    out = {"error": f"{type(e).__name__}: {e}"}
sys.stdout.flush()
if dist.get_rank() == 0:
    os.write(1, ("RESULT " + json.dumps(out) + "\n").encode())
finish()
"""


def test_a_pruned_deepspeed_zero2_run_loads_with_deepspeeds_load_checkpoint(tmp_path):
    from tests.util import torchrun

    v = _copy("ds-resume-zero2", tmp_path)
    run = v / "checkpoint"
    shutil.copytree(run / "global_step2", run / "global_step1")
    rc, doc = _prune(run, "--yes", "--force")
    assert rc == 0 and doc["removed"] == [f"global_step1/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert "fp32 master weights" in doc["plan"]["checkpoints"][0]["note"]
    (f,) = [f for f in _findings(run) if f["code"] == "optimizer-pruned"]
    assert f["severity"] == "warning" and "DeepSpeed cannot resume" in f["message"]
    script = tmp_path / "load.py"
    script.write_text(DS_LOAD)
    (got,) = torchrun(script, run, "latest", nproc=2, cwd=v)
    assert got == {"loaded": "global_step2", "global_steps": 2}, got  # the kept tag: whole, states and all
    (got,) = torchrun(script, run, "global_step1", nproc=2, cwd=v)  # the pruned one: its module weights
    assert got.get("loaded") == "global_step1", got


# ---------------------------------------------------------------------------------------------- refused


def test_zero3_optimizer_files_are_refused_with_the_reason(tmp_path):
    v = _copy("hf-ds-zero3", tmp_path)
    shutil.copytree(v / "checkpoint-2", v / "checkpoint-1")
    before = _sums(v)
    r = ckpt_tui("prune", str(v), "--yes", "--force", cwd=v.parent)
    assert r.returncode == 1 and "ZeRO-3" in r.stderr and "only copy of the weights" in r.stderr, r.stderr
    assert _sums(v) == before


def test_a_combined_dcp_run_is_refused_with_the_reason(tmp_path):
    run = tmp_path / "run"
    for n in (1, 2):
        shutil.copytree(fixture_path("fsdp2-dcp"), run / f"checkpoint-{n}")
    before = _sums(run)
    r = ckpt_tui("prune", str(run), "--yes", "--force", cwd=run.parent)
    assert r.returncode == 1 and "model and optimizer together" in r.stderr, r.stderr
    assert _sums(run) == before


# ---------------------------------------------------------------------------------------------- hostile


def test_a_symbolic_link_in_the_run_is_never_followed_or_removed_through(tmp_path):
    run = _hf_run(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "optimizer.pt").write_bytes(b"precious")
    shutil.copytree(run / "checkpoint-2", outside / "checkpoint-9")
    (run / "checkpoint-2" / "optimizer.pt").unlink()
    (run / "checkpoint-2" / "optimizer.pt").symlink_to(outside / "optimizer.pt")
    (run / "checkpoint-0").symlink_to(outside / "checkpoint-9", target_is_directory=True)
    want = _sums(outside)
    for what in ("optimizer", "checkpoint"):
        rc, doc = _prune(run, "--what", what, "--no-keep-best")
        planned = _planned(doc)
        assert "checkpoint-2/optimizer.pt" not in planned or what == "checkpoint"
        assert not any(p.startswith("checkpoint-0/") for p in planned)
    rc, doc = _prune(run, "--what", "checkpoint", "--no-keep-best", "--yes", "--force")
    assert _sums(outside) == want and (outside / "optimizer.pt").read_bytes() == b"precious"
    assert not (run / "checkpoint-2").exists()  # the link itself went with its checkpoint, its target did not
    assert (run / "checkpoint-0").is_symlink()


def test_a_folder_swapped_for_a_link_after_the_plan_is_not_removed_through(tmp_path):
    from ckpt_tui.core.prune import apply, plan
    from ckpt_tui.core.report import inspect

    run = _hf_run(tmp_path)
    p = plan(run, inspect(run), keep_best=False)
    outside = tmp_path / "outside"
    shutil.move(run / "checkpoint-1", outside)
    (run / "checkpoint-1").symlink_to(outside, target_is_directory=True)
    want = _sums(outside)
    res = apply(p, force=True)
    assert [c for c, _ in res.failed] == ["checkpoint-1"] and _sums(outside) == want


# ---------------------------------------------------------------------------------------------- cancelled


def _state(run: Path, ck: str) -> str | None:
    m = run / ck / ".ckpt-tui-prune.json"
    return json.loads(m.read_text())["state"] if m.exists() else None


@pytest.mark.parametrize(
    "event,nth,marked,states",
    [
        # before the first marker: nothing anywhere
        ("start", 0, None, {"checkpoint-2": None, "checkpoint-1": None}),
        # the marker written, nothing removed yet: the marker is taken back, the checkpoint is as it was
        ("marker-written", 1, None, {"checkpoint-2": None, "checkpoint-1": None}),
        # half way through checkpoint-2: it stays marked, the marker lists what is left
        ("removed", 1, "checkpoint-2", {"checkpoint-2": "pruning", "checkpoint-1": None}),
        # its last removal: checkpoint-2 is finished first, checkpoint-1 not begun
        ("removed", 3, None, {"checkpoint-2": "pruned", "checkpoint-1": None}),
        ("removed", 4, "checkpoint-1", {"checkpoint-2": "pruned", "checkpoint-1": "pruning"}),
    ],
)
def test_a_cancelled_prune_leaves_each_checkpoint_untouched_finished_or_marked(
    tmp_path, monkeypatch, event, nth, marked, states
):
    import threading

    from ckpt_tui.core import prune
    from ckpt_tui.core.progress import Cancelled
    from ckpt_tui.core.report import inspect

    run = _hf_run(tmp_path)
    p = prune.plan(run, inspect(run), keep_best=False)
    assert [c.path for c in p.checkpoints] == ["checkpoint-2", "checkpoint-1"]
    before = _sums(run)
    cancel = threading.Event()
    seen = {"n": 0}

    def after(ev, path):
        if ev == event:
            seen["n"] += 1
            if seen["n"] == nth:
                cancel.set()

    monkeypatch.setattr(prune, "_after", after)
    if event == "start":
        cancel.set()
    reports = []
    with pytest.raises(prune.PruneCancelled) as got:
        prune.apply(p, force=True, on_progress=reports.append, cancel=cancel)
    assert isinstance(got.value, Cancelled) and got.value.marked == marked
    res = got.value.result
    assert {ck: _state(run, ck) for ck in states} == states
    gone = {k for k in before if not (run / k).exists()}
    assert gone == set(res.removed)  # what it says went, went; nothing else
    assert res.removed == _planned({"plan": p.to_json()})[: len(res.removed)]  # in plan order
    assert all(_sums(run).get(k) == v for k, v in before.items() if k not in gone)
    assert reports[-1].done == res.bytes_freed and reports[-1].total == p.bytes
    assert reports[-1].label == f"{len(res.removed)}/6 paths"
    # the next inspect reports it exactly as after a kill, and the next prune finishes it
    interrupted = [f["path"] for f in _findings(run) if f["code"] == "prune-interrupted"]
    assert interrupted == ([marked] if marked else [])
    rc, doc = _prune(run, "--no-keep-best")
    assert [c["path"] for c in doc["plan"]["checkpoints"] if c["finishing"]] == ([marked] if marked else [])
    rc, doc = _prune(run, "--no-keep-best", "--yes", "--force")
    assert rc == 0, doc
    assert {ck: _state(run, ck) for ck in states} == {ck: "pruned" for ck in states}
    assert not any((run / ck / f).exists() for ck in states for f in OPTIM)


SIGINT = r"""
import os, sys, time
from pathlib import Path
from ckpt_tui.core import prune
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
def after(ev, path):
    if ev == "removed" and not ready.exists():
        ready.write_text(path)  # the test sends SIGINT now, then lets the prune go on
        t0 = time.monotonic()
        while not go.exists() and time.monotonic() - t0 < 120:
            time.sleep(0.01)
prune._after = after
from ckpt_tui.cli import main
main(["prune", sys.argv[3], "--yes", "--force", "--no-keep-best"])
"""


def test_ctrl_c_stops_a_prune_before_its_next_removal_with_a_message_and_exit_130(tmp_path):
    import signal
    import time

    run = _hf_run(tmp_path)
    before = _sums(run)
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT, str(ready), str(go), str(run)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    t0 = time.monotonic()
    while not ready.exists():  # the first file removed: the prune waits in its hook
        assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    go.write_text("")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert "interrupted: removed 1 path(s)" in err and "`checkpoint-2/` is marked half pruned" in err, err
    assert f"`ckpt-tui prune {run} --yes` finishes it (with --force within a minute" in err
    assert not (run / "checkpoint-2" / "optimizer.pt").exists()  # the one removal before Ctrl-C
    assert _sums(run) == {k: v for k, v in before.items() if k != "checkpoint-2/optimizer.pt"} | {
        k: v for k, v in _sums(run).items() if k.endswith(".ckpt-tui-prune.json")
    }
    assert _state(run, "checkpoint-2") == "pruning" and _state(run, "checkpoint-1") is None
    assert [f["path"] for f in _findings(run) if f["code"] == "prune-interrupted"] == ["checkpoint-2"]
    r = ckpt_tui("prune", str(run), "--yes", cwd=run.parent)  # the printed command: within a minute, refused
    assert r.returncode == 1 and "modified in the last 60 s" in r.stderr, r.stderr
    r = ckpt_tui("prune", str(run), "--yes", "--force", cwd=run.parent)  # the printed command, with --force
    assert r.returncode == 0 and _state(run, "checkpoint-2") == "pruned", r.stderr
    assert not any((run / "checkpoint-2" / f).exists() for f in OPTIM)
    assert _state(run, "checkpoint-1") is None  # the best: kept by this prune (no --no-keep-best)


# ---------------------------------------------------------------------------------------------- a concurrent writer


def _append(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\0")


@pytest.mark.parametrize(
    "what,change,said",
    [
        # the weights change under an optimizer prune: the per-file check would never see it (they are not removed)
        ("optimizer", lambda ck: _append(ck / "model.safetensors"), "changed: checkpoint-2/model.safetensors"),
        # the last planned file replaced: without the check after the marker, two files would go first
        ("optimizer", lambda ck: os.replace(ck / "rng_state.pth", ck / "scheduler.pt"), "gone: checkpoint-2/rng"),
        ("checkpoint", lambda ck: (ck / "optimizer.pt.tmp").write_bytes(b"x"), "new: checkpoint-2/optimizer.pt.tmp"),
    ],
)
def test_a_checkpoint_changed_before_its_marker_is_left_as_it_was(tmp_path, monkeypatch, what, change, said):
    from ckpt_tui.core import prune
    from ckpt_tui.core.report import inspect

    run = _hf_run(tmp_path)
    p = prune.plan(run, inspect(run), what=what, keep_best=False)
    hit = {}

    def after(ev, path):  # a writer between the plan (and the quiet check) and the marker
        if ev == "marker-written" and path == "checkpoint-2" and not hit:
            change(run / path)
            hit[path] = {k: v for k, v in _sums(run / path).items() if not k.startswith(".ckpt-tui-prune")}

    monkeypatch.setattr(prune, "_after", after)
    res = prune.apply(p, force=True)
    assert list(hit) == ["checkpoint-2"]
    ((path, why),) = res.failed
    assert path == "checkpoint-2" and "changed since the plan was made" in why and said in why, why
    assert "nothing of it was removed" in why
    assert not any(r.startswith("checkpoint-2/") for r in res.removed)
    assert not (run / "checkpoint-2" / ".ckpt-tui-prune.json").exists()  # the marker taken back
    assert _sums(run / "checkpoint-2") == hit["checkpoint-2"]  # as the writer left it: nothing removed
    assert "prune-interrupted" not in {f["code"] for f in _findings(run)}
    assert [r for r in res.removed if r.startswith("checkpoint-1")]  # the next checkpoint is pruned as planned


def test_a_pruned_checkpoint_changed_under_a_whole_prune_keeps_its_pruned_marker(tmp_path, monkeypatch):
    from ckpt_tui.core import prune
    from ckpt_tui.core.report import inspect

    run = _hf_run(tmp_path)
    rc, _ = _prune(run, "--no-keep-best", "--yes", "--force")  # checkpoint-2 and -1: optimizer pruned
    marker = (run / "checkpoint-1" / ".ckpt-tui-prune.json").read_text()
    p = prune.plan(run, inspect(run), what="checkpoint", keep_best=False)
    assert [c.path for c in p.checkpoints] == ["checkpoint-2", "checkpoint-1"]

    def after(ev, path):
        if ev == "marker-written" and path == "checkpoint-1":
            _append(run / path / "model.safetensors")

    monkeypatch.setattr(prune, "_after", after)
    res = prune.apply(p, force=True)
    assert [c for c, _ in res.failed] == ["checkpoint-1"] and not (run / "checkpoint-2").exists()
    assert (run / "checkpoint-1" / ".ckpt-tui-prune.json").read_text() == marker  # "pruned", as it was


# ---------------------------------------------------------------------------------------------- hard links


def test_a_hard_linked_file_frees_its_bytes_only_with_its_last_link(tmp_path):
    run = _hf_run(tmp_path)
    snap = tmp_path / "snapshot"  # `cp -al run snapshot` of checkpoint-2: its files share their bytes
    snap.mkdir()
    for f in OPTIM:
        os.link(run / "checkpoint-2" / f, snap / f)
    size = {f: (run / "checkpoint-2" / f).stat().st_size for f in OPTIM}
    # checkpoint-1's optimizer.pt the same file as checkpoint-2's
    (run / "checkpoint-1" / "optimizer.pt").unlink()
    os.link(snap / "optimizer.pt", run / "checkpoint-1" / "optimizer.pt")
    rc, doc = _prune(run, "--no-keep-best")
    entries = {e["path"]: e for c in doc["plan"]["checkpoints"] for e in c["remove"]}
    assert entries["checkpoint-2/scheduler.pt"]["links"] == 2 and entries["checkpoint-2/scheduler.pt"]["bytes"] == 0
    assert entries["checkpoint-2/optimizer.pt"]["links"] == 3 and entries["checkpoint-2/optimizer.pt"]["bytes"] == 0
    assert entries["checkpoint-1/optimizer.pt"]["bytes"] == 0  # the snapshot keeps it: frees nothing
    assert (
        entries["checkpoint-1/scheduler.pt"]["bytes"]
        == size["scheduler.pt"]
        == entries["checkpoint-1/scheduler.pt"]["size"]
    )
    want = size["scheduler.pt"] + size["rng_state.pth"]  # checkpoint-1's own two files, nothing of checkpoint-2
    assert doc["plan"]["bytes"] == want
    text = ckpt_tui("prune", str(run), "--no-keep-best", cwd=run.parent).stdout
    assert "checkpoint-2/optimizer.pt  0 Bytes  (shared with 1 other link(s) that stay: frees nothing)" in text, text
    rc, done = _prune(run, "--no-keep-best", "--yes", "--force")
    assert rc == 0 and done["bytes_freed"] == want
    assert {f: (snap / f).stat().st_nlink for f in OPTIM} == {f: 1 for f in OPTIM}  # the snapshot whole, alone
    # every link of a file in the plan: its bytes counted once, at its last link
    run2 = _hf_run(tmp_path / "b")
    (run2 / "checkpoint-1" / "optimizer.pt").unlink()
    os.link(run2 / "checkpoint-2" / "optimizer.pt", run2 / "checkpoint-1" / "optimizer.pt")
    rc, doc = _prune(run2, "--no-keep-best")
    entries = {e["path"]: e for c in doc["plan"]["checkpoints"] for e in c["remove"]}
    assert entries["checkpoint-2/optimizer.pt"]["bytes"] == 0
    assert entries["checkpoint-1/optimizer.pt"]["bytes"] == size["optimizer.pt"]
    text = ckpt_tui("prune", str(run2), "--no-keep-best", cwd=run2.parent).stdout
    assert "(a hard link: its bytes are counted at its last link in this plan)" in text
    assert "(the last of its 2 hard links in this plan: frees its bytes)" in text
    rc, done = _prune(run2, "--no-keep-best", "--yes", "--force")
    assert (
        done["bytes_freed"] == doc["plan"]["bytes"] == sum(size.values()) + size["scheduler.pt"] + size["rng_state.pth"]
    )


# ---------------------------------------------------------------------------------------------- the best checkpoint


def _best_run(tmp_path: Path, best_model_checkpoint: str) -> Path:
    """_hf_run with trainer_state.json naming the best by ``best_model_checkpoint`` only, as the training process
    saw it (no best_global_step)."""
    run = _hf_run(tmp_path)
    state = run / "checkpoint-3" / "trainer_state.json"
    doc = json.loads(state.read_text())
    doc.pop("best_global_step", None)
    doc["best_model_checkpoint"] = best_model_checkpoint
    state.write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize(
    "path", ["/scratch/job123/out/checkpoint-1", "/scratch/job123/out/checkpoint-1/", r"D:\job\out\checkpoint-1"]
)
def test_best_model_checkpoint_is_resolved_by_its_basename_inside_the_run(tmp_path, path):
    from ckpt_tui.core.report import inspect

    run = _best_run(tmp_path, path)
    rc, doc = _prune(run)
    kept = {k["path"]: k["why"] for k in doc["plan"]["kept"]}
    assert "best" in kept["checkpoint-1"] and _planned(doc) == [f"checkpoint-2/{n}" for n in OPTIM]
    view = inspect(run).run_view()  # the run view marks the same one
    assert view.best is not None and view.best.path == "checkpoint-1" and view.best_source == "best_model_checkpoint"
    rc, doc = _prune(run, "--what", "checkpoint", "--yes", "--force")
    assert rc == 0 and (run / "checkpoint-1").is_dir() and not (run / "checkpoint-2").exists()


def test_a_hostile_best_model_checkpoint_never_reaches_outside_the_run(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "etc").mkdir()
    (outside / "etc" / "passwd").write_text("canary")
    for i, best in enumerate(("../../etc", str(outside / "etc"), "/scratch/out/checkpoint-9", "/", "..")):
        run = _best_run(tmp_path / f"t{i}", best)
        victim = outside / f"checkpoint-9-{i}"
        shutil.copytree(run / "checkpoint-2", victim)
        (run / "checkpoint-9").symlink_to(victim, target_is_directory=True)  # named like a checkpoint, outside RUN
        want = _sums(outside)
        for what in ("optimizer", "checkpoint"):
            for extra in ((), ("--no-keep-best",)):
                r = ckpt_tui("prune", str(run), "--what", what, "--yes", "--force", *extra, cwd=run.parent)
                assert "Traceback" not in r.stderr, r.stderr
                assert _sums(outside) == want, (best, what, extra)
                assert (run / "checkpoint-9").is_symlink()
        assert not (run / "checkpoint-1").exists()  # never kept as "the best": nothing in RUN is it
