"""How to load / resume from a universal checkpoint: DeepSpeed, HF Trainer, Lightning, and the code
that loads the exported frozen parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .plan import UniversalPlan


def frozen_load_code(frozen_file, target: str = "engine.module", zero3: bool = False) -> str:
    """Python that loads ``frozen_file`` into ``target`` (an nn.Module expression)."""
    code = (f"from safetensors.torch import load_file\n"
            f"frozen = load_file({str(frozen_file)!r})\n")
    if zero3:
        code += (f"import deepspeed\n"
                 f"params = [p for n, p in {target}.named_parameters() if n in frozen]\n"
                 f"with deepspeed.zero.GatheredParameters(params, modifier_rank=0):\n"
                 f"    missing, unexpected = {target}.load_state_dict(frozen, strict=False)\n")
    else:
        code += f"missing, unexpected = {target}.load_state_dict(frozen, strict=False)\n"
    code += "assert not unexpected, unexpected\n"
    return code


def instructions(plan: UniversalPlan, frozen_file: Optional[Path] = None) -> str:
    out = plan.out
    ckdir = out.parent
    stage = plan.stage
    ff = frozen_file or plan.frozen_file
    lines = [f"Universal checkpoint: {out}  (latest_universal in {ckdir} names {out.name!r})",
             "",
             "DeepSpeed: add to the DeepSpeed config (any world size; keep ZeRO-"
             + ("1/2" if stage <= 2 else "3") + "):",
             '  "checkpoint": {"load_universal": true}',
             "then, after deepspeed.initialize(...):",
             f"  load_path, client_state = engine.load_checkpoint({str(ckdir)!r})",
             f"  # engine.global_steps == {plan.global_step}"]
    has_frozen = bool(plan.frozen or plan.buffers)
    if has_frozen:
        lines += ["", f"Frozen parameters / buffers ({', '.join((plan.frozen + plan.buffers)[:4])}) are NOT restored by "
                  "load_universal (only optimizer-tracked parameters are)."]
        if frozen_file is None:
            lines.append(f"  Export them first: ckpt-tui universal ... --export-frozen (writes {ff})")
        lines += ["  After engine.load_checkpoint(...) run:"]
        lines += ["    " + ln for ln in frozen_load_code(ff, "engine.module", zero3=stage == 3).splitlines()]
    if plan.framework and "HF Trainer" in plan.framework:
        lines += ["", "HF Trainer:",
                  '  1. put "checkpoint": {"load_universal": true} into the DeepSpeed config you pass as '
                  "TrainingArguments(deepspeed=...)",
                  f"  2. trainer.train(resume_from_checkpoint={str(ckdir)!r})",
                  f"     the Trainer hands that folder to engine.load_checkpoint, which reads latest_universal; the "
                  f"universal folder must stay inside it and its name must start with 'global_step' "
                  f"({out.name!r}: {'ok' if out.name.startswith('global_step') else 'RENAME IT'}).",
                  f"     trainer_state.json (step, epoch, log history) must sit in {ckdir.name}/ (it does); rng_state_<rank>.pth "
                  "too (with a different world size, ranks without a file start from fresh RNG, with a warning); "
                  "the LR scheduler rides in the DeepSpeed model states (scheduler.pt only without DeepSpeed's scheduler)."]
        if has_frozen:
            lines += ["  3. before trainer.train(...), after building the model (from_pretrained of this checkpoint "
                      "folder's model.safetensors also holds them, where it was saved):"]
            lines += ["       " + ln for ln in frozen_load_code(ff, "model").splitlines()]
    elif plan.framework and "Lightning" in plan.framework:
        lines += ["", "Lightning:",
                  '  1. Trainer(strategy=DeepSpeedStrategy(config={..., "checkpoint": {"load_universal": True}}), ...)',
                  f"  2. trainer.fit(model, ckpt_path={str(ckdir)!r})",
                  "     Lightning hands that folder to engine.load_checkpoint, which reads latest_universal there; "
                  "the loops/epoch state comes from the model-states file copied into the universal folder."]
        if has_frozen:
            lines += ["  3. before trainer.fit(...), on your LightningModule (names are relative to it):"]
            lines += ["       " + ln for ln in frozen_load_code(ff, "lightning_module").splitlines()]
    return "\n".join(lines)
