"""The repairs themselves: build a Repair (with its dry-run Plan) per fixable finding, and run it."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Optional, cast

from ..formats import FormatError
from ..formats.registry import format_of
from ..fsutil import stamp
from ..names import step_of
from ..progress import CancelToken, OnProgress, report
from ..storage import Location
from ..types import MODEL_ROLES, Finding, Inventory, Node, Plan, PlanStep, user_path
from .atomic import RepairError, backup_path, link_on_path, link_refusal, replace_file
from .pickle_edit import EditError, add_top_level_key, pickle_entry, read_entries, read_pickle, rewrite_zip
from .run import Repair

if TYPE_CHECKING:
    from ..report import Report

# deepspeed.checkpoint.constants UNIVERSAL_CHECKPOINT_INFO / _VERSION_KEY / _VERSION_VALUE (0.19.8; the
# tests check they still match; not imported here: importing deepspeed takes seconds and logs)
UCI_KEY = "universal_checkpoint_info"
UCI_VALUE = {"universal_checkpoint_version": 0.4}

NEXT_TIME = (
    "Next time DeepSpeed writes it itself: it saves `universal_checkpoint_info` when the module it wraps has that "
    "attribute at save time (DeepSpeedEngine._save_checkpoint reads getattr(engine.module, "
    "'universal_checkpoint_info')). HF Trainer: `model.universal_checkpoint_info = "
    "{'universal_checkpoint_version': 0.4}` before `Trainer(model=model, ...)`. Lightning (DeepSpeed wraps a "
    "wrapper of your LightningModule): in your LightningModule, `def on_fit_start(self): "
    "self.trainer.strategy.model.module.universal_checkpoint_info = {'universal_checkpoint_version': 0.4}`."
)

ADVICE_ONLY = "export"


# what a repair's action gives back: (a file was written, the message, the backup made, the files written)
Applied = tuple[bool, str, Optional[Path], list[Path]]


def _local(loc: Location) -> Path:
    """A repair reads and writes local files: ``loc``, of the scanned tree of a local checkpoint, is a Path."""
    return cast(Path, loc)


def _rel(inv: Inventory, p: Path) -> str:
    """``p`` as the user can type it from where they ran ckpt-tui (``Inventory.shown``)."""
    try:
        rel = p.relative_to(_local(inv.path)).as_posix() or "."
    except ValueError:
        return shlex.quote(str(p))
    return inv.shown(rel)


def repairs_for(rep: Report) -> list[Repair]:
    inv = rep.inventory
    out: list[Repair] = []
    seen: set[tuple[str, str]] = set()
    for f in rep.findings:
        if not f.fix or (f.fix, f.path) in seen:
            continue
        seen.add((f.fix, f.path))
        r: Optional[Repair] = None
        try:
            if f.fix == "universal-info":
                r = _universal_info(rep, f)
            elif f.fix == "latest":
                r = _latest(rep, f)
            elif f.fix == "dcp-metadata":
                r = _dcp_metadata(rep, f)
            elif f.fix == ADVICE_ONLY:
                r = _export_advice(rep, f)
        except (OSError, FormatError, EditError) as e:  # planning read something it could not: say so
            r = _cannot(rep, f, f.fix, f"cannot plan this repair: {e}")
        if r is not None:
            r.trust_pickles = inv.trust_pickles
            out.append(r)
    return out


def _cannot(rep: Report, f: Finding, rid: str, why: str, notes: tuple[str, ...] = ()) -> Repair:
    return Repair(
        rid,
        f.code,
        f.path,
        f"cannot repair {f.code} at {rep.inventory.shown(f.path)}",
        Plan(f"No change: {why}", (), notes),
        root=_local(rep.inventory.path),
        can_apply=False,
    )


def _link(rep: Report, f: Finding, rid: str, target: Path) -> Optional[Repair]:
    """The repair that refuses, saying why, where a symbolic link lies between the checkpoint and the file
    it would write (a symlinked tag folder, `latest`, DCP folder or the file itself); else None."""
    link = link_on_path(_local(rep.inventory.path), target)
    if link is None:
        return None
    r = _cannot(rep, f, rid, link_refusal(link, _rel(rep.inventory, link)))
    r.refused = True
    return r


# ------------------------------------------------------------------ universal_checkpoint_info


def _universal_info(rep: Report, f: Finding) -> Repair:
    inv = rep.inventory
    node = inv.node(f.path)
    root = _local(inv.path)
    target = (_local(node.abspath) if node else root / f.path) / "mp_rank_00_model_states.pt"
    link = _link(rep, f, "universal-info", target)
    if link is not None:
        return link
    if not target.is_file():
        return _cannot(rep, f, "universal-info", f"{target} does not exist")
    with open(target, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        entries = read_entries(fh, size)
        e = pickle_entry(entries)
        pkl = read_pickle(fh, e)
        try:
            new = add_top_level_key(pkl, UCI_KEY, UCI_VALUE)
        except EditError as err:
            return _cannot(rep, f, "universal-info", str(err))
    new_size = size + (len(new) - len(pkl)) + 64  # upper bound (alignment padding may shift by < 64)
    bak = backup_path(target)
    steps = (
        PlanStep(
            "backup",
            _rel(inv, bak),
            _rel(inv, target),
            0,
            "hard link to the current file: the original stays as it is, no copy, no extra space",
        ),
        PlanStep(
            "write",
            _rel(inv, target),
            None,
            new_size,
            f"adds {UCI_KEY} = {UCI_VALUE!r} to the top-level dict (+{len(new) - len(pkl)} pickle bytes "
            f"inserted before STOP); the other {len(entries) - 1} zip records are copied byte for byte "
            "(written to a temp file beside it, fsync'd, then os.replace)",
        ),
    )
    notes = (
        f"needs {new_size:,} bytes free in {_rel(inv, target.parent)} (the old file is kept as the backup)",
        "nothing else in the file is unpickled or rewritten: framework objects (Lightning hyper-parameters, "
        "loops, callbacks) stay exactly as written",
        NEXT_TIME,
    )
    title = f"add universal_checkpoint_info to {_rel(inv, target)}"
    r = Repair("universal-info", f.code, f.path, title, Plan(title, steps, notes), root=root)
    r.action = lambda on_progress, cancel: _apply_universal_info(
        target, on_progress, cancel, lambda x: _rel(inv, x), root=root
    )
    return r


def _apply_universal_info(
    target: Path,
    on_progress: Optional[OnProgress],
    cancel: Optional[CancelToken],
    show: Callable[[Path], str] = str,
    root: Optional[Path] = None,
) -> Applied:
    if not target.is_file():
        raise RepairError(f"{target} no longer exists")
    with open(target, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        entries = read_entries(src, size)
        e = pickle_entry(entries)
        pkl = read_pickle(src, e)
        from ..formats.unpickle import safe_loads

        top = safe_loads(pkl, persistent=True).obj
        if isinstance(top, dict) and UCI_KEY in top:
            return False, f"{show(target)} already has {UCI_KEY}: nothing to do", None, []
        new = add_top_level_key(pkl, UCI_KEY, UCI_VALUE)
        total = sum(x.size for x in entries if x is not e)
        done = [0]

        def on_bytes(n: int) -> None:
            done[0] += n
            report(on_progress, done[0], total, "bytes", "copying records")

        def write(dst: BinaryIO) -> None:
            rewrite_zip(src, entries, {e.name: new}, dst, on_bytes=on_bytes, cancel=cancel)

        def verify(tmp: Path) -> None:
            with open(tmp, "rb") as t:
                got = read_entries(t, os.fstat(t.fileno()).st_size)
                if [x.name for x in got] != [x.name for x in entries]:
                    raise RepairError("verification failed: the rewritten zip lists different records")
                for a, b in zip(entries, got):
                    if a is e:
                        if read_pickle(t, b) != new:
                            raise RepairError("verification failed: data.pkl differs from what was written")
                    elif (a.crc, a.size) != (b.crc, b.size):
                        raise RepairError(f"verification failed: record {a.name!r} changed")
                    elif b.data_offset % 64 and a.data_offset % 64 == 0:
                        raise RepairError(f"verification failed: record {a.name!r} lost its alignment")
                obj = safe_loads(read_pickle(t, pickle_entry(got)), persistent=True).obj
                if not isinstance(obj, dict) or obj.get(UCI_KEY) != UCI_VALUE or set(obj) != set(top) | {UCI_KEY}:
                    raise RepairError("verification failed: the re-read top-level dict is not the old one plus the key")

        bak = replace_file(
            target,
            write,
            backup=True,
            needed=size + len(new) - len(pkl) + 4096,
            verify=verify,
            on_progress=on_progress,
            cancel=cancel,
            label="verified",
            root=root,
        )
    return (
        True,
        f"added {UCI_KEY} = {UCI_VALUE!r} to {show(target)}; the original is kept as {show(cast(Path, bak))}",  # backup=True
        bak,
        [target],
    )


# ------------------------------------------------------------------ latest / latest_universal / megatron


def _step(name: str) -> int:
    s = step_of(name)
    return -1 if s is None else s


def _complete(rep: Report, tag: Node) -> bool:
    return not any(x.severity == "error" and tag.contains(x.path) for x in rep.findings)


def _latest(rep: Report, f: Finding) -> Repair:
    inv = rep.inventory
    root = _local(inv.path)
    node = inv.node(f.path)
    if node is None:
        return _cannot(rep, f, "latest", f"{f.path} is no longer in the report")
    parent: Optional[Node]
    if node.is_dir:  # latest-missing: the folder holding the tags
        parent = node
        tags = inv.deepspeed_tags(parent)
        if tags:
            name = "latest"
        else:
            name = "latest_universal"
            tags = inv.deepspeed_tags(parent, universal=True)
    else:
        name = node.name
        parent = inv.node(f.path.rsplit("/", 1)[0] if "/" in f.path else ".")
        if parent is None:
            return _cannot(rep, f, "latest", "its folder is not in the report")
        if name == "latest_checkpointed_iteration.txt":
            tags = [c for c in parent.children if c.is_dir and step_of(c.name) is not None]
        elif name == "latest_universal":
            tags = inv.deepspeed_tags(parent, universal=True)
        else:
            tags = inv.deepspeed_tags(parent)
        if not tags:
            tags = [
                c
                for c in parent.children
                if c.is_dir and (format_of(c).tag or format_of(c).universal or step_of(c.name) is not None)
            ]
    complete = [c for c in tags if _complete(rep, c)]
    target = _local(parent.abspath) / name
    link = _link(rep, f, "latest", target)
    if link is not None:
        return link
    if not complete:
        why = "no complete tag folder here" + (f" (incomplete: {', '.join(t.name for t in tags[:4])})" if tags else "")
        return _cannot(rep, f, "latest", why)
    best = max(complete, key=lambda c: (_step(c.name), c.abspath.stat().st_mtime if c.abspath.exists() else 0))
    if name == "latest_checkpointed_iteration.txt":
        content = "release" if best.name == "release" else str(_step(best.name))
    else:
        content = best.name
    old = None
    if target.is_file():
        try:
            old = target.read_bytes()[:200].decode("utf-8", "replace")
        except OSError:
            old = None
    steps: list[PlanStep] = []
    if target.exists():
        steps.append(
            PlanStep("backup", _rel(inv, backup_path(target)), _rel(inv, target), 0, "hard link to the current file")
        )
    steps.append(
        PlanStep(
            "write",
            _rel(inv, target),
            None,
            len(content),
            f"{old!r} -> {content!r}" if old is not None else f"new file containing {content!r}",
        )
    )
    skipped = [t.name for t in tags if t not in complete]
    notes = [f"`{best.name}` is the newest tag with no error finding"]
    if skipped:
        notes.append(f"skipped incomplete: {', '.join(skipped[:6])}")
    title = f"point {_rel(inv, target)} at {best.name}"
    r = Repair("latest", f.code, f.path, title, Plan(title, tuple(steps), tuple(notes)), root=root)
    r.action = lambda on_progress, cancel: _apply_latest(
        target, content, _local(parent.abspath) / best.name, on_progress, cancel, lambda x: _rel(inv, x), root=root
    )
    return r


def _apply_latest(
    target: Path,
    content: str,
    tagdir: Path,
    on_progress: Optional[OnProgress],
    cancel: Optional[CancelToken],
    show: Callable[[Path], str] = str,
    root: Optional[Path] = None,
) -> Applied:
    if not tagdir.is_dir():
        raise RepairError(f"{tagdir} no longer exists")
    if target.is_file():
        try:
            if target.read_text(encoding="utf-8", errors="replace").strip() == content:
                return False, f"{show(target)} already names {content}: nothing to do", None, []
        except OSError as e:
            raise RepairError(f"{target}: {e.strerror}") from None
    data = content.encode()

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    bak = replace_file(
        target,
        write,
        backup=True,
        needed=len(data) + 4096,
        on_progress=on_progress,
        cancel=cancel,
        root=root,
    )
    msg = f"{show(target)} now names {content}" + (f"; the old file is kept as {show(bak)}" if bak else "")
    return True, msg, bak, [target]


# ------------------------------------------------------------------ DCP .metadata from .metadata.tmp


def check_metadata_tmp(folder: Path, trust: bool = False) -> tuple[bool, str]:
    """Is ``folder/.metadata.tmp`` a complete DCP Metadata whose every storage record lies inside an
    existing shard file? Returns (ok, reason)."""
    from ..formats.dcp.reader import read_metadata_file

    tmp = folder / ".metadata.tmp"
    try:
        md, unsafe, _ = read_metadata_file(tmp)
    except FormatError as e:
        return False, f".metadata.tmp cannot be read as DCP metadata ({e}): the save stopped while writing it"
    except OSError as e:
        return False, f".metadata.tmp cannot be read: {e.strerror}"
    if unsafe and not trust:
        return False, f".metadata.tmp names code outside the allowlist ({', '.join(sorted(unsafe)[:4])})"
    sd = md.__dict__.get("storage_data")
    if not isinstance(sd, dict) or not sd:
        return False, ".metadata.tmp has no storage records"
    need: dict[str, int] = {}
    for info in sd.values():
        d = getattr(info, "__dict__", {})
        rp, off, ln = d.get("relative_path"), d.get("offset"), d.get("length")
        if (
            not isinstance(rp, str)
            or not isinstance(off, int)
            or not isinstance(ln, int)
            or "/" in rp
            or rp in ("", ".", "..")
        ):
            return False, ".metadata.tmp has a malformed storage record"
        need[rp] = max(need.get(rp, 0), off + ln)
    for rp, end in sorted(need.items()):
        p = folder / rp
        if not p.is_file():
            return False, f"it names shard file {rp}, which is not here"
        if p.stat().st_size < end:
            return False, f"shard file {rp} is {p.stat().st_size} bytes but .metadata.tmp needs {end}: it is truncated"
    return True, f"verified against {len(need)} shard file(s), {len(sd)} storage records"


def _dcp_metadata(rep: Report, f: Finding) -> Repair:
    from ..advice import last_complete_sibling

    inv = rep.inventory
    root = _local(inv.path)
    node = inv.node(f.path)
    folder = _local(node.abspath) if node else root / f.path
    link = _link(rep, f, "dcp-metadata", folder / ".metadata.tmp") or _link(
        rep, f, "dcp-metadata", folder / ".metadata"
    )
    if link is not None:
        return link
    ok, why = check_metadata_tmp(folder, inv.trust_pickles)
    target = folder / ".metadata"
    tmp = folder / ".metadata.tmp"
    if not ok:
        sib = last_complete_sibling(inv, node) if node is not None else None
        note = (
            (f"the last complete checkpoint beside it is `{sib}`",)
            if sib
            else ("no complete sibling checkpoint was found here",)
        )
        return _cannot(rep, f, "dcp-metadata", f".metadata cannot be rebuilt from .metadata.tmp: {why}", note)
    size = tmp.stat().st_size
    steps = (
        PlanStep(
            "write",
            _rel(inv, target),
            _rel(inv, tmp),
            size,
            "copy of .metadata.tmp (torch writes .metadata.tmp, then renames it; the rename did not happen); "
            ".metadata.tmp is left in place",
        ),
    )
    title = f"rebuild {_rel(inv, target)} from .metadata.tmp"
    r = Repair("dcp-metadata", f.code, f.path, title, Plan(title, steps, (why,)), root=root)
    trust = inv.trust_pickles
    r.action = lambda on_progress, cancel: _apply_dcp(folder, trust, on_progress, cancel, root=root)
    return r


def _apply_dcp(
    folder: Path,
    trust: bool,
    on_progress: Optional[OnProgress],
    cancel: Optional[CancelToken],
    root: Optional[Path] = None,
) -> Applied:
    target = folder / ".metadata"
    tmp = folder / ".metadata.tmp"
    if target.is_file():
        return False, ".metadata already exists: nothing to do", None, []
    ok, why = check_metadata_tmp(folder, trust)
    if not ok:
        raise RepairError(f".metadata cannot be rebuilt: {why}")
    before = stamp(tmp)
    data = tmp.read_bytes()
    if stamp(tmp) != before:
        raise RepairError(".metadata.tmp changed while it was read: a save may still be running")

    def verify(p: Path) -> None:
        if p.read_bytes() != data:
            raise RepairError("verification failed: the written .metadata differs from .metadata.tmp")

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    replace_file(
        target,
        write,
        backup=False,
        needed=len(data) + 4096,
        watch=(tmp,),
        verify=verify,
        on_progress=on_progress,
        cancel=cancel,
        root=root,
    )
    return True, f"wrote .metadata ({len(data)} bytes) from .metadata.tmp ({why})", None, [target]


# ------------------------------------------------------------------ advice only


def _export_advice(rep: Report, f: Finding) -> Repair:
    inv = rep.inventory
    root = _local(inv.path)
    node = inv.node(f.path)
    sub: Optional[Node] = None
    if f.code == "dcp-components" and node is not None:
        apart = [c for c in node.children if c.is_dir and format_of(c).components_apart]
        models = [c for c in apart if c.role in MODEL_ROLES]
        candidates = models or apart
        sub = candidates[0] if candidates else None
    src = _local(sub.abspath) if sub is not None else (_local(node.abspath) if node is not None else root / f.path)
    shown = _rel(inv, src)
    out = shlex.quote(user_path(inv.given or str(root), os.path.relpath(src, root)) + "_exported")
    to_hf = ""
    if f.code == "to-hf":  # a Hugging Face model, not the tensors under the framework's names
        to_hf = " --to hf" + (" --config PATH" if f.command is None else "")
    cmd = f"ckpt-tui export {shown}{to_hf} --out {out}"
    title = f"{f.code} at {inv.shown(f.path)}: nothing to write; export instead"
    plan = Plan(title, (), (f"run `{cmd}` (a single safetensors model any tool can load)",))
    return Repair("export", f.code, f.path, title, plan, root=root, writes=False, can_apply=False)
