"""Plain data the rest of ckpt-tui passes around: nodes of a scanned tree, findings, plans."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .jsondoc import JsonFields

SCHEMA_VERSION = 1

SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def numel(shape) -> int:
    """Number of elements of a tensor of this shape (1 for a scalar)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclass(frozen=True)
class TensorInfo(JsonFields):
    """One tensor as the headers describe it; no data."""

    json_keys = ("name", "shape", "dtype", "bytes=nbytes")

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    nbytes: int

    @property
    def numel(self) -> int:
        return numel(self.shape)


@dataclass
class Node(JsonFields):
    """A file or folder of a scanned checkpoint."""

    json_keys = ("path", "kind", "format", "role", "framework", "size", "facts")

    path: str  # relative to the scanned root, POSIX style; "." for the root
    abspath: Path
    is_dir: bool
    format: str = "unknown"
    role: str = "unknown"
    framework: Optional[str] = None
    size: int = 0  # bytes (files: st_size; folders: sum of what is below)
    facts: dict[str, Any] = field(default_factory=dict)
    children: list["Node"] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.abspath.name

    @property
    def kind(self) -> str:
        return "dir" if self.is_dir else "file"

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
        node = self
        for part in rel[len(prefix):].split("/"):
            node = node.child(part)
            if node is None:
                return None
        return node

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()



@dataclass(frozen=True)
class Finding(JsonFields):
    code: str
    severity: str  # error | warning | info
    path: str  # relative node path
    message: str
    fix: Optional[str] = None


@dataclass
class Inventory:
    root: Node
    layout: str
    summary: str
    framework: Optional[str] = None
    components: dict[str, str] = field(default_factory=dict)  # role -> relative path
    checkpoints: list[dict] = field(default_factory=list)  # run folders: newest first
    trust_pickles: bool = False

    @property
    def path(self) -> Path:
        return self.root.abspath

    def nodes(self):
        return self.root.walk()

    def node(self, rel: str) -> Optional[Node]:
        return self.root.find(rel)


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
        from .humanize_bytes import naturalsize

        lines = [self.title]
        for s in self.steps:
            src = f" <- {s.source}" if s.source else ""
            size = f" ({naturalsize(s.bytes)})" if s.bytes else ""
            det = f"  {s.detail}" if s.detail else ""
            lines.append(f"  {s.op:8s} {s.target}{src}{size}{det}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)
