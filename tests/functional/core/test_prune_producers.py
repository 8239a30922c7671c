"""`ckpt-tui prune` (issue 28) on run folders built from copies of what verl, Lightning (DeepSpeed ZeRO-2, FSDP)
and Megatron-Core 0.19 wrote: what `--what optimizer` removes -- verl's `optim_*` beside the model files, a
Lightning DeepSpeed ZeRO-2 .ckpt folder's `*_optim_states.pt` beside its `mp_rank_00_model_states.pt` -- or refuses
with which reason (a Lightning FSDP .ckpt folder and a Megatron torch_dist `iter_N`: model and optimizer in the same
.distcp files), and what `--what checkpoint --keep-last N` removes. Every kept file is checked byte for byte. A
folder of Lightning .ckpt files is not recognised as a run: prune says so and changes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.functional.core.test_prune import _findings, _planned, _prune, _sums
from tests.util import ckpt_tui

# fixture, its run folder, the checkpoint it holds, the copies made beside it (older and newer), what names the newest
RUNS = {
    "verl-fsdp2": ("checkpoints", "global_step_1", ("global_step_2", "global_step_3"), None),
    "lightning-ds-zero2": ("checkpoints", "epoch=0-step=2.ckpt", ("epoch=0-step=1.ckpt", "epoch=0-step=3.ckpt"), None),
    "lightning-fsdp": ("checkpoints", "epoch=0-step=2.ckpt", ("epoch=0-step=1.ckpt", "epoch=0-step=3.ckpt"), None),
    "megatron-dist-019": ("checkpoints", "iter_0000010", ("iter_0000005", "iter_0000015"), "15"),
}


def _run(real_ckpt_copy, name: str) -> tuple[Path, list[str]]:
    """A run folder of three checkpoints from fixture ``name``: its own and copies (copy2: the files keep their
    mtimes); the checkpoints oldest first."""
    sub, orig, copies, tracker = RUNS[name]
    run = real_ckpt_copy(name) / sub
    for c in copies:
        (shutil.copytree if (run / orig).is_dir() else shutil.copy2)(run / orig, run / c)
    if tracker is not None:  # Megatron names its newest in latest_checkpointed_iteration.txt
        (run / "latest_checkpointed_iteration.txt").write_text(tracker)
    cks = sorted({orig, *copies})
    cks.sort(key=lambda c: int("".join(ch for ch in c.rsplit("_", 1)[-1].split("=")[-1] if ch.isdigit())))
    return run, cks


def _inspected(run: Path) -> dict[str, bool]:
    """Each checkpoint of the run and whether inspect calls it complete (a Megatron `checkpoints/` folder is listed
    by its iter_N folders: complete when no error finding lies in one)."""
    doc = json.loads(ckpt_tui("inspect", str(run), "--json", cwd=run.parent).stdout)
    if "checkpoints" in doc:
        return {c["path"]: c["complete"] for c in doc["checkpoints"]}
    errors = {f["path"].split("/")[0] for f in doc["findings"] if f["severity"] == "error"}
    return {p.name: p.name not in errors for p in run.iterdir() if p.name.startswith("iter_")}


# ---------------------------------------------------------------------------------------------- --what optimizer


@pytest.mark.parametrize(
    "name,files,note,resumes",
    [
        (
            "verl-fsdp2",
            [f"actor/optim_world_size_2_rank_{r}.pt" for r in (0, 1)],
            "",
            "resumes it only with `optimizer` left out of the actor's `checkpoint.load_contents`",
        ),
        (
            "lightning-ds-zero2",
            [f"checkpoint/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)],
            "fp32 master weights",
            "DeepSpeed cannot resume it",
        ),
    ],
)
def test_what_optimizer_removes_only_optimizer_files_beside_whole_weights(real_ckpt_copy, name, files, note, resumes):
    run, cks = _run(real_ckpt_copy, name)
    assert _inspected(run) == {c: True for c in cks}
    before = _sums(run)
    rc, dry = _prune(run)
    old = cks[:-1]  # the newest is kept (and named by the tracker)
    assert rc == 0 and _planned(dry) == [f"{c}/{f}" for c in reversed(old) for f in files], dry
    assert all(note in c["note"] for c in dry["plan"]["checkpoints"])
    assert [k["path"] for k in dry["plan"]["kept"]] == [cks[-1]]
    rc, done = _prune(run, "--yes", "--force")
    assert rc == 0 and done["removed"] == _planned(dry) and done["bytes_freed"] == dry["plan"]["bytes"] > 0
    after = _sums(run)
    assert set(before) - set(after) == set(_planned(dry))
    assert all(after[k] == v for k, v in before.items() if k in after)  # the model files and the rest, as they were
    assert _inspected(run) == {c: True for c in cks}  # the weights are whole: complete, model only
    pruned = [f for f in _findings(run) if f["code"] == "optimizer-pruned"]
    assert sorted(f["path"] for f in pruned) == sorted(old)
    assert all(f["severity"] == "warning" and resumes in f["message"] for f in pruned), pruned


@pytest.mark.parametrize(
    "name,reason",
    [
        (
            "lightning-fsdp",
            "a Lightning FSDP .ckpt folder is one DCP holding model and optimizer in the same .distcp files",
        ),
        ("megatron-dist-019", "a Megatron torch_dist checkpoint holds model and optimizer in the same .distcp files"),
    ],
)
def test_what_optimizer_refuses_combined_saves_with_the_reason(real_ckpt_copy, name, reason):
    run, cks = _run(real_ckpt_copy, name)
    before = _sums(run)
    r = ckpt_tui("prune", str(run), "--yes", "--force", cwd=run.parent)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    for c in cks[:-1]:
        assert f"ckpt-tui: refused {c}/: {reason}" in r.stderr, r.stderr
    assert "Nothing to prune" in r.stdout and _sums(run) == before


# ---------------------------------------------------------------------------------------------- --what checkpoint


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("keep_last", [1, 2])
def test_what_checkpoint_keep_last_removes_the_older_checkpoints_whole(real_ckpt_copy, name, keep_last):
    run, cks = _run(real_ckpt_copy, name)
    before = _sums(run)
    rc, dry = _prune(run, "--what", "checkpoint", "--keep-last", str(keep_last))
    gone = cks[: len(cks) - keep_last]
    assert rc == 0 and [c["path"] for c in dry["plan"]["checkpoints"]] == list(reversed(gone)), dry
    assert sorted(k["path"] for k in dry["plan"]["kept"]) == sorted(cks[len(cks) - keep_last :])
    rc, done = _prune(run, "--what", "checkpoint", "--keep-last", str(keep_last), "--yes", "--force")
    assert rc == 0 and done["bytes_freed"] == dry["plan"]["bytes"] > 0, done
    assert not any((run / c).exists() for c in gone)
    after = _sums(run)
    assert after == {k: v for k, v in before.items() if not any(k == c or k.startswith(c + "/") for c in gone)}
    assert _inspected(run) == {c: True for c in cks if c not in gone}


def test_a_folder_of_lightning_ckpt_files_is_a_run_whose_files_prune_refuses_and_leaves(real_ckpt_copy):
    """Lightning's ModelCheckpoint without a strategy that writes folders: epoch=E-step=N.ckpt files beside
    last.ckpt (copies of a .ckpt Lightning wrote). inspect lists them as the run's checkpoints (last.ckpt, which has
    no step, is not one); prune refuses each file, for both --what, and changes nothing."""
    run = real_ckpt_copy("lightning-file-optim")
    for step in (1, 2):
        shutil.copy2(run / "last.ckpt", run / f"epoch=0-step={step}.ckpt")
    doc = json.loads(ckpt_tui("inspect", str(run), "--json", cwd=run.parent).stdout)
    assert doc["layout"] == "run-folder", doc["layout"]
    assert [(c["path"], c["step"], c["layout"]) for c in doc["checkpoints"]] == [
        ("epoch=0-step=2.ckpt", 2, "lightning"),
        ("epoch=0-step=1.ckpt", 1, "lightning"),
    ]
    human = ckpt_tui("inspect", str(run), cwd=run.parent).stdout
    assert "newest `epoch=0-step=2.ckpt`:" in human, human
    before = _sums(run)
    r = ckpt_tui("prune", str(run), "--what", "checkpoint", "--yes", "--force", cwd=run.parent)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r
    assert "keep epoch=0-step=2.ckpt: the newest complete checkpoint" in r.stdout, r.stdout
    assert "refused epoch=0-step=1.ckpt: one .ckpt file: prune removes checkpoint folders only" in r.stderr, r.stderr
    r = ckpt_tui("prune", str(run), "--what", "optimizer", "--yes", "--force", cwd=run.parent)
    assert "Traceback" not in r.stderr and "model and optimizer in one file" in r.stderr, r
    assert _sums(run) == before
