"""The run view: a run folder at a glance (issue 28). One row per checkpoint -- its step, when it was written,
complete or what is wrong with it (the findings' verdict, ``diagnose.mark_complete``: no second completeness rule),
what it holds, its size split into model, optimizer state and the rest -- and the training loss and eval metric at
its step, read from the newest complete checkpoint's ``trainer_state.json`` (``log_history``: each file holds the
whole history up to its step). The newest complete and the best checkpoint are marked.

Pure data for ``inspect`` (text and ``--json``), the TUI and ``prune``: reads the scanned tree's sizes and roles, the
findings, one ``stat`` per checkpoint and one JSON file (size-bounded; any value in it may be hostile: a NaN, a
string where a number belongs, a million entries, escape sequences in a name -- shown through ``safetext.visible``)."""

from __future__ import annotations

import bisect
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, cast

from .facts import TorchZipFacts
from .storage import Location
from .types import Finding, Inventory, Node, RunCheckpointView, RunSummaryDoc

# trainer_state.json is read whole only below this size (a history of 10^6 entries is some 100 MB)
MAX_STATE_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 2_000_000  # log_history entries looked at, at most
MAX_NAME = 200  # a metric name longer than this is not one the Trainer wrote

OPTIMIZER_ROLES = frozenset({"optimizer", "optimizer-shard"})
MODEL_ROLES = frozenset({"model", "model-shard"})
COMBINED_ROLE = "model+optimizer"
HOLD_ROLES = {"scheduler": "scheduler", "rng": "rng"}
# the roles that say what a file below them is (a DCP folder's shards take its role)
OWNING_ROLES = MODEL_ROLES | OPTIMIZER_ROLES | {COMBINED_ROLE, "scheduler", "rng"}
# a file of these roles is part of the folder it is in (a DCP's shards and metadata); any other says what it holds
INHERITING_ROLES = frozenset({"shard", "metadata", "unknown"})

Series = tuple[tuple[int, float], ...]  # (step, value), in log_history's order


@dataclass(frozen=True)
class RunRow:
    """One checkpoint of the run view."""

    path: str  # relative to the scanned root
    step: int
    layout: str
    complete: bool  # diagnose's verdict (no error finding inside it)
    problems: tuple[str, ...]  # what is wrong (short phrases, from its error findings); () when complete
    problem_codes: tuple[str, ...]
    written: Optional[float]  # mtime (seconds since the epoch) of trainer_state.json, else of the checkpoint
    holds: tuple[str, ...]  # of "model", "optimizer", "scheduler", "rng", in that order
    model_bytes: int
    optimizer_bytes: int
    combined_bytes: int  # files holding model and optimizer state together (a Lightning .ckpt, a combined DCP)
    other_bytes: int
    loss: Optional[float] = None  # the train loss logged last at or before its step (NaN kept: the run diverged)
    eval_metric: Optional[float] = None  # the eval metric logged last at or before its step
    newest_complete: bool = False
    best: bool = False

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.optimizer_bytes + self.combined_bytes + self.other_bytes

    def to_json(self) -> RunCheckpointView:
        """The fields ``checkpoints[]`` adds under schema_version 1 (docs/json.md)."""
        return {
            "written": self.written,
            "problems": list(self.problem_codes),
            "holds": list(self.holds),
            "sizes": {
                "model": self.model_bytes,
                "optimizer": self.optimizer_bytes,
                "model+optimizer": self.combined_bytes,
                "other": self.other_bytes,
                "total": self.total_bytes,
            },
            "loss": _json_number(self.loss),
            "eval_metric": _json_number(self.eval_metric),
            "newest_complete": self.newest_complete,
            "best": self.best,
        }


@dataclass(frozen=True)
class RunView:
    rows: tuple[RunRow, ...]  # newest first, as Inventory.checkpoints
    total_bytes: int  # the whole run folder
    optimizer_bytes: int  # what the checkpoints' optimizer states take (files of optimizer state only)
    eval_name: Optional[str]  # the eval metric's name as log_history records it ("eval_loss")
    higher_is_better: bool
    best_source: Optional[str]  # how the best was chosen: "best_global_step", "best_model_checkpoint", "metric"
    history_from: Optional[str]  # the trainer_state.json the metrics come from (relative path)
    no_history: Optional[str]  # why there are no metrics (None: there are)
    series: dict[str, Series] = field(default_factory=dict)  # "loss", eval_name, "learning_rate": as logged

    def row(self, path: str) -> Optional[RunRow]:
        return next((r for r in self.rows if r.path == path), None)

    @property
    def newest_complete(self) -> Optional[RunRow]:
        return next((r for r in self.rows if r.newest_complete), None)

    @property
    def best(self) -> Optional[RunRow]:
        return next((r for r in self.rows if r.best), None)

    def to_json(self) -> RunSummaryDoc:
        """The document's ``run`` (docs/json.md)."""
        return {
            "total_bytes": self.total_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "eval_metric": self.eval_name,
            "higher_is_better": self.higher_is_better,
            "best_source": self.best_source,
            "history_from": self.history_from,
            "no_history": self.no_history,
        }


def _json_number(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None


def _number(v: object) -> Optional[float]:
    """A metric value as the Trainer logs it (an int or a float, NaN and infinities kept), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an int of 400 digits
        return None


def _step(v: object) -> Optional[int]:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
        return None
    return v


# --------------------------------------------------------------------------------------------------- sizes, holds


def _split(ck: Node) -> tuple[tuple[str, ...], int, int, int, int]:
    """(holds, model, optimizer, model+optimizer, other bytes) of a checkpoint, from its files' roles (a file
    below a DCP folder or a tag takes the role of the nearest folder that has one of OWNING_ROLES)."""
    model = optim = combined = other = 0
    held: set[str] = set()

    def visit(n: Node, owner: Optional[str]) -> None:
        nonlocal model, optim, combined, other
        if n.is_dir:
            role = n.role if n.role in OWNING_ROLES else owner
            got = n.facts.get("containers")
            containers: list[object] = list(got) if isinstance(got, list) else []
            if role in MODEL_ROLES and any(str(c).startswith("optim") for c in containers):
                role = COMBINED_ROLE  # a DCP holding the model and its optimizer (Lightning FSDP, torchtitan)
            for name in containers:
                s = str(name)
                if s.startswith("lr_scheduler") or s.startswith("scheduler"):
                    held.add("scheduler")
                elif s.startswith("rng") or s.startswith("random"):
                    held.add("rng")
            for c in n.children:
                visit(c, role)
            return
        if n.facts.get("symlink"):
            return
        role = n.role if n.role not in INHERITING_ROLES else owner
        if role in MODEL_ROLES:
            model += n.size
            held.add("model")
        elif role in OPTIMIZER_ROLES:
            optim += n.size
            held.add("optimizer")
        elif role == COMBINED_ROLE:
            combined += n.size
            held.update(("model", "optimizer"))
        else:
            other += n.size
            if role in HOLD_ROLES:
                held.add(HOLD_ROLES[role])

    visit(ck, None)
    holds = tuple(h for h in ("model", "optimizer", "scheduler", "rng") if h in held)
    return holds, model, optim, combined, other


def _problems(findings: list[Finding], path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(short phrases, codes) of the error findings at or below ``path``."""
    phrases: list[str] = []
    codes: list[str] = []
    for f in findings:
        if f.severity != "error" or not (path == "." or f.path == path or f.path.startswith(path + "/")):
            continue
        codes.append(f.code)
        phrases.append(_phrase(f))
    return tuple(dict.fromkeys(phrases)), tuple(dict.fromkeys(codes))


def _phrase(f: Finding) -> str:
    if f.code == "checkpoint-incomplete":
        if "no trainer_state.json" in f.message:
            return "no trainer_state.json (killed)"
        m = re.search(r"it lacks (.+?), which", f.message)
        if m:
            return "lacks " + re.sub(r" \(optimizer\.pt\)", "", m.group(1))
    return f.code


def _written(ck: Node) -> Optional[float]:
    target = ck.child("trainer_state.json") if ck.is_dir else None
    p = (target or ck).abspath
    try:
        if isinstance(p, Path):
            return os.stat(p, follow_symlinks=False).st_mtime
        return float(p.stat().st_mtime)  # object storage: when the object was written there
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------- the history


@dataclass
class History:
    """What a trainer_state.json says, each value checked."""

    series: dict[str, list[tuple[int, float]]]
    best_global_step: Optional[int] = None
    best_model_checkpoint: Optional[str] = None
    problem: Optional[str] = None  # why nothing could be read


def read_history(path: Location, metric_names: tuple[str, ...] = ("loss", "learning_rate")) -> History:
    """The series of ``metric_names`` in ``path``'s ``log_history`` (entries with an int ``step`` and a number under
    the name), and its best-checkpoint fields. Refuses (``problem``) a file over MAX_STATE_BYTES or not a JSON
    object; reads at most MAX_ENTRIES entries; skips an entry that is not an object, a value that is not a number."""
    series: dict[str, list[tuple[int, float]]] = {n: [] for n in metric_names}
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            return History(series, problem=f"{path.name} is over {MAX_STATE_BYTES // 2**20} MiB: not read")
    except OSError as e:
        return History(series, problem=f"{path.name} cannot be read ({e.strerror or e})")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return History(series, problem=f"{path.name} is not valid JSON")
    if not isinstance(doc, dict):
        return History(series, problem=f"{path.name} is not a JSON object")
    log = doc.get("log_history")
    if isinstance(log, list):
        for entry in log[:MAX_ENTRIES]:
            if not isinstance(entry, dict):
                continue
            step = _step(entry.get("step"))
            if step is None:
                continue
            for name in metric_names:
                v = _number(entry.get(name))
                if v is not None:
                    series[name].append((step, v))
    best_step = _step(doc.get("best_global_step"))
    best_ck = doc.get("best_model_checkpoint")
    return History(
        series,
        best_global_step=best_step,
        best_model_checkpoint=best_ck if isinstance(best_ck, str) and len(best_ck) < 4096 else None,
    )


class _At:
    """A series' value at a step: the value logged at the greatest step at or before it, the one logged last where
    that step was logged more than once (a resumed run logs steps again). Sorted once: a run of 200 checkpoints
    asks 400 times of a history of 2,000 entries."""

    def __init__(self, series: list[tuple[int, float]]) -> None:
        ordered = sorted(range(len(series)), key=lambda i: (series[i][0], i))
        self.steps = [series[i][0] for i in ordered]
        self.values = [series[i][1] for i in ordered]

    def __call__(self, step: int) -> Optional[float]:
        i = bisect.bisect_right(self.steps, step)
        return self.values[i - 1] if i else None


def _training_args(inv: Inventory, ck: Optional[Node]) -> TorchZipFacts:
    n = ck.child("training_args.bin") if ck is not None and ck.is_dir else None
    return cast(TorchZipFacts, n.facts) if n is not None else TorchZipFacts()


def eval_metric_name(name: str) -> str:
    """The key log_history records an eval metric under: the Trainer prefixes ``eval_`` to a name without it."""
    return name if name.startswith("eval_") else "eval_" + name


# --------------------------------------------------------------------------------------------------- the view


def run_view(
    inv: Inventory,
    findings: list[Finding],
    *,
    best_metric: Optional[str] = None,
    higher_is_better: Optional[bool] = None,
) -> RunView:
    """The run view of a scanned run folder (``inv.checkpoints``; an inventory without them gives no rows).
    ``best_metric`` (``--best-metric``) picks the best checkpoint by that eval metric at each checkpoint's step,
    over what the run recorded (``best_global_step``, else ``best_model_checkpoint``); ``higher_is_better`` defaults
    to the run's ``greater_is_better`` for its own metric, else False."""
    nodes = [(c, inv.node(c["path"])) for c in inv.checkpoints]
    newest = next((c for c in inv.checkpoints if c["complete"]), None)
    newest_node = inv.node(newest["path"]) if newest is not None else None
    args = _training_args(inv, newest_node)
    run_metric = args.get("metric_for_best_model")
    metric = best_metric or run_metric or "loss"
    eval_name = eval_metric_name(metric)
    if higher_is_better is None:
        higher_is_better = (
            bool(args.get("greater_is_better")) if best_metric is None or best_metric == run_metric else False
        )

    state = newest_node.child("trainer_state.json") if newest_node is not None and newest_node.is_dir else None
    history: Optional[History] = None
    no_history: Optional[str] = None
    if newest is None:
        no_history = "no checkpoint is complete"
    elif state is None:
        no_history = f"{newest['path']} (the newest complete) has no trainer_state.json"
    else:
        history = (
            read_history(state.abspath, ("loss", eval_name, "learning_rate"))
            if state.size <= MAX_STATE_BYTES
            else History({}, problem=f"{state.path} is over {MAX_STATE_BYTES // 2**20} MiB: not read")
        )
        if history.problem:
            no_history = history.problem
        elif not any(history.series.values()):
            no_history = f"{state.path} records no loss, {eval_name} or learning rate in its log_history"
    series = {k: v for k, v in (history.series if history is not None and not no_history else {}).items() if v}

    last = newest["step"] if newest is not None else -1  # its history ends at its step: none for a later one
    best_path, best_source = _best(inv, history, series.get(eval_name, []), best_metric, higher_is_better)
    rows: list[RunRow] = []
    optimizer_total = 0
    loss_at = _At(series["loss"]) if "loss" in series else None
    eval_at = _At(series[eval_name]) if eval_name in series else None
    for c, found in nodes:
        n = cast(Node, found)  # a checkpoint is a node of the scanned tree (layout._checkpoints)
        holds, model, optim, combined, other = _split(n)
        optimizer_total += optim
        phrases, codes = _problems(findings, c["path"])
        rows.append(
            RunRow(
                path=c["path"],
                step=c["step"],
                layout=c["layout"],
                complete=c["complete"],
                problems=phrases if not c["complete"] else (),
                problem_codes=codes if not c["complete"] else (),
                written=_written(n),
                holds=holds,
                model_bytes=model,
                optimizer_bytes=optim,
                combined_bytes=combined,
                other_bytes=other,
                loss=loss_at(c["step"]) if loss_at is not None and c["step"] <= last else None,
                eval_metric=eval_at(c["step"]) if eval_at is not None and c["step"] <= last else None,
                newest_complete=newest is not None and c["path"] == newest["path"],
                best=c["path"] == best_path,
            )
        )
    return RunView(
        rows=tuple(rows),
        total_bytes=inv.root.size,
        optimizer_bytes=optimizer_total,
        eval_name=eval_name if eval_name in series or best_metric or run_metric else None,
        higher_is_better=higher_is_better,
        best_source=best_source,
        history_from=state.path if state is not None and history is not None else None,
        no_history=no_history,
        series={k: tuple(v) for k, v in series.items()},
    )


def _best(
    inv: Inventory,
    history: Optional[History],
    evals: list[tuple[int, float]],
    best_metric: Optional[str],
    higher: bool,
) -> tuple[Optional[str], Optional[str]]:
    """(the best checkpoint's path, how it was chosen), or (None, None)."""
    cks = inv.checkpoints
    if best_metric is not None:
        at = {s: v for s, v in evals if math.isfinite(v)}  # the value logged at each step (the last one there)
        # the complete ones the history reaches (a later one's value at its step is not in this file's history)
        last = max((c["step"] for c in cks if c["complete"]), default=-1)
        scored = [(at[c["step"]], c) for c in cks if c["step"] in at and c["complete"] and c["step"] <= last]
        if not scored:
            return None, None
        pick = (max if higher else min)(scored, key=lambda sc: sc[0])
        return pick[1]["path"], "metric"
    if history is None:
        return None, None
    if history.best_global_step is not None:
        for c in cks:
            if c["step"] == history.best_global_step:
                return c["path"], "best_global_step"
    if history.best_model_checkpoint:
        base = re.split(r"[\\/]", history.best_model_checkpoint.rstrip("/\\"))[-1]
        for c in cks:
            if c["path"].rsplit("/", 1)[-1] == base:
                return c["path"], "best_model_checkpoint"
    return None, None
