"""export(SRC, OUT): pick the model component the inspector found, plan, write, verify."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..formats import FormatError
from ..formats.format import NotExportable
from ..formats.registry import format_of
from ..progress import OnProgress
from ..report import Report, inspect
from ..types import Node
from .plan import ExportPlan, make_plan
from .prefix import choose
from .sources import Source, strip_names
from .write import ExportError, ExportResult, execute


def resolve(report: Report, tag: Optional[str] = None) -> tuple[Node, list[str]]:
    """The node holding the model weights, and what was decided on the way (said to the user)."""
    inv = report.inventory
    said = []
    root = inv.root
    if inv.layout == "run-folder":
        complete = [c for c in inv.checkpoints if c["complete"]]
        if not complete:
            raise ExportError("no complete checkpoint in this run folder (see `ckpt-tui inspect`)")
        ck = complete[0]
        said.append(f"exporting the newest complete checkpoint, `{ck['path']}/` (step {ck['step']})")
        node = inv.model_node(ck["path"])
    else:
        rel = inv.model_path()
        node = inv.node(rel) if rel else None
        if node is not None and node is not root:
            said.append(f"the model is `{rel}" + ("/" if node.is_dir else "") + "`")
    if tag and node is not None and node.format == "deepspeed-zero":
        parent = inv.node(node.path.rsplit("/", 1)[0] if "/" in node.path else ".")
        alt = parent.child(tag) if parent is not None else None
        if alt is None:
            raise ExportError(f"no tag folder `{tag}` beside `{node.path}`")
        node = alt
    if node is None:
        raise ExportError(f"no model weights found in {root.abspath} ({inv.summary})")
    return node, said


def _blocking_findings(report: Report, node: Node, trust: bool) -> list[str]:
    out = []
    for f in report.findings:
        if not node.contains(f.path) or f.severity != "error":
            continue
        if f.code == "unsafe-pickle" and trust:
            continue
        out.append(f"{f.code} at {f.path}: {f.message}")
    return out


def screened_model(src, *, tag=None, trust_pickles=False, why: str = "cannot read the weights"
                   ) -> tuple[Report, Node, list[str]]:
    """Inspect ``src``, pick the node holding the model weights, and refuse (ExportError) if an
    error finding inside it — unsafe pickles above all — says it must not be read. Every path that
    reads weights (export, verify, stats, diff) starts here."""
    report = inspect(src, trust_pickles=trust_pickles)
    node, said = resolve(report, tag)
    blocking = _blocking_findings(report, node, trust_pickles)
    if blocking:
        raise ExportError(f"{why}:\n  " + "\n  ".join(blocking))
    return report, node, said


def source_for(node: Node, *, strip_prefix=None, exclude_frozen=False, trust_pickles=False) -> Source:
    """``node``'s model weights as an export source, opened by its format."""
    fmt = format_of(node)
    try:
        if fmt is None:
            raise NotExportable(f"`{node.path}` ({node.format}) is not a format ckpt-tui can export")
        return fmt.source(node, strip_prefix=strip_prefix, exclude_frozen=exclude_frozen, trust_pickles=trust_pickles)
    except NotExportable as e:
        raise ExportError(str(e)) from None


def config_dirs(node: Node, report: Report) -> list[Path]:
    """Beside the checkpoint and in the run's output folder above it (HF Trainer writes no
    config.json into sharded-FSDP checkpoints)."""
    p = node.abspath if node.is_dir else node.abspath.parent
    dirs = [p, p.parent, p.parent.parent]
    if (p.parent.name.startswith("checkpoint-") or p.name.startswith("checkpoint-")):
        dirs.append(p.parent.parent.parent)
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def plan_export(src, out, *, dtype="keep", max_shard_size="50GB", exclude_frozen=False, strip_prefix=None,
                keep_prefix=False, config=None, tag=None, trust_pickles=False) -> tuple[ExportPlan, list[str]]:
    """The export plan. A Lightning checkpoint whose names all start with one LightningModule
    attribute (``model.``) loses it by default (``keep_prefix`` keeps it, ``strip_prefix`` forces
    one): see :mod:`.prefix`."""
    report, node, said = screened_model(src, tag=tag, trust_pickles=trust_pickles,
                                        why="the checkpoint has problems an export cannot work around")
    try:
        source = source_for(node, exclude_frozen=exclude_frozen, trust_pickles=trust_pickles)
    except FormatError as e:
        raise ExportError(f"`{node.path}`: {e}") from None
    prefix = choose(node, [t.name for t in source.tensors], strip_prefix=strip_prefix, keep_prefix=keep_prefix)
    strip_names(source, prefix.strip)
    if prefix.note:
        source.notes.append(prefix.note)
    plan = make_plan(source, Path(out).absolute(), dtype=dtype, max_shard_size=max_shard_size,
                     exclude_frozen=exclude_frozen, config_dirs=config_dirs(node, report),
                     config_path=Path(config) if config else None)
    plan.out_given, plan.prefix = str(out), prefix
    return plan, said


def export(src, out, *, dtype="keep", max_shard_size="50GB", jobs=1, exclude_frozen=False, strip_prefix=None,
           keep_prefix=False, config=None, tag=None, overwrite=False, verify=True, trust_pickles=False,
           on_progress: Optional[OnProgress] = None, cancel=None) -> ExportResult:
    plan, said = plan_export(src, out, dtype=dtype, max_shard_size=max_shard_size, exclude_frozen=exclude_frozen,
                             strip_prefix=strip_prefix, keep_prefix=keep_prefix, config=config, tag=tag,
                             trust_pickles=trust_pickles)
    res = execute(plan, jobs=jobs, overwrite=overwrite, verify=verify, on_progress=on_progress, cancel=cancel)
    res.notes = said + res.notes
    return res
