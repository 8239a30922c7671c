"""How to load / resume from a universal checkpoint: DeepSpeed, HF Trainer, Lightning, and the code
that loads the exported frozen parameters. One text for ``ckpt-tui universal`` (after a conversion,
:func:`instructions`) and for ``inspect`` (a universal checkpoint already beside its tag,
:func:`load_instructions`). Imports nothing of ckpt-tui: the diagnosis uses it without the converter."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol, Sequence

FROZEN_FILE = "frozen_params.safetensors"  # --export-frozen writes it beside the universal folder


def frozen_load_code(frozen_file: object, target: str = "engine.module", zero3: bool = False) -> str:
    """Python that loads ``frozen_file`` into ``target`` (an nn.Module expression)."""
    code = f"from safetensors.torch import load_file\nfrozen = load_file({str(frozen_file)!r})\n"
    if zero3:
        code += (
            f"import deepspeed\n"
            f"params = [p for n, p in {target}.named_parameters() if n in frozen]\n"
            f"with deepspeed.zero.GatheredParameters(params, modifier_rank=0):\n"
            f"    missing, unexpected = {target}.load_state_dict(frozen, strict=False)\n"
        )
    else:
        code += f"missing, unexpected = {target}.load_state_dict(frozen, strict=False)\n"
    code += "assert not unexpected, unexpected\n"
    return code


@dataclass(frozen=True)
class UniversalLoad:
    """What the instructions name: ``out`` (the universal folder) and ``ckdir`` (the folder holding
    ``latest_universal``, which load_checkpoint is given), as prose shows them (``out_shown``,
    ``ckdir_shown``) and as Python code names them (``ckdir_code``, ``frozen_code``); the source tag's
    ZeRO stage, step, frozen parameters and buffers, and the framework that wrote it."""

    out_shown: str
    out_name: str
    ckdir_shown: str
    ckdir_code: str
    ckdir_name: str
    stage: int
    global_step: Optional[int]
    frozen: Sequence[str]
    buffers: Sequence[str]
    framework: Optional[str]
    frozen_code: str  # where the frozen parameters are (or would be) exported
    frozen_exported: bool  # they are there
    tag_shown: str = ""  # the source tag folder, as a command argument (shell-quoted)


class ConvertedPlan(Protocol):
    """What :func:`instructions` reads of a ``UniversalPlan`` (named here, not imported: this module imports
    nothing of ckpt-tui)."""

    @property
    def out(self) -> Path: ...
    @property
    def tag_dir(self) -> Path: ...
    @property
    def frozen_file(self) -> Path: ...
    @property
    def stage(self) -> int: ...
    @property
    def global_step(self) -> Optional[int]: ...
    @property
    def frozen(self) -> Sequence[str]: ...
    @property
    def buffers(self) -> Sequence[str]: ...
    @property
    def framework(self) -> Optional[str]: ...
    def shown(self, p: Path) -> str: ...


def instructions(plan: ConvertedPlan, frozen_file: Optional[Path] = None) -> str:
    """The instructions after converting with ``plan`` (a ``UniversalPlan``); ``frozen_file``: the
    frozen parameters were exported there."""
    out = plan.out
    ckdir = out.parent
    ff = frozen_file or plan.frozen_file
    sh = plan.shown
    return load_instructions(
        UniversalLoad(
            out_shown=shlex.quote(sh(out)),
            out_name=out.name,
            ckdir_shown=shlex.quote(sh(ckdir)),
            ckdir_code=sh(ckdir),
            ckdir_name=ckdir.name,
            stage=plan.stage,
            global_step=plan.global_step,
            frozen=plan.frozen,
            buffers=plan.buffers,
            framework=plan.framework,
            frozen_code=sh(ff),
            frozen_exported=frozen_file is not None,
            tag_shown=shlex.quote(sh(plan.tag_dir)),
        )
    )


def load_instructions(u: UniversalLoad) -> str:
    stage = u.stage
    ff = u.frozen_code
    lines = [
        f"Universal checkpoint: {u.out_shown}  (latest_universal in {u.ckdir_shown} names {u.out_name!r})",
        "",
        "DeepSpeed: add to the DeepSpeed config (any world size; keep ZeRO-" + ("1/2" if stage <= 2 else "3") + "):",
        '  "checkpoint": {"load_universal": true}',
        "then, after deepspeed.initialize(...):",
        f"  load_path, client_state = engine.load_checkpoint({u.ckdir_code!r})",
        f"  # engine.global_steps == {u.global_step}",
    ]
    has_frozen = bool(u.frozen or u.buffers)
    if has_frozen:
        lines += [
            "",
            f"Frozen parameters / buffers ({', '.join((list(u.frozen) + list(u.buffers))[:4])}) are NOT "
            "restored by load_universal (only optimizer-tracked parameters are).",
        ]
        if not u.frozen_exported:
            lines.append(
                f"  Export them first: `ckpt-tui universal {u.tag_shown} --export-frozen` (writes {ff}; the "
                "universal checkpoint is not converted again)"
            )
        lines += ["  After engine.load_checkpoint(...) run:"]
        lines += ["    " + ln for ln in frozen_load_code(ff, "engine.module", zero3=stage == 3).splitlines()]
    if u.framework and "HF Trainer" in u.framework:
        lines += [
            "",
            "HF Trainer:",
            '  1. put "checkpoint": {"load_universal": true} into the DeepSpeed config you pass as '
            "TrainingArguments(deepspeed=...)",
            f"  2. trainer.train(resume_from_checkpoint={u.ckdir_code!r})",
            f"     the Trainer hands that folder to engine.load_checkpoint, which reads latest_universal; the "
            f"universal folder must stay inside it and its name must start with 'global_step' "
            f"({u.out_name!r}: {'ok' if u.out_name.startswith('global_step') else 'RENAME IT'}).",
            f"     trainer_state.json (step, epoch, log history) must sit in {u.ckdir_name}/ (it does); "
            "rng_state_<rank>.pth "
            "too (with a different world size, ranks without a file start from fresh RNG, with a warning); "
            "the LR scheduler rides in the DeepSpeed model states (scheduler.pt only without DeepSpeed's scheduler).",
        ]
        if has_frozen:
            lines += [
                "  3. before trainer.train(...), after building the model (from_pretrained of this checkpoint "
                "folder's model.safetensors also holds them, where it was saved):"
            ]
            lines += ["       " + ln for ln in frozen_load_code(ff, "model").splitlines()]
    elif u.framework and "Lightning" in u.framework:
        lines += [
            "",
            "Lightning:",
            '  1. Trainer(strategy=DeepSpeedStrategy(config={..., "checkpoint": {"load_universal": True}}), ...)',
            f"  2. trainer.fit(model, ckpt_path={u.ckdir_code!r})",
            "     Lightning hands that folder to engine.load_checkpoint, which reads latest_universal there; "
            "the loops/epoch state comes from the model-states file copied into the universal folder.",
        ]
        if has_frozen:
            lines += ["  3. before trainer.fit(...), on your LightningModule (names are relative to it):"]
            lines += ["       " + ln for ln in frozen_load_code(ff, "lightning_module").splitlines()]
    return "\n".join(lines)
