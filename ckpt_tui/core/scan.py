"""path -> Inventory: the walk over the tree and the dispatch of each file and folder to its format.

Two passes over the tree. ``walk`` lists files and folders (names and sizes only) and
reports each node as it is found, so a viewer can draw a huge tree at once; ``analyze``
then reads headers and metadata (never tensor data), post-order, each file and folder by the
format ``formats/registry.py`` names for it, and reports each node again when its facts are in.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union, cast

from .facts import LeftoverFacts, NodeFacts, SpecialFacts
from .formats import FormatError
from .formats.format import Format
from .formats.registry import classify_file, detect_folder, format_of
from .formats.unpickle import gc_paused
from .layout import describe
from .leftovers import recognise, tree_size
from .progress import Cancelled, CancelToken, OnProgress, check_cancel, progress_scope, report
from .storage import LocationLike, RemotePath, StorageError, check, explain, is_url
from .types import Inventory, Node, Parsed

MAX_DEPTH = 24
MAX_ENTRIES = 1_000_000


class ScanError(Exception):
    """The path itself cannot be scanned (missing, unreadable): exit code 2."""


@dataclass(frozen=True)
class ScanEvent:
    kind: str  # "found" | "analyzed"
    node: Node


OnNode = Callable[[ScanEvent], None]
StrPath = Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------- walk


def walk(given: LocationLike, on_node: Optional[OnNode] = None, cancel: Optional[CancelToken] = None) -> Node:
    if is_url(given):
        return _walk_remote(RemotePath(str(given)), on_node, cancel)
    path = Path(cast(StrPath, given))  # not a URL: a local path
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ScanError(f"{path}: no such file or folder") from None
    except PermissionError:
        raise ScanError(f"{path}: permission denied") from None
    except OSError as e:
        raise ScanError(f"{path}: cannot be read ({e.strerror or e})") from None
    root = Node(".", path.resolve() if path.is_dir() else path.absolute(), stat.S_ISDIR(st.st_mode))
    if not root.is_dir and not stat.S_ISREG(st.st_mode):
        raise ScanError(f"{path}: not a regular file or folder (a FIFO, socket or device) — not a checkpoint")
    if not root.is_dir:
        root.size = st.st_size
        _emit(on_node, "found", root)
        return root
    if not os.access(path, os.R_OK | os.X_OK):
        raise ScanError(f"{path}: permission denied (cannot list the folder)")
    seen = {(st.st_dev, st.st_ino)}  # folders entered (loops) and hard-linked files counted (sizes)
    counter = [0]
    with gc_paused():  # names and sizes only, no cycles: a collection per 700 nodes would walk the tree again
        _walk_dir(root, 0, seen, counter, on_node, cancel)
    return root


def _walk_remote(path: RemotePath, on_node: Optional[OnNode], cancel: Optional[CancelToken]) -> Node:
    """The same tree from object storage: one recursive listing of the prefix, then the walk over it."""
    try:
        check(str(path))
        st = path.stat()
    except StorageError as e:
        raise ScanError(str(e)) from None
    except Exception as e:  # no credentials, access denied, no bucket, endpoint unreachable: one line
        raise ScanError(explain(str(path), e)) from None
    root = Node(".", path, st.is_dir)
    if not root.is_dir:
        root.size = st.st_size
        _emit(on_node, "found", root)
        return root
    counter = [0]

    def visit(node: Node, depth: int) -> None:
        _emit(on_node, "found", node)
        check_cancel(cancel)
        if depth >= MAX_DEPTH:
            _error(node, f"nested more than {MAX_DEPTH} levels deep; not descended", "too-deep")
            return
        total = 0
        folder = cast(RemotePath, node.abspath)  # the remote walk: every node's abspath is a RemotePath
        for child_path in sorted(folder.iterdir(), key=lambda p: p.name):
            counter[0] += 1
            if counter[0] > MAX_ENTRIES:
                _error(node, f"more than {MAX_ENTRIES} entries; the rest were not scanned", "too-many")
                break
            rel = child_path.name if node.path == "." else f"{node.path}/{child_path.name}"
            cst = child_path.stat()
            if cst.is_dir:
                child = Node(rel, child_path, True, format="dir")
                node.children.append(child)
                visit(child, depth + 1)
                total += child.size
            else:
                child = Node(rel, child_path, False, size=cst.st_size)
                node.children.append(child)
                total += cst.st_size
                _emit(on_node, "found", child)
        node.size = total

    visit(root, 0)
    return root


def _emit(on_node: Optional[OnNode], kind: str, node: Node) -> None:
    if on_node is not None:
        on_node(ScanEvent(kind, node))


def _error(node: Node, error: str, kind: str) -> None:
    """Record why ``node`` cannot be read: ``error`` (in words) and ``error_kind``."""
    node.facts.update(NodeFacts(error=error, error_kind=kind))


def _walk_dir(
    node: Node,
    depth: int,
    seen: set[tuple[int, int]],
    counter: list[int],
    on_node: Optional[OnNode],
    cancel: Optional[CancelToken],
) -> None:
    _emit(on_node, "found", node)
    check_cancel(cancel)
    if depth >= MAX_DEPTH:
        _error(node, f"nested more than {MAX_DEPTH} levels deep; not descended", "too-deep")
        return
    folder = cast(Path, node.abspath)  # the local walk: every node's abspath is a Path
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except PermissionError:
        _error(node, "permission denied: the folder cannot be listed", "permission")
        return
    except OSError as e:
        _error(node, f"cannot list: {e.strerror or e}", "unreadable")
        return
    total = 0
    for entry in entries:
        counter[0] += 1
        if counter[0] > MAX_ENTRIES:
            _error(node, f"more than {MAX_ENTRIES} entries; the rest were not scanned", "too-many")
            break
        name = entry.name
        rel = name if node.path == "." else f"{node.path}/{name}"
        child_path = folder / name  # == Path(entry.path), without parsing the whole path again per entry
        try:
            lst = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        is_link = stat.S_ISLNK(lst.st_mode)
        try:
            st = entry.stat(follow_symlinks=True) if is_link else lst
        except OSError:
            child = Node(rel, child_path, False, format="special", role="unknown")
            child.facts.update(NodeFacts(symlink=True, error="broken symbolic link", error_kind="broken-link"))
            node.children.append(child)
            _emit(on_node, "found", child)
            continue
        left = None if is_link else recognise(folder, name, stat.S_ISDIR(st.st_mode))
        if left is not None:  # a killed run's temp or staging: one node, never descended (its partial files)
            child = Node(rel, child_path, stat.S_ISDIR(st.st_mode), format="leftover", role="unknown")
            if child.is_dir:
                child.size, left["leftover_files"] = tree_size(child_path)
            else:
                child.size = st.st_size
            cast(LeftoverFacts, child.facts).update(left)
            node.children.append(child)
            total += child.size
            _emit(on_node, "found", child)
            continue
        if stat.S_ISDIR(st.st_mode):
            child = Node(rel, child_path, True, format="dir")
            if is_link:
                child.facts["symlink"] = True
            key = (st.st_dev, st.st_ino)
            node.children.append(child)
            if key in seen:
                _error(child, "symbolic link loop: this folder was already scanned", "loop")
                _emit(on_node, "found", child)
                continue
            seen.add(key)
            _walk_dir(child, depth + 1, seen, counter, on_node, cancel)
            total += child.size
        elif stat.S_ISREG(st.st_mode):
            child = Node(rel, child_path, False, size=st.st_size)
            if is_link:
                child.facts["symlink"] = True
            node.children.append(child)
            if st.st_nlink > 1 or is_link:
                # one file under several names (a repair's backup while it is a hard link of its target, a
                # symbolic link to a file here): its bytes are on disk once, so the folder sums count them once
                if st.st_nlink > 1:
                    child.facts["hard_links"] = st.st_nlink
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    _emit(on_node, "found", child)
                    continue
                seen.add(key)
            total += st.st_size
            _emit(on_node, "found", child)
        else:
            child = Node(rel, child_path, False, format="special", role="unknown")
            cast(SpecialFacts, child.facts)["special"] = "fifo" if stat.S_ISFIFO(st.st_mode) else "device or socket"
            node.children.append(child)
            _emit(on_node, "found", child)
    node.size = total


# ---------------------------------------------------------------- analysis


def _analyze_file(node: Node, fmt: Optional[Format], parsed: Parsed) -> None:
    if format_of(node).from_walk:
        return
    if node.role == "unknown" and fmt is None:  # no format named it
        return
    local = node.abspath
    if not isinstance(local, RemotePath) and not os.access(cast(Path, local), os.R_OK):  # a Path, or remote
        _error(node, "permission denied: the file cannot be read", "permission")
        return
    if fmt is None:
        return
    try:
        fmt.analyze(node, parsed)
    except FormatError as e:
        _error(node, str(e), e.kind)
    except PermissionError:
        _error(node, "permission denied: the file cannot be read", "permission")
    except OSError as e:
        _error(node, f"cannot read: {e.strerror or e}", "unreadable")
    except (RecursionError, MemoryError):
        _error(node, "structure too deep or too large to read safely", "corrupt")
    except Exception as e:  # a value of the wrong type somewhere in a damaged file: a finding, never a crash
        _error(node, f"malformed content ({type(e).__name__}: {e})", "corrupt")


def _analyze_dir(node: Node, parsed: Parsed) -> None:
    if format_of(node).from_walk:
        return
    if "error_kind" in node.facts and node.facts.get("error_kind") not in ("too-many",):
        return
    try:
        fmt = detect_folder(node)
        if fmt is not None:
            fmt.analyze(node, parsed)
    except Cancelled:
        raise
    except (RecursionError, MemoryError):
        _error(node, "metadata too deep or too large to read safely", "corrupt")
    except Exception as e:  # malformed metadata (wrong types, missing fields): a finding
        _error(node, f"malformed metadata ({type(e).__name__}: {e})", "corrupt")


# ---------------------------------------------------------------- inventory


def scan(
    path: LocationLike,
    *,
    on_node: Optional[OnNode] = None,
    on_progress: Optional[OnProgress] = None,
    cancel: Optional[CancelToken] = None,
    trust_pickles: bool = False,
) -> Inventory:
    """Scan ``path`` (a folder or a single file). Raises ScanError if the path itself is unusable."""
    local = "" if is_url(path) else cast(StrPath, path)  # not a URL: a local path
    root = walk(path if is_url(path) else Path(local), on_node, cancel)
    nodes = list(root.walk())
    total_files = sum(1 for n in nodes if not n.is_dir)
    parsed = Parsed()
    file_format: dict[str, Optional[Format]] = {}
    for n in nodes:
        if not n.is_dir and not format_of(n).from_walk:
            file_format[n.path] = classify_file(n)
    done = [0]

    def visit(n: Node) -> None:
        check_cancel(cancel)
        if n.is_dir:
            for c in n.children:
                visit(c)
            _analyze_dir(n, parsed)
        else:
            if "error" not in n.facts:
                _analyze_file(n, file_format.get(n.path), parsed)
            done[0] += 1
            report(on_progress, done[0], total_files, "files", n.path)
        _emit(on_node, "analyzed", n)

    with progress_scope(on_progress, cancel):  # a long read inside a folder's analysis reports and cancels too
        visit(root)
    inv = describe(root, trust_pickles, parsed)
    inv.given = str(path) if is_url(path) else os.fspath(local)
    return inv
