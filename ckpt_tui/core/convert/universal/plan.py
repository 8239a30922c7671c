"""Plan a universal conversion: resolve SRC to a ZeRO tag folder, screen it, say what converting it
will do (the converter's command, the files it writes, frozen parameters, stage warnings) and check
the output (:func:`ckpt_tui.core.fsutil.preflight_output`). Writes nothing."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union, cast

from ...export.write import ExportError
from ...facts import DeepSpeedZeroFacts
from ...formats.registry import format_of
from ...fsutil import OutputError, preflight_output
from ...jsondoc import as_json
from ...leftovers import UNIVERSAL_TEMP
from ...staging import refusal
from ...types import Inventory, Node, Plan, PlanStep, in_user_form
from ..common import TagPlan, resolve_tag
from .instructions import FROZEN_FILE

if TYPE_CHECKING:
    from ...report import Report

CONVERTER_MODULE = "deepspeed.checkpoint.ds_to_universal"
TMP_PREFIX = UNIVERSAL_TEMP  # inspect lists a killed run's as a leftover by the same name (core/leftovers.py)
STATE_FILES_Z12 = ("fp32", "exp_avg", "exp_avg_sq", "step")
STATE_FILES_Z3 = ("fp32", "exp_avg", "exp_avg_sq")


class UniversalError(ExportError):
    """The conversion cannot run or failed; the message says why and what to do."""


def output_refusal(e: OutputError, out: Path, tag_dir: Path) -> str:
    """What the output preflight found, said for the conversion."""
    return refusal(e, "universal")


@dataclass
class UniversalPlan(TagPlan):
    json_keys = (
        "src",
        "tag_dir",
        "out",
        "zero_stage=stage",
        "world_size",
        "global_step",
        "framework",
        "inject_missing_state",
        "trainable",
        "frozen",
        "buffers",
        "expected_files",
        "warnings",
    )

    layout: str
    inject_missing_state: bool
    trainable: list[str]
    frozen: list[str]
    buffers: list[str]
    expected_files: int
    estimated_bytes: int
    trust_pickles: bool = False
    target_stage: Optional[int] = None
    export_frozen: bool = False
    warnings: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)  # which tag was chosen and why (not in the JSON document)
    # the universal folder is already there and complete: only write the frozen parameters beside it
    frozen_only: bool = False
    # the universal folder is there and complete, and so is what --export-frozen writes: nothing to do but say how
    # to load it (a run again of `ckpt-tui universal`)
    already: bool = False
    given: str = ""  # SRC as the user typed it: the paths the plan and the instructions print follow its form

    def shown(self, p: object) -> str:
        """``p`` as the user can type it: relative to their folder if they named SRC by a relative
        path, else absolute (not quoted: prose and Python strings)."""
        return in_user_form(self.given, p)

    @property
    def frozen_file(self) -> Path:
        return self.out.parent / FROZEN_FILE

    def command(self, output_folder: Path) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            CONVERTER_MODULE,
            "--input_folder",
            str(self.tag_dir),
            "--output_folder",
            str(output_folder),
            "--num_extract_workers",
            str(_workers()),
            "--num_merge_workers",
            "1",
        ]
        if self.inject_missing_state:
            cmd.append("--inject_missing_state")
        return cmd

    def to_plan(self) -> Plan:
        sh = self.shown
        if self.already:
            return Plan(
                f"Nothing to write: {sh(self.out)} is already the complete universal checkpoint of "
                f"{sh(self.tag_dir)}; print how to load it",
                (),
                (f"source {sh(self.tag_dir)} is only read, never modified",),
            )
        if self.frozen_only:
            return Plan(
                f"Write the frozen parameters of {sh(self.tag_dir)} beside the universal checkpoint "
                f"{sh(self.out)} (already there and complete: not converted again)",
                (
                    PlanStep(
                        "write",
                        sh(self.frozen_file),
                        source=sh(self.tag_dir),
                        detail=f"{len(self.frozen)} frozen param(s) + {len(self.buffers)} buffer(s)",
                    ),
                ),
                (f"source {sh(self.tag_dir)} is only read, never modified",),
            )
        steps = [
            PlanStep(
                "mkdir", sh(self.out.parent / f"{TMP_PREFIX}XXXX"), detail="private temp folder beside the output"
            ),
            PlanStep(
                "run",
                " ".join(self.command(self.out.parent / f"{TMP_PREFIX}XXXX" / "inner" / self.out.name)),
                source=sh(self.tag_dir),
                bytes=self.estimated_bytes,
                detail=f"DeepSpeed's converter, {self.expected_files} state files expected; log in the temp folder",
            ),
            PlanStep(
                "run", "verify", detail="every parameter's state files present; fp32 bit-exact vs the source masters"
            ),
            PlanStep("replace", sh(self.out), detail="os.replace of the verified folder"),
            PlanStep("write", sh(self.out.parent / "latest_universal"), detail=f"contains {self.out.name!r}"),
        ]
        if self.export_frozen and (self.frozen or self.buffers):
            steps.append(
                PlanStep(
                    "write",
                    sh(self.frozen_file),
                    detail=f"{len(self.frozen)} frozen param(s) + {len(self.buffers)} buffer(s)",
                )
            )
        notes = [f"source {sh(self.tag_dir)} (ZeRO-{self.stage}, {self.world_size} ranks) is only read, never modified"]
        if self.inject_missing_state:
            notes.append("universal_checkpoint_info is missing: --inject_missing_state supplies it in memory")
        notes += self.warnings
        return Plan(
            f"Convert {sh(self.tag_dir)} to a DeepSpeed universal checkpoint in {sh(self.out)}",
            tuple(steps),
            tuple(notes),
        )

    def to_json(self) -> dict[str, Any]:
        # the document counts the trainable parameters and adds the printable plan
        return as_json(self, self.json_keys) | {"trainable": len(self.trainable), "plan": self.to_plan().to_json()}


def _workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def universal_plan(
    src: Union[str, os.PathLike[str]],
    out: Union[str, os.PathLike[str], None] = None,
    *,
    trust_pickles: bool = False,
    target_stage: Optional[int] = None,
    export_frozen: bool = True,
    tag: Optional[str] = None,
) -> UniversalPlan:
    """Resolve SRC to a ZeRO tag folder (``tag``: that tag beside the one `latest` names; a `latest`
    naming no tag folder is refused without it) and say what converting it will do, and which tag
    it chose and why (``said``). Writes nothing.

    Raises ``ScanError`` for an unreadable path, :class:`UniversalError` where it cannot convert.
    """
    from ...formats import FormatError, screen
    from ...formats.deepspeed.reader import LAYER_RE
    from ...formats.deepspeed.states import MOE_RE
    from ...formats.deepspeed.zero import deepspeed_source
    from ...formats.torch_save import torchfile

    src = Path(src)
    rep, node, said = resolve_tag(src, tag, trust_pickles, UniversalError)
    inv = rep.inventory
    if node is None or not format_of(node).tag:
        if node is not None and format_of(node).universal or inv.layout == "universal":
            raise UniversalError(
                f"{src} is already a DeepSpeed universal checkpoint: load it with "
                '{"checkpoint": {"load_universal": true}}'
            )
        raise UniversalError(
            f"{src} is not a DeepSpeed ZeRO checkpoint ({inv.summary}); universal conversion "
            "needs a DeepSpeed tag folder (global_stepN/) with *_optim_states.pt files"
        )
    f = cast(DeepSpeedZeroFacts, node.facts)
    tag_dir = cast(Path, node.abspath)  # SRC is a local Path (above): so are the scan's nodes
    names = [c.name for c in node.children]
    if f.get("pipeline") or any(LAYER_RE.match(n) for n in names):
        raise UniversalError(
            "pipeline-parallel checkpoints (layer_*-model_states.pt) are not supported here: "
            "ds_to_universal handles them only for Megatron-DeepSpeed layouts"
        )
    if f.get("moe") or any(MOE_RE.search(n) for n in names):
        raise UniversalError(
            "MoE checkpoints (expert_*/expp_rank_* files) are not supported: DeepSpeed's ds_to_universal fails on "
            "expert-parallel ones (it joins different ranks' experts as one tensor) and a universal MoE checkpoint "
            "loading back is unproven; `ckpt-tui export` writes the fp32 weights of every expert, `--component "
            "optimizer` their optimizer state"
        )
    if (f.get("mp_world_size") or 1) > 1:
        raise UniversalError(f"model-parallel checkpoints (mp_world_size={f['mp_world_size']}) are not supported here")
    errs = [x for x in rep.findings if x.severity == "error" and node.contains(x.path) and x.code != "unsafe-pickle"]
    if errs:
        lines = "; ".join(f"{x.code} {x.path}: {x.message}" for x in errs[:4])
        raise UniversalError(f"{tag_dir} has errors, DeepSpeed cannot convert it: {lines}")
    unsafe = [x for x in rep.findings if x.code == "unsafe-pickle" and node.contains(x.path)]
    if unsafe and not trust_pickles:
        raise UniversalError(
            f"{unsafe[0].path} names code outside ckpt-tui's allowlist; DeepSpeed's converter "
            "unpickles without restriction and would run it. Convert only a checkpoint you trust, "
            "with --trust-pickles"
        )
    try:  # ds_to_universal torch.loads every rank's states file without restriction: each one screened first
        screen.require(screen.tag_files(tag_dir), trust_pickles=trust_pickles, loader="DeepSpeed's ds_to_universal")
    except (FormatError, OSError) as e:
        raise UniversalError(str(e)) from None
    stage = f.get("zero_stage")
    if stage not in (1, 2, 3):
        raise UniversalError(f"unsupported ZeRO stage {stage!r} in {tag_dir} (universal conversion needs ZeRO-1/2/3)")
    try:
        source = deepspeed_source(tag_dir)
    except ValueError as e:
        raise UniversalError(f"{tag_dir}: {e}") from None
    buffer_names: set[str] = set()
    ms = tag_dir / "mp_rank_00_model_states.pt"
    if not ms.is_file():
        ms = tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    try:
        obj = torchfile.read(ms).obj
        if isinstance(obj, dict):
            buffer_names = {str(b) for b in (obj.get("buffer_names") or [])}
    except Exception:  # noqa: BLE001 - already screened by the inspector; buffers are only informative
        pass
    trainable: list[str] = []
    frozen: list[str] = []
    buffers: list[str] = []
    for t in source.tensors:
        if t.tied_to:
            continue
        if t.name in buffer_names:
            buffers.append(t.name)
        elif t.frozen:
            frozen.append(t.name)
        else:
            trainable.append(t.name)
    if stage <= 2:
        expected = 4 * len(trainable) + len(frozen) + len(buffers)
    else:
        expected = 3 * len(trainable)
    params = sum(t.numel for t in source.tensors if not t.tied_to)
    estimated = 3 * 4 * params + sum(c.size for c in node.children if "model_states" in c.name)

    if out is None:
        out = default_out(tag_dir)
    out = Path(os.path.abspath(out))
    parent = out.parent
    # the converter writes a folder per parameter: trainable ones, and under ZeRO-1/2 the frozen ones and buffers
    folders = len(trainable) + (len(frozen) + len(buffers) if stage <= 2 else 0)
    # SRC the tag itself (as inspect's findings print it): the folder holding it says which framework wrote it
    # (HF Trainer, Lightning: the load steps differ) and holds the universal folder beside it
    around = _around(rep, tag_dir)
    complete = _complete_universal(rep if around is None else around, node, out, folders, tag_inv=inv)
    needs_frozen = bool(export_frozen and (frozen or buffers) and not (parent / FROZEN_FILE).exists())
    frozen_only = needs_frozen and complete
    # converted before, frozen parameters too (or none to write): a run again only says how to load it
    already = complete and not needs_frozen
    if not frozen_only and not already:
        try:
            preflight_output(out, need=2 * estimated, source=tag_dir)
        except OutputError as e:
            raise UniversalError(output_refusal(e, out, tag_dir)) from None
    warnings: list[str] = []
    if export_frozen and (frozen or buffers) and (parent / FROZEN_FILE).exists() and not already:
        raise UniversalError(f"{parent / FROZEN_FILE} already exists; move it away or choose --out")
    if (frozen or buffers) and not export_frozen:
        what = []
        if frozen:
            what.append(
                f"{len(frozen)} frozen parameter(s) ({', '.join(frozen[:3])}{', ...' if len(frozen) > 3 else ''})"
            )
        if buffers:
            what.append(f"{len(buffers)} buffer(s) ({', '.join(buffers[:3])}{', ...' if len(buffers) > 3 else ''})")
        warnings.append(
            " and ".join(what) + ": load_universal restores only optimizer-tracked parameters, so these keep "
            "whatever the model was built with on resume"
            + (" (ZeRO-3: the converter leaves frozen parameters out entirely)" if stage == 3 and frozen else "")
            + ". --no-export-frozen left them out; without it they are written to "
            + FROZEN_FILE
            + " next to the "
            "output, to load into the model as the instructions show."
        )
    if target_stage is not None and target_stage != stage:
        if (target_stage == 3) != (stage == 3):
            warnings.append(
                f"target ZeRO-{target_stage} differs from the source's ZeRO-{stage}: DeepSpeed fails to "
                "load a universal checkpoint across ZeRO-1/2 <-> ZeRO-3 (a bare AssertionError). "
                f"Resume with ZeRO-{stage}" + (" (or ZeRO-1/2)" if stage in (1, 2) else "") + "."
            )
        else:
            warnings.append(
                f"target ZeRO-{target_stage} differs from the source's ZeRO-{stage}; ZeRO-1 <-> 2 loads "
                "(measured with deepspeed 0.19.8 on CPU)."
            )
    return UniversalPlan(
        src=src,
        tag_dir=tag_dir,
        out=out,
        stage=stage,
        world_size=int(f.get("world_size") or 0),
        global_step=f.get("global_step"),
        framework=inv.framework if around is None else (around.inventory.framework or inv.framework),
        layout=inv.layout,
        inject_missing_state=(stage <= 2 and not f.get("universal_checkpoint_info")),
        trainable=trainable,
        frozen=frozen,
        buffers=buffers,
        expected_files=expected,
        estimated_bytes=estimated,
        trust_pickles=trust_pickles,
        target_stage=target_stage,
        export_frozen=export_frozen,
        warnings=warnings,
        said=said,
        frozen_only=frozen_only,
        already=already,
        given=os.fspath(src),
    )


def default_out(tag_dir: Path) -> Path:
    """Where a tag's universal checkpoint goes unless told: ``<tag>_universal/`` beside it (where
    ``latest_universal`` lets load_checkpoint find it)."""
    return Path(tag_dir).parent / f"{Path(tag_dir).name}_universal"


def _around(rep: Report, tag_dir: Path) -> Optional[Report]:
    """The report of the folder holding ``tag_dir`` where SRC was the tag itself (else None: the report has it)."""
    from ...report import inspect

    if rep.inventory.root.path != "." or cast(Path, rep.inventory.root.abspath) != tag_dir:
        return None
    try:
        return inspect(tag_dir.parent, trust_pickles=rep.inventory.trust_pickles)
    except Exception:  # noqa: BLE001 - only what it adds to the plan (framework, a conversion there) is lost
        return None


def _complete_universal(
    rep: Report, tag: Node, out: Path, params: Optional[int] = None, *, tag_inv: Optional[Inventory] = None
) -> bool:
    """Is ``out`` a complete universal checkpoint of ``tag`` that `latest_universal` beside it names, by the
    very check inspect's finding makes (``universal_unusable``: every state file of every parameter, none
    damaged)? ``params``: and of that many parameter folders (no more: the tag's trainable parameters)."""
    from ...formats.deepspeed.findings import universal_unusable

    if not out.is_dir():
        return False
    tag_inv = tag_inv or rep.inventory  # the tag's facts are in the scan that found it
    root = cast(Path, rep.inventory.root.abspath)  # a local scan (universal_plan): its root is a Path
    try:
        rel = out.relative_to(root).as_posix()
    except ValueError:  # SRC was the tag folder: look at the folder holding it and its universal sibling
        from ...report import inspect

        rep = inspect(out.parent, trust_pickles=rep.inventory.trust_pickles)
        rel = out.name
    node = rep.inventory.node(rel)
    if node is None or not format_of(node).universal:
        return False
    if params is not None and node.facts.get("param_folders") != params:
        return False
    try:
        named: Optional[str] = (out.parent / "latest_universal").read_text().strip()
    except OSError:
        named = None
    if universal_unusable(tag_inv, tag, node, named) is not None:
        return False
    return not any(f.severity == "error" and node.contains(f.path) for f in rep.findings)
