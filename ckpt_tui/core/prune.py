"""``ckpt-tui prune RUN``: the plan first, then exactly the plan (issue 28).

:func:`plan` reads a run folder (never writes) and says, per checkpoint, every path it would remove and the bytes
that frees, what it keeps and why (the newest complete checkpoint, the one ``latest`` names, the best, the last N)
and what it refuses and why. :func:`apply` removes exactly that plan:

1. the run is locked (``.RUN.ckpt-tui.lock`` beside it, :class:`staging.OutLock`) and must be quiet: no file in it
   modified in the last ``quiet_for`` seconds (a job still writing it), unless ``force``;
2. per checkpoint, before anything is removed, the marker :data:`MARKER` is written into its folder through
   :func:`staging.staged_file` (temp file, fsync, ``os.replace``): ``{"state": "pruning", "remove": [...]}``. While
   it says ``pruning`` inspect reports ``prune-interrupted`` (an error: the checkpoint is never complete, so never
   exported or resumed as such) and the next prune finishes what it lists;
3. once the marker is written, the whole checkpoint is compared with the plan's snapshot of it (every entry's
   kind, device, inode, size, mtime): a writer that changed it after the plan, or between the quiet check and the
   marker, makes prune put the marker back as it was and leave the checkpoint untouched;
4. each path is checked again just before it goes: the same file (device, inode, size, mtime) as planned, reached
   from the run's folder one component at a time with ``O_NOFOLLOW`` (never through a symbolic link, never outside
   RUN), and removed with ``unlinkat``. The cancel token is checked before each checkpoint and between two
   removals: a cancelled prune leaves each checkpoint untouched (its marker taken back when nothing went yet),
   finished, or marked ``pruning`` -- exactly as a kill there would;
5. ``--what optimizer``: the marker is rewritten ``{"state": "pruned", "finished": ...}`` and stays: inspect then
   says ``optimizer-pruned`` (model only, and what that means for resuming). ``--what checkpoint``: the marker goes
   last and the emptied folder with it.

A file hard-linked elsewhere (``cp -al`` snapshots) frees its bytes only with its last link: the plan counts it
0 B unless it removes every link (:func:`_count_links`), and the result counts what each ``unlinkat`` freed.

The marker's name and content are documented in docs/prune.md. No torch, textual or rich here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat as _stat
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

from .progress import Cancelled, OnProgress, report

if TYPE_CHECKING:
    from .types import Node

MARKER = ".ckpt-tui-prune.json"
MARKER_VERSION = 1
WHATS = ("optimizer", "checkpoint")
_MAX_MARKER = 1 << 20
Stamp = tuple[str, int, int, int, int]  # kind, dev, ino, size, mtime_ns (a folder: kind, dev, ino)


class PruneError(Exception):
    """A prune refused as a whole (nothing was removed): the message says why."""


# ------------------------------------------------------------------------------------------------- the marker


def read_marker(folder: Path) -> Optional[dict[str, Any]]:
    """The marker in ``folder`` as a dict (never through a link; at most 1 MiB), or None: none, or not ours."""
    try:
        fd = os.open(os.path.join(folder, MARKER), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_MARKER)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("ckpt_tui_prune") != MARKER_VERSION:
        return None
    if doc.get("state") not in ("pruning", "pruned") or doc.get("what") not in WHATS:
        return None
    if not isinstance(doc.get("remove"), list) or not all(isinstance(p, str) for p in doc["remove"]):
        return None
    return doc


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _day(iso: object) -> str:
    return str(iso)[:10] if isinstance(iso, str) else "an unknown date"


# ---------------------------------------------------------------------------------------------------- the plan


@dataclass
class Entry:
    """One path the plan removes: ``path`` relative to RUN, the bytes removing it frees (a folder or a link: 0; a
    file hard-linked elsewhere: 0 until its last link goes, :func:`_count_links`), ``kind`` file / dir / link, and
    its stamp at plan time (checked again before it goes)."""

    path: str
    bytes: int
    kind: str
    stamp: tuple[int, int, int, int] = (0, 0, 0, 0)  # dev, ino, size, mtime_ns
    size: int = 0  # a file's size
    links: int = 1  # its hard links (st_nlink): a `cp -al` snapshot shares the bytes
    outside: int = 0  # of those, the links the plan does not remove: while one stays, removing this frees nothing

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "kind": self.kind, "size": self.size, "links": self.links}

    def link_note(self) -> str:
        """What a hard link's bytes do, for the printed plan; "" for a file with one link."""
        if self.kind != "file" or self.links < 2:
            return ""
        if self.outside:
            return f"shared with {self.outside} other link(s) that stay: frees nothing"
        if not self.bytes:
            return "a hard link: its bytes are counted at its last link in this plan"
        return f"the last of its {self.links} hard links in this plan: frees its bytes"


@dataclass
class CheckpointPlan:
    path: str  # relative to RUN
    step: int
    what: str  # optimizer | checkpoint
    entries: list[Entry]
    note: str = ""  # what goes with it (the fp32 masters), what it means
    resumes: str = ""  # what the checkpoint still holds afterwards, for the marker
    finishing: bool = False  # an interrupted prune's marker is finished
    # every entry of the checkpoint at plan time (its marker left out): apply compares it again once the marker is
    # written, before the first removal, and leaves a checkpoint that changed as it was (:func:`_changes`)
    tree: dict[str, Stamp] = field(default_factory=dict, repr=False)

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "step": self.step,
            "what": self.what,
            "bytes": self.bytes,
            "note": self.note,
            "finishing": self.finishing,
            "remove": [e.to_json() for e in self.entries],
        }


@dataclass
class Plan:
    run: Path
    what: str
    checkpoints: list[CheckpointPlan] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why): nothing to do there
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why): asked for, cannot be done safely

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.checkpoints)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": str(self.run),
            "what": self.what,
            "bytes": self.bytes,
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "kept": [{"path": p, "why": w} for p, w in self.kept],
            "skipped": [{"path": p, "why": w} for p, w in self.skipped],
            "refused": [{"path": p, "why": w} for p, w in self.refused],
        }


@dataclass
class _Ckpt:
    path: str  # relative to RUN
    step: int
    complete: bool
    layout: str


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _tree_stamp(st: os.stat_result) -> Stamp:
    """What :func:`_snapshot` keeps of an entry: a folder's kind and identity only (writing the marker into it, or a
    removal, changes its mtime; what it holds is in the snapshot itself), the rest's size and mtime too."""
    if _stat.S_ISDIR(st.st_mode):
        return ("dir", st.st_dev, st.st_ino, 0, 0)
    kind = "link" if _stat.S_ISLNK(st.st_mode) else "file" if _stat.S_ISREG(st.st_mode) else "other"
    return (kind, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _snapshot(run_fd: int, rel: str) -> dict[str, Stamp]:
    """Every entry at and below ``rel`` (a path below the run whose folder is ``run_fd``) -> its stamp, reached one
    component at a time without following a link; the prune marker and its temp and lock files left out. OSError
    when ``rel`` cannot be reached so."""
    out: dict[str, Stamp] = {}
    fd, name = _open_parent(run_fd, rel)
    try:
        st = os.lstat(name, dir_fd=fd)
        out[rel] = _tree_stamp(st)
        if not _stat.S_ISDIR(st.st_mode):
            return out
        top = os.open(name, _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)

    def walk(dfd: int, prefix: str, depth: int) -> None:
        with os.scandir(dfd) as it:
            kids = sorted(it, key=lambda e: e.name)
        for e in kids:
            if depth == 0 and (e.name == MARKER or e.name.startswith(f".{MARKER}")):
                continue
            st = e.stat(follow_symlinks=False)
            path = f"{prefix}/{e.name}"
            out[path] = _tree_stamp(st)
            if _stat.S_ISDIR(st.st_mode):
                sub = os.open(e.name, _DIR_FLAGS, dir_fd=dfd)
                try:
                    walk(sub, path, depth + 1)
                finally:
                    os.close(sub)

    try:
        walk(top, rel, 0)
    finally:
        os.close(top)
    return out


def _changes(run_fd: int, c: CheckpointPlan) -> str:
    """What changed in checkpoint ``c`` since its plan was made ("" when nothing did, or the plan has no snapshot)."""
    if not c.tree:
        return ""
    try:
        now = _snapshot(run_fd, c.path)
    except OSError as err:
        return f"it cannot be read again without following a link ({err.strerror})"
    said = []
    for label, paths in (
        ("changed", [p for p in now if p in c.tree and now[p] != c.tree[p]]),
        ("new", [p for p in now if p not in c.tree]),
        ("gone", [p for p in c.tree if p not in now]),
    ):
        if paths:
            more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
            said.append(f"{label}: {sorted(paths)[0]}{more}")
    return "; ".join(said)


def _count_links(p: Plan) -> None:
    """A file with hard links elsewhere (``cp -al`` snapshots) frees its bytes only when its last link goes: each
    such file in the plan counts 0 B, except the last of its links in plan order when the plan removes them all."""
    groups: dict[tuple[int, int], list[Entry]] = {}
    for c in p.checkpoints:
        for e in c.entries:
            if e.kind == "file" and e.links > 1:
                groups.setdefault((e.stamp[0], e.stamp[1]), []).append(e)
    for es in groups.values():
        outside = max(es[0].links - len(es), 0)
        for e in es:
            e.bytes, e.outside = 0, outside
        if not outside:
            es[-1].bytes = es[-1].size


def _entry(run: Path, rel: str) -> Optional[Entry]:
    """``rel`` (below RUN) as an entry, lstat'ed (a link is a link), or None when gone."""
    try:
        st = os.lstat(run / rel)
    except OSError:
        return None
    if _stat.S_ISLNK(st.st_mode):
        return Entry(rel, 0, "link", _stamp(st))
    if _stat.S_ISDIR(st.st_mode):
        return Entry(rel, 0, "dir", _stamp(st))
    if _stat.S_ISREG(st.st_mode):
        return Entry(rel, st.st_size, "file", _stamp(st), st.st_size, st.st_nlink)
    return None


def _tree(run: Path, rel: str) -> list[Entry]:
    """Every entry below and at ``rel``, deepest first (a folder after what it holds); links not followed."""
    top = _entry(run, rel)
    if top is None:
        return []
    if top.kind != "dir":
        return [top]
    out: list[Entry] = []
    try:
        names = sorted(os.listdir(run / rel))
    except OSError:
        return [top]
    for n in names:
        out += _tree(run, f"{rel}/{n}")
    return out + [top]


def _children(folder: Path) -> dict[str, str]:
    """name -> file / dir / link / other of ``folder``'s entries (lstat: links never followed)."""
    out: dict[str, str] = {}
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.is_symlink():
                    out[e.name] = "link"
                elif e.is_dir(follow_symlinks=False):
                    out[e.name] = "dir"
                elif e.is_file(follow_symlinks=False):
                    out[e.name] = "file"
                else:
                    out[e.name] = "other"
    except OSError:
        pass
    return out


def _error_paths(findings: list[Any]) -> set[str]:
    """Every folder at or above an error finding (the completeness rule of diagnose.mark_complete)."""
    broken: set[str] = set()
    for f in findings:
        if f.severity == "error":
            parts = f.path.split("/")
            broken.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return broken


def _checkpoints(run: Path, rep: Any) -> list[_Ckpt]:
    """The run's checkpoints, newest first: the run listing's (inspect), else its folders named with a step (a
    DeepSpeed save folder's tags), each complete when no error finding lies inside it."""
    from .names import step_of

    broken = _error_paths(rep.findings)
    inv = rep.inventory
    if inv.checkpoints:
        cks = [_Ckpt(c["path"], c["step"], bool(c["complete"]), c["layout"]) for c in inv.checkpoints]
    else:
        cks = []
        for name, kind in _children(run).items():
            step = step_of(name)
            if kind == "dir" and step is not None:
                cks.append(_Ckpt(name, step, name not in broken, ""))
        cks.sort(key=lambda c: (-c.step, c.path))
        return cks
    cks.sort(key=lambda c: (-c.step, c.path))
    return cks


def _latest(run: Path, cks: list[_Ckpt]) -> Optional[str]:
    """The checkpoint the run's ``latest`` (DeepSpeed) or ``latest_checkpointed_iteration.txt`` (Megatron, verl)
    names, or None."""
    for name in ("latest", "latest_checkpointed_iteration.txt"):
        try:
            fd = os.open(run / name, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            text = os.read(fd, 256).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
        for c in cks:
            if c.path == text or (name != "latest" and text.isdigit() and c.step == int(text)):
                return c.path
    return None


def _best(run: Path, cks: list[_Ckpt]) -> Optional[str]:
    """The best checkpoint: trainer_state.json's ``best_global_step`` (the newest complete checkpoint's), else
    ``best_model_checkpoint`` by its basename inside RUN (it is the path as the training process saw it)."""
    for c in cks:
        if not c.complete:
            continue
        try:
            fd = os.open(run / c.path / "trainer_state.json", os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            state = json.loads(os.read(fd, 64 << 20))
        except ValueError:
            return None
        finally:
            os.close(fd)
        if not isinstance(state, dict):
            return None
        step = state.get("best_global_step")
        if isinstance(step, int) and not isinstance(step, bool):
            for o in cks:
                if o.step == step:
                    return o.path
        path = state.get("best_model_checkpoint")
        if isinstance(path, str) and path:
            base = re.split(r"[\\/]", path.rstrip("/\\"))[-1]  # as the run view resolves it (core/run_view.py)
            for o in cks:
                if o.path.rsplit("/", 1)[-1] == base:
                    return o.path
        return None
    return None


def _weights_ok(rep: Any, rel: str, broken: set[str]) -> bool:
    """A model file that is whole and not empty (no error finding on it; tensors with elements)."""
    n = rep.inventory.node(rel)
    if n is None or rel in broken or n.is_dir:
        return False
    return bool(n.facts.get("param_count")) and n.size > 0


def _optimizer_entries(run: Path, ck: _Ckpt, rep: Any, broken: set[str]) -> tuple[list[str], str, str]:
    """(the paths below RUN ``--what optimizer`` removes from ``ck``, a note, a refusal): a refusal empties the rest."""
    from .names import MODEL_FILE_RE

    folder = run / ck.path
    me = _entry(run, ck.path)
    if me is not None and me.kind == "file":  # a guard: no run listing gives a checkpoint that is one file today
        name = ck.path.rsplit("/", 1)[-1]
        if name.endswith(".ckpt"):
            return [], "", "a Lightning .ckpt holds model and optimizer in one file"
        return [], "", f"a single file ({name}) holds model and optimizer together: they cannot be split by deleting"
    kids = _children(folder)
    files = {n for n, k in kids.items() if k == "file"}
    dirs = {n for n, k in kids.items() if k == "dir"}
    rel = ck.path
    if ".metadata" in files or any(n.endswith(".distcp") for n in files):
        if ck.path.rsplit("/", 1)[-1].startswith("iter_"):
            return [], "", "a Megatron torch_dist checkpoint holds model and optimizer in the same .distcp files"
        if ck.layout == "lightning-fsdp" or ck.path.endswith(".ckpt"):
            return (
                [],
                "",
                "a Lightning FSDP .ckpt folder is one DCP holding model and optimizer in the same .distcp files",
            )
        return (
            [],
            "",
            (
                'a DCP folder holding model and optimizer together (FSDP2 {"model", "optimizer"}, torchtitan): its '
                "optimizer part cannot go by deleting files"
            ),
        )
    if any(n.endswith(".ckpt") for n in files | dirs):
        return [], "", "a Lightning .ckpt holds model and optimizer in one file"
    if ck.layout in ("torchtitan", "megatron-dist", "megatron-legacy", "composer", "lightning-fsdp"):
        return (
            [],
            "",
            f"a {ck.layout} checkpoint holds model and optimizer together: they cannot be split by deleting files",
        )
    out: list[str] = []
    notes: list[str] = []
    safetensors = [n for n in files if MODEL_FILE_RE.match(n)]
    model_file_ok = any(_weights_ok(rep, f"{rel}/{n}", broken) for n in safetensors)
    tags = [n for n in dirs if n.startswith("global_step")]
    named = _latest_tag(folder)  # a Lightning DeepSpeed .ckpt folder: its tag is `checkpoint/`, named by `latest`
    if named is not None and named in dirs and named not in tags:
        tags.append(named)
    tag_kinds: list[tuple[str, set[str]]] = [(f"{rel}/{t}", set(_children(folder / t))) for t in tags]
    if any(n.endswith("_model_states.pt") or n.endswith("_optim_states.pt") for n in files):
        tag_kinds.append((rel, set(files)))
    tag_weights = False
    for trel, names in tag_kinds:
        optim = sorted(n for n in names if n.endswith("_optim_states.pt"))
        if any(n.startswith("zero_pp_rank_") and n.endswith("_model_states.pt") for n in names):
            return (
                [],
                "",
                (
                    f"`{trel}/` is a ZeRO-3 tag: its *_optim_states.pt hold the only copy of the weights (the "
                    "model_states files hold placeholders)"
                ),
            )
        model_states = [n for n in names if n.startswith("mp_rank_") and n.endswith("_model_states.pt")]
        if not (model_states or model_file_ok):
            if optim:
                return [], "", f"`{trel}/`: nothing but its optimizer states holds the weights"
            continue
        tag_weights = tag_weights or bool(model_states)
        if optim:
            out += [f"{trel}/{n}" for n in optim]
            notes.append(
                f"`{trel}/`'s ZeRO optimizer states go, and with them the fp32 master weights: what stays is the "
                + ("module weights in mp_rank_*_model_states.pt" if model_states else "model.safetensors")
                + " as saved (the training dtype)"
            )
    for a in sorted(dirs):
        if a in ("actor", "critic"):  # verl: optim_* where model_* keeps the weights
            inner = _children(folder / a)
            if any(n.startswith("model_world_size_") for n, k in inner.items() if k == "file"):
                out += [f"{rel}/{a}/{n}" for n, k in sorted(inner.items()) if k == "file" and n.startswith("optim_")]
    fsdp_model = any(n.startswith("pytorch_model_fsdp") for n in dirs)
    hf_weights = model_file_ok or fsdp_model or tag_weights
    hf = [
        n
        for n in sorted(files)
        if n in ("optimizer.pt", "scheduler.pt") or (n.startswith("rng_state") and n.endswith(".pth"))
    ]
    hf += [n for n in sorted(dirs) if n.startswith("optimizer_")]
    if hf:
        if not hf_weights:
            if any(n == "optimizer.pt" or n.startswith("optimizer_") for n in hf):
                return [], "", "no whole weights beside its optimizer state (no complete model file or model folder)"
        else:
            out += [f"{rel}/{n}" for n in hf]
    if not out and any(n.endswith(".pt") for n in files) and not safetensors:
        return [], "", "a single .pt holds model and optimizer together"
    return out, "; ".join(notes), ""


def _latest_tag(folder: Path) -> Optional[str]:
    """The tag a DeepSpeed save folder's own ``latest`` file names (never through a link), or None."""
    try:
        fd = os.open(folder / "latest", os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        text = os.read(fd, 256).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text if text and "/" not in text and text not in (".", "..") else None


def _deepspeed(kids: dict[str, str]) -> bool:
    """Does a checkpoint holding these entries (name -> file / dir) resume through DeepSpeed (a tag in it, or it
    is one; a Lightning DeepSpeed .ckpt folder: its `latest` and zero_to_fp32.py beside its tag)?"""
    return (
        any(n.startswith("global_step") and k == "dir" for n, k in kids.items())
        or any(n.endswith("_model_states.pt") for n in kids)
        or ("latest" in kids and "zero_to_fp32.py" in kids)
    )


def _verl(kids: dict[str, str]) -> bool:
    """A verl ``global_step_N`` folder (its ``actor/`` or ``critic/``)?"""
    return any(n in ("actor", "critic") and k == "dir" for n, k in kids.items())


def cannot_resume(kids: dict[str, str]) -> bool:
    """Does the framework that wrote a checkpoint holding these entries stop on resuming it once its optimizer is
    pruned (the finding is then a warning)?"""
    return _deepspeed(kids) or _verl(kids)


def resumes_text(kids: dict[str, str]) -> str:
    """What resuming a checkpoint holding these entries means once its optimizer is pruned."""
    if _deepspeed(kids):
        return (
            "DeepSpeed cannot resume it (its load_checkpoint needs the optimizer states it no longer has; the HF "
            "Trainer or Lightning under DeepSpeed stops): start a new run from its weights"
        )
    if _verl(kids):
        return (
            "verl resumes it only with `optimizer` left out of the actor's `checkpoint.load_contents` (its "
            "checkpoint manager reads optim_world_size_*.pt otherwise), and then with a fresh optimizer"
        )
    return (
        "the HF Trainer resumes it with a fresh optimizer and the learning-rate schedule restarted from its warm-up "
        "(under DDP too)"
    )


def plan(
    run: Path,
    rep: Any,
    *,
    what: str = "optimizer",
    keep_last: int = 1,
    keep_best: bool = True,
) -> Plan:
    """What ``prune`` would remove from the run folder ``run`` (nothing is written). ``rep``: its inspect report
    (``core.report.inspect(run)``: the completeness of each checkpoint; diagnose reads this module's markers, so
    it cannot call inspect itself)."""
    if what not in WHATS:
        raise PruneError(f"--what is one of {', '.join(WHATS)}")
    run = Path(run)
    if os.path.islink(run):
        raise PruneError(f"{run} is a symbolic link: prune never works through one; name the folder itself")
    if not run.is_dir():
        raise PruneError(f"{run} is not a folder")
    cks = _checkpoints(run, rep)
    broken = _error_paths(rep.findings)
    out = Plan(run, what)
    if not cks:
        raise PruneError(f"{run} holds no checkpoints to prune (checkpoint-N, global_stepN, iter_N, step-N ...)")
    keep: dict[str, list[str]] = {}
    complete = [c for c in cks if c.complete]
    if complete:
        keep.setdefault(complete[0].path, []).append("the newest complete checkpoint")
    for c in complete[: max(keep_last, 0)]:
        keep.setdefault(c.path, []).append(f"among the last {keep_last} complete")
    latest = _latest(run, cks)
    if latest is not None:
        keep.setdefault(latest, []).append("named by `latest`")
    if keep_best:
        best = _best(run, cks)
        if best is not None:
            keep.setdefault(best, []).append("the best checkpoint (trainer_state.json)")
    newest_complete = complete[0].step if complete else None
    for c in cks:
        linked = any(os.path.islink(run / c.path.rsplit("/", i)[0]) for i in range(c.path.count("/") + 1))
        if linked and c.path not in keep:
            out.refused.append((c.path, "a symbolic link: never followed"))
            continue
        marker = None if linked else read_marker(run / c.path)  # never a marker read through a link
        if marker is not None and marker["state"] == "pruning":
            out.checkpoints.append(_finish(run, c, marker))
            continue
        if c.path in keep:
            out.kept.append((c.path, ", ".join(dict.fromkeys(keep[c.path]))))
            continue
        if what == "checkpoint":
            if (run / c.path).is_file():  # a Lightning run's epoch=E-step=N.ckpt: no folder to hold a marker
                out.refused.append(
                    (c.path, "one .ckpt file: prune removes checkpoint folders only (it marks a folder first)")
                )
                continue
            if not c.complete and (newest_complete is None or c.step > newest_complete):
                out.skipped.append(
                    (c.path, "incomplete and newer than the newest complete checkpoint: look at it first")
                )
                continue
            # its marker (an optimizer prune's "pruned") is not an entry: this prune rewrites it, and removes it last
            entries = [e for e in _tree(run, c.path) if not _is_marker(c.path, e.path)]
            order = {f"{c.path}/trainer_state.json": 0}  # what makes it resumable goes first
            entries.sort(key=lambda e: order.get(e.path, 1))
            out.checkpoints.append(CheckpointPlan(c.path, c.step, what, entries, "the whole checkpoint"))
            continue
        if marker is not None:  # already pruned
            out.skipped.append((c.path, f"optimizer already pruned on {_day(marker.get('finished'))}"))
            continue
        if not c.complete:
            out.skipped.append((c.path, "incomplete: `--what checkpoint` removes it whole"))
            continue
        paths, note, refusal = _optimizer_entries(run, c, rep, broken)
        if refusal:
            out.refused.append((c.path, refusal))
            continue
        if not paths:
            out.skipped.append((c.path, "holds no optimizer, scheduler or RNG state"))
            continue
        entries = []
        for p in paths:
            entries += _tree(run, p)
        out.checkpoints.append(
            CheckpointPlan(c.path, c.step, what, entries, note, resumes_text(_children(run / c.path)))
        )
    _count_links(out)
    run_fd = os.open(run, _DIR_FLAGS)
    try:
        for cp in out.checkpoints:
            try:
                cp.tree = _snapshot(run_fd, cp.path)
            except OSError:
                cp.tree = {}  # apply cannot reach it either, and says so
    finally:
        os.close(run_fd)
    return out


def _is_marker(ck: str, rel: str) -> bool:
    """Is ``rel`` (below RUN; below the checkpoint when ``ck`` is "") checkpoint ``ck``'s marker, or its lock or temp
    file?"""
    name = rel[len(ck) + 1 :] if ck else rel
    return name == MARKER or name.startswith(f".{MARKER}")


def _finish(run: Path, c: _Ckpt, marker: dict[str, Any]) -> CheckpointPlan:
    """An interrupted prune's plan: what its marker lists that is still there (each below the checkpoint)."""
    entries: list[Entry] = []
    for p in marker["remove"]:
        if p.startswith("/") or ".." in p.split("/") or not p or _is_marker("", p):
            continue
        entries += _tree(run, f"{c.path}/{p}")
    seen: set[str] = set()
    uniq = [e for e in entries if not (e.path in seen or seen.add(e.path))]  # type: ignore[func-returns-value]
    what = str(marker["what"])
    note = f"finishes the prune interrupted on {_day(marker.get('started'))}"
    return CheckpointPlan(c.path, c.step, what, uniq, note, str(marker.get("resumes", "")), finishing=True)


# ---------------------------------------------------------------------------------------------------- applying


def recent_files(run: Path, seconds: float) -> list[str]:
    """Files below ``run`` (links not followed) modified in the last ``seconds``."""
    now = time.time()
    hits: list[str] = []
    for dirpath, dirs, files in os.walk(run, followlinks=False):
        for n in files + dirs:
            p = os.path.join(dirpath, n)
            try:
                if now - os.lstat(p).st_mtime < seconds:
                    hits.append(os.path.relpath(p, run))
            except OSError:
                pass
    return sorted(hits)


def _after(event: str, path: str) -> None:
    """A point of no return passed (``marker-written``, ``removed``, ``before-marker-final``, ``done``): tests
    replace this to kill the process there."""


OnRemoved = Callable[[int, int, int, int], None]  # (entries done, entries, bytes done, bytes)


def _open_parent(run_fd: int, rel: str) -> tuple[int, str]:
    """An fd of ``rel``'s folder reached from RUN one component at a time (``O_NOFOLLOW``: never through a link),
    and its last name."""
    parts = rel.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise PruneError(f"{rel}: not a path inside the run")
    fd = os.dup(run_fd)
    try:
        for p in parts[:-1]:
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _remove(run_fd: int, e: Entry) -> int:
    """Remove ``e`` if it is still exactly what was planned (PruneError otherwise); the bytes that freed: a file's
    size when it was its last hard link, else 0."""
    try:
        fd, name = _open_parent(run_fd, e.path)
    except OSError as err:
        raise PruneError(
            f"{e.path}: cannot reach it without following a link ({err.strerror}); left as it is"
        ) from None
    try:
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return 0  # gone already (a finished prune's entry)
        kind = "link" if _stat.S_ISLNK(st.st_mode) else "dir" if _stat.S_ISDIR(st.st_mode) else "file"
        same = kind == e.kind and (kind == "dir" or _stamp(st) == e.stamp or e.stamp == (0, 0, 0, 0))
        if not same or (kind == "dir" and (st.st_dev, st.st_ino) != e.stamp[:2] and e.stamp != (0, 0, 0, 0)):
            raise PruneError(f"{e.path} changed since the plan was made; left as it is")
        if kind == "dir":
            os.rmdir(name, dir_fd=fd)
            return 0
        os.unlink(name, dir_fd=fd)
        return st.st_size if kind == "file" and st.st_nlink <= 1 else 0
    finally:
        os.close(fd)


def _write_marker(folder: Path, doc: dict[str, Any]) -> None:
    from .staging import staged_file

    target = folder / MARKER
    if os.path.islink(target):
        raise PruneError(f"{target} is a symbolic link: prune never writes through one")
    with staged_file(target, writer="prune", error=PruneError, need_bytes=1 << 16) as st:
        fd = os.open(st.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, (json.dumps(doc, indent=2) + "\n").encode())
        finally:
            os.close(fd)
        st.install()


@dataclass
class Result:
    removed: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "bytes_freed": self.bytes_freed,
            "failed": [{"path": p, "why": w} for p, w in self.failed],
        }


def require_quiet(run: Path, quiet_for: float) -> None:
    """PruneError where a file below ``run`` was modified in the last ``quiet_for`` seconds (a job may still be
    writing it): asked before the plan is said to run, and again by :func:`apply`."""
    recent = recent_files(run, quiet_for)
    if recent:
        shown = ", ".join(recent[:3]) + (" …" if len(recent) > 3 else "")
        raise PruneError(
            f"{len(recent)} file(s) in {run} were modified in the last {quiet_for:g} s ({shown}): a job may still "
            "be writing the run. Nothing was removed; wait, or pass --force"
        )


class PruneCancelled(Cancelled):
    """:func:`apply` stopped by its cancel token between two removals. ``result``: what went; ``marked``: the
    checkpoint left marked ``pruning`` (its marker lists what is left; inspect reports it, the next prune finishes
    it), or None when every checkpoint is untouched or finished."""

    def __init__(self, result: Result, marked: Optional[str]) -> None:
        super().__init__("cancelled")
        self.result = result
        self.marked = marked


def apply(
    p: Plan,
    *,
    quiet_for: float = 60.0,
    force: bool = False,
    on_removed: Optional[OnRemoved] = None,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[threading.Event] = None,
) -> Result:
    """Remove exactly the plan ``p`` (see the module's docstring for the order and the checks). ``on_progress``:
    the bytes freed of the plan's, after each removal; ``cancel``: checked before each checkpoint and between two
    removals: :class:`PruneCancelled` then says what went and which checkpoint is left marked."""
    from .staging import OutLock

    run = Path(p.run)
    if not force:
        require_quiet(run, quiet_for)
    lock = OutLock(run)
    lock.acquire("prune", PruneError)
    res = Result()
    total = sum(len(c.entries) for c in p.checkpoints)
    total_bytes = p.bytes
    done = [0]

    def removed(e: Entry, freed: int) -> None:
        res.removed.append(e.path)
        res.bytes_freed += freed
        done[0] += 1
        _after("removed", e.path)
        if on_removed is not None:
            on_removed(done[0], total, res.bytes_freed, total_bytes)
        report(on_progress, res.bytes_freed, total_bytes, "bytes", f"{done[0]}/{total} paths")

    report(on_progress, 0, total_bytes, "bytes", f"0/{total} paths")
    run_fd = os.open(run, _DIR_FLAGS)
    try:
        for c in p.checkpoints:
            if cancel is not None and cancel.is_set():
                raise PruneCancelled(res, None)  # between two checkpoints: each untouched or finished
            _apply_one(run, run_fd, c, res, removed, cancel)
    finally:
        os.close(run_fd)
        lock.release()
    return res


def _apply_one(
    run: Path,
    run_fd: int,
    c: CheckpointPlan,
    res: Result,
    removed: Callable[[Entry, int], None],
    cancel: Optional[threading.Event],
) -> None:
    """Prune checkpoint folder ``c``: its marker, the check that nothing changed since the plan, its removals, then
    its marker's last step (a failure is recorded in ``res``; a cancel raises :class:`PruneCancelled`)."""
    folder = run / c.path
    inner = [e.path[len(c.path) + 1 :] for e in c.entries if e.path != c.path]
    try:
        fd, _name = _open_parent(run_fd, f"{c.path}/{MARKER}")  # its folder, reached without a link
        os.close(fd)
    except OSError as err:
        res.failed.append((c.path, f"cannot reach it without following a link ({err.strerror}); left as it is"))
        return
    old = read_marker(folder)
    resuming = old is not None and old.get("state") == "pruning"  # an interrupted prune's: finished, not undone
    doc: dict[str, Any] = {
        "ckpt_tui_prune": MARKER_VERSION,
        "state": "pruning",
        "what": c.what,
        "started": (old.get("started") if resuming and old is not None else None) or _now(),
        "finished": None,
        "pid": os.getpid(),
        "remove": sorted(set(inner) | set(old["remove"] if resuming and old is not None else [])),
        "bytes": c.bytes,
        "resumes": c.resumes,
    }
    here = 0  # removed from this checkpoint
    try:
        if not resuming:
            _write_marker(folder, doc)
            _after("marker-written", c.path)
        # a writer may have changed the checkpoint after the plan (or the quiet check) and before its marker:
        # compare it with the plan's snapshot now that the marker is there, before the first removal
        changed = _changes(run_fd, c)
        if changed:
            if not resuming:
                _undo_marker(run_fd, folder, c.path, old)
            res.failed.append((c.path, f"changed since the plan was made ({changed}): nothing of it was removed"))
            return
        for e in c.entries:
            if e.path == c.path:
                continue  # the folder itself: after its marker
            if cancel is not None and cancel.is_set():
                if here == 0 and not resuming:
                    _undo_marker(run_fd, folder, c.path, old)  # nothing went: as it was
                    raise PruneCancelled(res, None)
                raise PruneCancelled(res, c.path)  # its marker says "pruning" and lists what is left
            freed = _remove(run_fd, e)
            here += 1
            removed(e, freed)
    except (PruneError, OSError) as err:
        res.failed.append((c.path, str(err)))
        return  # its marker stays "pruning": inspect reports it, the next prune finishes it
    _after("before-marker-final", c.path)
    if c.what == "checkpoint":
        _unlink_marker(run_fd, c.path)
        try:
            _remove(run_fd, Entry(c.path, 0, "dir"))
            res.removed.append(c.path)
        except OSError as err:
            res.failed.append((c.path, f"emptied but not removed: {err.strerror}"))
    else:
        _write_marker(folder, {**doc, "state": "pruned", "finished": _now(), "pid": None})
    _after("done", c.path)


def _unlink_marker(run_fd: int, rel: str) -> None:
    """Remove checkpoint ``rel``'s marker and what a killed write of it left (its lock, its temp file)."""
    fd, name = _open_parent(run_fd, f"{rel}/{MARKER}")
    try:
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        for leftover in os.listdir(fd):
            if leftover.startswith(f".{MARKER}"):
                os.unlink(leftover, dir_fd=fd)
    finally:
        os.close(fd)


def _undo_marker(run_fd: int, folder: Path, rel: str, old: Optional[dict[str, Any]]) -> None:
    """Put checkpoint ``rel``'s marker back as it was before this prune wrote it (none, or ``pruned``)."""
    if old is None:
        _unlink_marker(run_fd, rel)
    else:
        _write_marker(folder, old)


# ------------------------------------------------------------------------------------------ what inspect says


def marker_findings(inv: Any, findings: list[Any]) -> list[Any]:
    """``findings`` with what a prune marker says: ``prune-interrupted`` (error) where it says ``pruning``;
    ``optimizer-pruned`` where it says ``pruned`` -- and then not the ``shard-missing`` of the files it removed."""
    from .storage import is_url
    from .types import Finding

    if is_url(inv.given):
        return findings
    marks: dict[str, dict[str, Any]] = {}
    for n in inv.nodes():
        if n.is_dir and n.child(MARKER) is not None:
            m = read_marker(Path(n.abspath))
            if m is not None:
                marks[n.path] = m
    if not marks:
        return findings
    out = []
    for f in findings:
        under = next((p for p in marks if p == "." or f.path == p or f.path.startswith(p + "/")), None)
        if under is not None and f.code in ("shard-missing", "checkpoint-incomplete"):
            m = marks[under]
            if m["state"] == "pruned" and (f.code == "shard-missing" and "optim_states" in f.message):
                continue
            if m["state"] == "pruning":
                continue  # prune-interrupted says it
        out.append(f)
    given = inv.given or str(inv.root.abspath)
    for path, m in sorted(marks.items()):
        from .types import user_path

        me = inv.shown(path)
        folder = user_path(given, path) if path != "." else given.rstrip("/")
        run = shlex.quote(os.path.dirname(folder.rstrip("/")) or ".")
        if m["state"] == "pruning":
            what = "optimizer state" if m["what"] == "optimizer" else "checkpoint"
            out.append(
                Finding(
                    "prune-interrupted",
                    "error",
                    path,
                    f"`{me}/` is half pruned: a `ckpt-tui prune` removing its {what} (started "
                    f"{_day(m.get('started'))}) stopped before it finished, so it is neither what was saved nor a "
                    f"finished prune. Do not resume or export it as complete. `ckpt-tui prune {run}` shows what is "
                    "left of that prune; with --yes it finishes it.",
                    command=f"ckpt-tui prune {run}",
                )
            )
        else:
            kids = {c.name: "dir" if c.is_dir else "file" for c in cast("Node", inv.node(path) or inv.root).children}
            resumes = resumes_text(kids)
            out.append(
                Finding(
                    "optimizer-pruned",
                    "warning" if cannot_resume(kids) else "info",
                    path,
                    f"`{me}/` holds the model only: its optimizer was pruned on {_day(m.get('finished'))} "
                    f"({len(m['remove'])} path(s) removed). {resumes[0].upper()}{resumes[1:]}.",
                )
            )
    return out
