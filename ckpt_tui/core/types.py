"""Plain data the rest of ckpt-tui passes around: nodes of a scanned tree, findings, plans."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TypedDict, TypeVar

from .facts import Facts, NodeFacts
from .jsondoc import JsonFields, jsonable
from .storage import URL_RE, Location

SCHEMA_VERSION = 1

SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
MODEL_ROLES = ("model", "model+optimizer")  # roles of nodes that hold model weights

T = TypeVar("T")


def numel(shape: Iterable[int]) -> int:
    """Number of elements of a tensor of this shape (1 for a scalar)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclass(frozen=True)
class TensorInfo(JsonFields):
    """One tensor as the headers describe it; no data."""

    json_keys = ("name", "shape", "dtype", "bytes=nbytes", "upcast_from")

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    nbytes: int
    # the dtype it is stored in when ``dtype`` (what an export writes with --dtype keep) is wider: a frozen
    # parameter of a bf16 DeepSpeed run has no fp32 master, its bf16 values are written upcast
    upcast_from: Optional[str] = None

    @property
    def numel(self) -> int:
        return numel(self.shape)


@dataclass
class Node(JsonFields):
    """A file or folder of a scanned checkpoint."""

    json_keys = ("path", "kind", "format", "role", "framework", "size", "facts")

    path: str  # relative to the scanned root, POSIX style; "." for the root
    abspath: Location  # a local Path, or a storage.RemotePath for a scan of object storage
    is_dir: bool
    format: str = "unknown"
    role: str = "unknown"
    framework: Optional[str] = None
    size: int = 0  # bytes (files: st_size; folders: sum of what is below)
    facts: Facts = field(default_factory=NodeFacts)  # declared per format in facts.py
    children: list["Node"] = field(default_factory=list)

    @property
    def name(self) -> str:
        # kept: asked tens of thousands of times by a scan of a run folder, and a Path works it out anew each time
        n = self.__dict__.get("_name")
        if n is None:
            n = self.__dict__["_name"] = self.abspath.name
        return n

    @property
    def kind(self) -> str:
        return "dir" if self.is_dir else "file"

    def to_json(self) -> dict[str, Any]:
        """``as_json`` of ``json_keys``, written out: one per file and folder of the tree (every field but the
        facts is already a JSON value)."""
        return {
            "path": self.path,
            "kind": "dir" if self.is_dir else "file",
            "format": self.format,
            "role": self.role,
            "framework": self.framework,
            "size": self.size,
            "facts": jsonable(self.facts),
        }

    def child(self, name: str) -> Optional["Node"]:
        idx = self.__dict__.get("_index")
        if idx is None or len(idx) != len(self.children):
            idx = {c.abspath.name: c for c in self.children}
            self.__dict__["_index"] = idx
        return idx.get(name)

    def find(self, rel: str) -> Optional["Node"]:
        """The node at ``rel`` (a path relative to the scanned root) in this subtree, by name lookups."""
        if rel == self.path:
            return self
        prefix = "" if self.path == "." else self.path + "/"
        if not rel.startswith(prefix):
            return None
        node: Optional[Node] = self
        for part in rel[len(prefix) :].split("/"):
            assert node is not None  # the loop returns when a lookup finds nothing
            node = node.child(part)
            if node is None:
                return None
        return node

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()

    def contains(self, rel: str) -> bool:
        """Is the node at ``rel`` (a path relative to the scanned root) this node or below it?"""
        return self.path == "." or rel == self.path or rel.startswith(self.path + "/")


@dataclass(frozen=True)
class Finding(JsonFields):
    code: str
    severity: str  # error | warning | info
    path: str  # relative node path
    message: str
    fix: Optional[str] = None
    command: Optional[str] = None  # the exact `ckpt-tui ...` line to run for it, from the user's folder

    def to_json(self) -> dict[str, Optional[str]]:
        """``as_json`` of every field, written out (one per finding; each is a string or None)."""
        return {
            "code": self.code,
            "severity": self.severity,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
            "command": self.command,
        }


def user_path(given: str, rel: str = ".") -> str:
    """Node ``rel`` (relative to a scanned root) as the user can type it: below ``given``, the root
    as they named it -- relative to their current folder if they gave a relative path, absolute if
    they gave an absolute one. Not quoted (see :func:`shell_path`)."""
    if URL_RE.match(given):  # object storage: keys joined with "/", the URL kept as typed
        return given.rstrip("/") if rel in (".", "") else given.rstrip("/") + "/" + rel
    p = given if rel in (".", "") else os.path.join(given, rel)
    return os.path.normpath(p)


def in_user_form(given: str, p: object) -> str:
    """A path ckpt-tui names or creates (an output folder, a file of the source) in the form the user chose
    for ``given``: relative to their current folder if they typed a relative path, else absolute. Not quoted."""
    local = str(p)  # a local path's str is its os.fspath
    if URL_RE.match(local):
        return local
    if given and (URL_RE.match(given) or not os.path.isabs(given)):  # a local folder for a remote source: relative
        try:
            return os.path.relpath(local)
        except ValueError:  # another drive (Windows): only the absolute form exists
            pass
    return str(Path(local).absolute())


def shell_path(given: str, rel: str = ".") -> str:
    """:func:`user_path`, quoted for a shell command line (``shlex.quote``: spaces, quotes)."""
    return shlex.quote(user_path(given, rel))


def model_component(components: dict[str, str]) -> Optional[str]:
    """The path of the model weights among a layout's components (role -> path), if any."""
    return components.get("model") or components.get("model+optimizer")


class Parsed:
    """Parsed headers of a scan, typed and keyed by node path (a DCP folder's ``DcpInfo``, a
    DeepSpeed tag's ``TagFacts``): what a tensor listing reuses instead of reading them again."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, type], Any] = {}

    def put(self, node: Node, value: Any) -> None:
        self._by[(node.path, type(value))] = value

    def get(self, node: Node, kind: type[T]) -> Optional[T]:
        return self._by.get((node.path, kind))


class RunCheckpoint(TypedDict):
    """One of a run folder's checkpoints (``Inventory.checkpoints``; the JSON document's ``checkpoints``)."""

    path: str  # relative to the scanned root
    step: int  # the training step its name carries
    layout: str  # its own layout
    complete: bool  # no error finding inside it (diagnose clears it)


# a checkpoint's bytes by what its files hold (``model+optimizer``: files holding both, a Lightning .ckpt, a combined DCP)
RunCheckpointSizes = TypedDict(
    "RunCheckpointSizes", {"model": int, "optimizer": int, "model+optimizer": int, "other": int, "total": int}
)


class RunCheckpointView(TypedDict):
    """What the run view (core/run_view.py) adds to a ``checkpoints[]`` entry, under schema_version 1."""

    written: Optional[float]  # mtime (seconds since the epoch) of its trainer_state.json, else of the checkpoint
    problems: list[str]  # the codes of the error findings inside it ([] when complete)
    holds: list[str]  # of "model", "optimizer", "scheduler", "rng"
    sizes: RunCheckpointSizes
    loss: Optional[float]  # train loss logged last at or before its step (null: not recorded, or not finite)
    eval_metric: Optional[float]  # the run view's eval metric (the document's ``run.eval_metric``), likewise
    newest_complete: bool
    best: bool


class RunSummaryDoc(TypedDict):
    """The JSON document's ``run`` (a run folder): its totals and where its metrics come from."""

    total_bytes: int
    optimizer_bytes: int  # files holding optimizer state only, over every checkpoint
    eval_metric: Optional[str]  # the log_history key of the eval metric (``eval_loss``), null if none
    higher_is_better: bool
    best_source: Optional[str]  # "best_global_step" | "best_model_checkpoint" | "metric" (--best-metric) | null
    history_from: Optional[str]  # the trainer_state.json the metrics were read from (relative path), or null
    no_history: Optional[str]  # why there are no metrics, or null


class RunCheckpointDoc(RunCheckpoint, RunCheckpointView):
    """A ``checkpoints[]`` entry of the JSON document: the checkpoint, its own components (role -> path
    relative to the scanned root) and its run-view fields (all added under schema_version 1). The one definition
    of that entry's shape."""

    components: dict[str, str]


def run_checkpoint_doc(c: RunCheckpoint, components: dict[str, str], view: RunCheckpointView) -> RunCheckpointDoc:
    return RunCheckpointDoc(
        path=c["path"],
        step=c["step"],
        layout=c["layout"],
        complete=c["complete"],
        components=dict(components),
        **view,
    )


class FormatAnswers(Protocol):
    """What an Inventory asks a node's format (``formats/format.py`` declares these; the registry answers)."""

    tag: bool
    universal: bool
    exportable: bool
    shard_index: Optional[str]


def _no_formats(node: "Node") -> FormatAnswers:
    raise RuntimeError("an Inventory made without the format registry (layout.describe gives it one)")


@dataclass
class Inventory:
    root: Node
    layout: str
    summary: str
    framework: Optional[str] = None
    components: dict[str, str] = field(default_factory=dict)  # role -> relative path
    checkpoints: list[RunCheckpoint] = field(default_factory=list)  # run folders: newest first
    trust_pickles: bool = False
    # each of ``checkpoints``' own components (role -> relative path): the JSON document's checkpoints[].components
    checkpoint_components: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    parsed: Parsed = field(default_factory=Parsed, repr=False, compare=False)
    # the scanned path as the user gave it (relative to their folder, or absolute): what messages show
    given: str = field(default="", repr=False, compare=False)
    # the format registry's format_of: what the questions below ask (types.py sits below the formats)
    format_of: Callable[["Node"], FormatAnswers] = field(default=_no_formats, repr=False, compare=False)
    # the model component's LoRA adapter (adapters.found.AdapterInfo), found after the scan; None: not one
    adapter: Any = field(default=None, repr=False, compare=False)

    @property
    def path(self) -> Location:
        return self.root.abspath

    def user_form(self, p: object) -> str:
        """A path ckpt-tui will create (an output folder) in the user's form: relative to their current
        folder when they named the checkpoint by a relative path, else absolute. Not quoted."""
        return in_user_form(self.given, p)

    def shown(self, rel: str = ".", *, slash: bool = False) -> str:
        """Node ``rel`` as the user can paste it into a shell from where they ran ckpt-tui
        (:func:`shell_path`); ``slash`` adds a trailing ``/`` (a folder, in prose)."""
        s = shell_path(self.given or str(self.root.abspath), rel)
        return s + "/" if slash and not s.endswith("/") else s

    def nodes(self) -> Iterator[Node]:
        return self.root.walk()

    def node(self, rel: str) -> Optional[Node]:
        return self.root.find(rel)

    def model_path(self, checkpoint: Optional[str] = None) -> Optional[str]:
        """Where the model weights are: of the whole inventory, or of one of its ``checkpoints``."""
        return model_component(
            self.components if checkpoint is None else self.checkpoint_components.get(checkpoint, {})
        )

    def model_node(self, checkpoint: Optional[str] = None) -> Optional[Node]:
        rel = self.model_path(checkpoint)
        return self.node(rel) if rel else None

    def deepspeed_tags(self, folder: Optional[Node] = None, *, universal: bool = False) -> list[Node]:
        """DeepSpeed ZeRO tag folders (``universal``: universal checkpoints) directly in ``folder``,
        or anywhere in the tree."""
        nodes = folder.children if folder is not None else self.nodes()
        answer = self.format_of
        return [n for n in nodes if n.is_dir and (answer(n).universal if universal else answer(n).tag)]

    def export_candidates(self) -> list[tuple[str, str]]:
        """(relative path, description) of what an export could read -- model weights only, never an
        optimizer component: the model component first, then each checkpoint's of a run folder (newest first, the
        complete ones before any incomplete one: what the first offers is what ``export RUN`` takes), then any other
        weights not inside those; at most 30. The TUI's export wizard offers these, the first chosen."""
        out: list[tuple[str, str]] = []
        first = self.model_path()
        if self.layout == "run-folder" and self.checkpoints:
            for ck in sorted(self.checkpoints, key=lambda c: not c["complete"]):  # stable: newest first in each
                rel = self.model_path(ck["path"])
                if rel:
                    out.append((rel, f"step {ck['step']}" + (" (complete)" if ck["complete"] else " (INCOMPLETE)")))
        if first and first not in [o[0] for o in out]:
            out.insert(0, (first, "the model component"))
        for n in self.nodes():
            fmt = self.format_of(n)
            if n.role in MODEL_ROLES and fmt.exportable and n.path not in [o[0] for o in out]:
                if fmt.shard_index and n.abspath.parent.joinpath(fmt.shard_index).exists():
                    continue  # a shard of the index beside it: the index is the candidate
                # a file inside a candidate folder is part of it (a universal checkpoint's zero/<param>/fp32.pt)
                folders = [self.node(o[0]) for o in out]
                if any(f is not None and f.is_dir and f is not n and f.contains(n.path) for f in folders):
                    continue
                out.append((n.path, n.format))
        return out[:30]


@dataclass(frozen=True)
class PlanStep(JsonFields):
    op: str  # "write" | "copy" | "mkdir" | "backup" | "replace" | "run" | "delete"
    target: str
    source: Optional[str] = None
    bytes: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Plan(JsonFields):
    """What a writing operation will do, printable before it runs (``--dry-run``)."""

    json_keys = ("title", "steps", "notes", "total_bytes")

    title: str
    steps: tuple[PlanStep, ...]
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.steps)

    def describe(self) -> str:
        from .units import naturalsize

        lines = [self.title]
        for s in self.steps:
            src = f" <- {s.source}" if s.source else ""
            size = f" ({naturalsize(s.bytes)})" if s.bytes else ""
            det = f"  {s.detail}" if s.detail else ""
            lines.append(f"  {s.op:8s} {s.target}{src}{size}{det}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)
