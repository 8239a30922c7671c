"""The run view (issue 28): on run folders the real frameworks wrote (HF Trainer under FSDP2 and DeepSpeed, a killed
and a half-rotated HF save, Lightning, torchtitan, Megatron-Core, verl), each checkpoint's step, completeness, sizes
(oracle: the files on disk, summed by what their names say they hold), metrics (oracle: trainer_state.json read with
json) and the best checkpoint; then hostile trainer_state.json files, and `inspect`'s text and --json."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from ckpt_tui.cli.run_table import run_lines
from ckpt_tui.core.names import step_of
from ckpt_tui.core.report import inspect
from ckpt_tui.core.run_view import RunView, run_view
from tests.fixtures import fixture_path
from tests.util import ckpt_tui

# variant -> (the run folder inside it, its checkpoints' steps newest first, the incomplete ones)
RUNS = {
    "hf-fsdp2": (".", [2], set()),
    "hf-ds-zero2": (".", [2], set()),
    "hf-killed-save": ("run", [4, 2], {4}),
    "hf-rotation-killed": ("run", [2, 1], {1}),
    "lightning-fsdp": (".", [2], set()),
    "lightning-ds-zero2": (".", [2], set()),
    "torchtitan": (".", [2, 1], set()),
    "megatron-dist": (".", [10], set()),
    "verl-fsdp2": (".", [1], set()),
}
# what a file holds by its name alone (the oracle: not the scan's roles)
OPTIMIZER_NAME = re.compile(r"(^|/)(optimizer\.pt|optimizer_\d+/.*|[^/]*_optim_states\.pt|optim_world_size_.*\.pt)$")


def _files(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if not p.is_symlink():
                out[p.relative_to(root).as_posix()] = p.stat().st_size
    return out


def _view(path: Path, **kw) -> RunView:
    rep = inspect(path)
    return run_view(rep.inventory, rep.findings, **kw)


@pytest.mark.parametrize("variant", sorted(RUNS))
def test_steps_completeness_and_sizes_are_the_files_on_disk(variant):
    sub, steps, broken = RUNS[variant]
    run = fixture_path(variant) / sub
    view = _view(run)
    assert [r.step for r in view.rows] == steps
    assert all(step_of(r.path.rsplit("/", 1)[-1]) == r.step for r in view.rows)
    assert {r.step for r in view.rows if not r.complete} == broken
    for r in view.rows:
        assert bool(r.problems) == (r.step in broken)
    newest = next(r for r in view.rows if r.step not in broken)
    assert [r.path for r in view.rows if r.newest_complete] == [newest.path]
    for r in view.rows:
        on_disk = _files(run / r.path) if (run / r.path).is_dir() else {"": (run / r.path).stat().st_size}
        assert r.total_bytes == sum(on_disk.values()), r
        optim = sum(s for p, s in on_disk.items() if OPTIMIZER_NAME.search(p))
        assert r.optimizer_bytes == optim, (r, optim)
    assert view.optimizer_bytes == sum(r.optimizer_bytes for r in view.rows)
    assert view.total_bytes == sum(_files(run).values())


@pytest.mark.parametrize("variant", ["hf-fsdp2", "hf-ds-zero2", "hf-killed-save", "hf-rotation-killed"])
def test_metrics_equal_the_newest_complete_checkpoints_log_history(variant):
    sub, _, broken = RUNS[variant]
    run = fixture_path(variant) / sub
    view = _view(run)
    newest = view.newest_complete
    assert newest is not None and view.no_history is None
    assert view.history_from == f"{newest.path}/trainer_state.json"
    log = json.loads((run / newest.path / "trainer_state.json").read_text())["log_history"]
    assert view.series["loss"] == tuple((e["step"], e["loss"]) for e in log if "loss" in e)
    assert view.series["learning_rate"] == tuple((e["step"], e["learning_rate"]) for e in log if "learning_rate" in e)
    for r in view.rows:
        logged = [e["loss"] for e in log if "loss" in e and e["step"] <= r.step]
        assert r.loss == (logged[-1] if logged and r.step <= newest.step else None), r
    # HF's holds: the complete ones everything a Trainer save has
    assert set(newest.holds) >= {"model", "optimizer", "rng"}


@pytest.mark.parametrize("variant", ["lightning-fsdp", "torchtitan", "megatron-dist", "verl-fsdp2"])
def test_runs_without_trainer_state_have_no_metrics_and_say_why(variant):
    sub, _, _ = RUNS[variant]
    view = _view(fixture_path(variant) / sub)
    assert view.series == {} and "trainer_state.json" in (view.no_history or "")
    assert all(r.loss is None and r.eval_metric is None and not r.best for r in view.rows)


def _with_state(tmp_path: Path, edit) -> Path:
    """A copy of hf-killed-save's run whose complete checkpoint-2's trainer_state.json is ``edit``ed."""
    run = tmp_path / "run"
    shutil.copytree(fixture_path("hf-killed-save") / "run", run, symlinks=True)
    p = run / "checkpoint-2" / "trainer_state.json"
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    return run


def _evals(doc):
    doc["log_history"] += [
        {"step": 1, "eval_loss": 3.0, "eval_acc": 0.5},
        {"step": 2, "eval_loss": 2.5, "eval_acc": 0.4},
    ]


def test_best_is_best_global_step_else_best_model_checkpoints_basename(tmp_path):
    def by_step(doc):
        _evals(doc)
        doc["best_global_step"] = 2
        doc["best_model_checkpoint"] = "/somewhere/else/checkpoint-4"  # best_global_step wins

    view = _view(_with_state(tmp_path / "a", by_step))
    assert view.best is not None and (view.best.path, view.best_source) == ("checkpoint-2", "best_global_step")
    assert view.eval_name == "eval_loss" and view.best.eval_metric == 2.5

    def by_path(doc):
        doc["best_model_checkpoint"] = "/node7/scratch/out/checkpoint-2/"  # the path as the training process saw it

    view = _view(_with_state(tmp_path / "b", by_path))
    assert view.best is not None and (view.best.path, view.best_source) == ("checkpoint-2", "best_model_checkpoint")

    def nowhere(doc):
        doc["best_model_checkpoint"] = "/x/checkpoint-999"

    assert _view(_with_state(tmp_path / "c", nowhere)).best is None


def test_best_metric_overrides(tmp_path):
    def evals(doc):
        _evals(doc)
        doc["log_history"].append({"step": 4, "eval_acc": 0.9})  # after the newest complete one: not its own
        doc["best_global_step"] = 2

    run = _with_state(tmp_path, evals)
    # checkpoint-1 does not exist here: the only scored one is checkpoint-2
    view = _view(run, best_metric="acc", higher_is_better=True)
    assert view.eval_name == "eval_acc" and view.best_source == "metric"
    assert view.best is not None and view.best.step == 2 and view.best.eval_metric == 0.4
    # through the CLI
    doc = json.loads(
        ckpt_tui("inspect", str(run), "--json", "--best-metric", "eval_acc", "--higher-is-better", cwd=tmp_path).stdout
    )
    assert doc["run"]["eval_metric"] == "eval_acc" and doc["run"]["best_source"] == "metric"
    assert [c["best"] for c in doc["checkpoints"]] == [False, True]


def test_hostile_trainer_state(tmp_path):
    esc = "eval_\x1b]0;pwned\x07loss"

    def hostile(doc):
        doc["log_history"] = [
            {"step": 1, "loss": float("nan"), "learning_rate": "0.1"},
            {"step": 2, "loss": "5.0", esc: 1.0},
            {"step": True, "loss": 9.0},
            {"step": 2, "loss": 10**400},
            "not an entry",
            {"step": 2, "loss": float("inf")},
        ]
        doc["best_global_step"] = "2"
        doc["best_model_checkpoint"] = ["checkpoint-2"]

    run = _with_state(tmp_path / "a", hostile)
    view = _view(run, best_metric=esc)
    ck = view.row("checkpoint-2")
    assert ck is not None and ck.loss == math.inf and view.best is ck  # the metric's own name, whatever it holds
    assert math.isnan(view.series["loss"][0][1]) and "learning_rate" not in view.series
    text = "\n".join(run_lines(view))
    assert "\x1b" not in text and "\\x1b" in text
    doc = json.loads(ckpt_tui("inspect", str(run), "--json", cwd=tmp_path).stdout)  # valid JSON: a NaN is null
    assert [c["loss"] for c in doc["checkpoints"]] == [None, None]

    for bad in ("[1, 2]", "{", "\ufeff" * 3):
        run = _with_state(tmp_path / f"b{len(bad)}{bad[0]!r}", lambda doc, bad=bad: bad)
        # not a JSON object: the doc is written as the string itself
        (run / "checkpoint-2" / "trainer_state.json").write_text(bad)
        view = _view(run)  # (invalid JSON is the scan's file-corrupt: then no checkpoint is complete)
        assert view.series == {} and view.no_history and view.rows[1].loss is None


def test_a_history_of_a_million_entries(tmp_path):
    run = _with_state(tmp_path, lambda doc: None)
    entries = ",".join(f'{{"step":{i},"loss":{1 + 1 / (i + 1)!r},"learning_rate":0.001}}' for i in range(1_000_000))
    (run / "checkpoint-2" / "trainer_state.json").write_text('{"log_history":[' + entries + "]}")
    t0 = time.perf_counter()
    view = _view(run)
    took = time.perf_counter() - t0
    assert len(view.series["loss"]) == 1_000_000 and view.row("checkpoint-2").loss == 1 + 1 / 3
    assert took < 15, took


def test_inspect_text_fits_80_columns_and_says_what_is_missing():
    r = ckpt_tui("inspect", "run", cwd=fixture_path("hf-killed-save"))
    table = r.stdout[r.stdout.index("Checkpoints") : r.stdout.index("Findings")]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert re.search(r"^●\s+2 .* MOSR .* 5\.522 .* ✔$", table, re.M), table
    assert "✖ step 4: no trainer_state.json (killed)" in table
    assert "optimizer states 1.9 MB (66%)" in table
