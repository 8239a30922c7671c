"""Plan a DeepSpeed -> torch DCP conversion: resolve SRC to a ZeRO tag folder, describe every tensor
the output will hold (the fp32 masters as the model's parameters, buffers, exp_avg/exp_avg_sq and a
per-parameter step for the optimizer), the optimizer class and its hyper-parameters, the files carried
over as they are (``scheduler.pt``, ``rng_state_*.pth``) and what does not carry over. Writes nothing."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union, cast

from ...export.sources import SourceTensor
from ...export.write import ExportError
from ...formats.registry import format_of
from ...fsutil import OutputError, preflight_output, regular_inside
from ...jsondoc import as_json
from ...leftovers import TORCH_DCP_TEMP
from ...staging import refusal
from ...types import Plan, PlanStep, in_user_form
from ..common import TagPlan, resolve_tag

TMP_PREFIX = TORCH_DCP_TEMP  # inspect lists a killed run's as a leftover by the same name (core/leftovers.py)
NOTE_FILE = "conversion.json"  # what was carried over and what was not, beside the DCP files
CARRIED_RE = re.compile(r"^(scheduler\.pt|rng_state(_\d+)?\.pth)$")
# torch.optim.AdamW hyper-parameters a DeepSpeed param group may hold under the same name and meaning
HYPER = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")


class TorchDcpError(ExportError):
    """The conversion cannot run or failed; the message says why and what to do."""


@dataclass
class OptimTensor:
    """One tensor of the optimizer state: parameter ``fqn``'s ``key`` (exp_avg, exp_avg_sq)."""

    fqn: str
    key: str
    source: SourceTensor


@dataclass
class TorchDcpPlan(TagPlan):
    json_keys = (
        "src",
        "tag_dir",
        "out",
        "zero_stage=stage",
        "world_size",
        "global_step",
        "framework",
        "optimizer_class",
        "hyper",
        "train_dtype",
        "strip_prefix",
        "carried",
        "not_carried",
        "warnings",
    )

    model: list[SourceTensor]  # names already final (prefix stripped); tied aliases have tied_to
    optim: list[OptimTensor]
    param_groups: list[dict[str, Any]]  # torch's param_group form: hyper-parameters + "params": [fqn]
    steps: dict[str, Any]  # fqn -> the optimizer step of its group
    optimizer_class: str  # "AdamW" | "Adam"
    hyper: dict[str, Any]  # the constructor arguments the load code passes
    train_dtype: Optional[str]
    strip_prefix: Optional[str]
    carried: list[Path]  # files copied as they are into the output
    not_carried: list[str]
    estimated_bytes: int
    warnings: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    given: str = ""

    def shown(self, p: object) -> str:
        return in_user_form(self.given, p)

    def to_plan(self) -> Plan:
        sh = self.shown
        n_params = sum(1 for t in self.model if not t.tied_to)
        steps = [
            PlanStep(
                "mkdir", sh(self.out.parent / f"{TMP_PREFIX}XXXX"), detail="private temp folder beside the output"
            ),
            PlanStep(
                "write",
                sh(self.out.parent / f"{TMP_PREFIX}XXXX"),
                source=sh(self.tag_dir),
                bytes=self.estimated_bytes,
                detail=f"torch.distributed.checkpoint: model ({n_params} tensors, fp32 masters) + optimizer "
                f"({len(self.optim)} state tensors, {self.optimizer_class}) + step {self.global_step}",
            ),
        ]
        for f in self.carried:
            steps.append(PlanStep("copy", f.name, source=sh(f), bytes=f.stat().st_size if f.exists() else 0))
        steps += [
            PlanStep("write", NOTE_FILE, detail="what carried over and what did not"),
            PlanStep("run", "verify", detail="every tensor read back with torch's dcp.load, bit-exact vs the source"),
            PlanStep("replace", sh(self.out), detail="os.replace of the verified folder"),
        ]
        notes = [f"source {sh(self.tag_dir)} (ZeRO-{self.stage}, {self.world_size} ranks) is only read, never modified"]
        notes += [f"not carried over: {x}" for x in self.not_carried]
        notes += self.warnings
        return Plan(
            f"Convert {sh(self.tag_dir)} to a torch.distributed.checkpoint for FSDP2/DDP in {sh(self.out)}",
            tuple(steps),
            tuple(notes),
        )

    def to_json(self) -> dict[str, Any]:
        return as_json(self, self.json_keys) | {
            "tensors": len(self.model),
            "optimizer_tensors": len(self.optim),
            "carried": [str(p) for p in self.carried],
            "plan": self.to_plan().to_json(),
        }


def default_out(tag_dir: Path) -> Path:
    """Where the conversion goes unless told: ``<run>-<checkpoint>-torch-dcp/`` beside the folder
    that holds the checkpoint (``run/checkpoint-2/global_step2`` -> ``run-checkpoint-2-torch-dcp``):
    outside the run, where a torch checkpoint among DeepSpeed ones would change how ckpt-tui (and
    the user) reads the run folder."""
    ck = Path(tag_dir).parent
    run = ck.parent
    name = ck.name[: -len(".ckpt")] if ck.name.endswith(".ckpt") else ck.name
    if run.parent == run:  # the checkpoint sits at the filesystem's root
        return ck.parent / f"{name}-torch-dcp"
    return run.parent / f"{run.name}-{name}-torch-dcp"


def _optimizer_class(cfg: Optional[dict[str, Any]]) -> tuple[str, list[str]]:
    """torch's class that DeepSpeed's optimizer config amounts to, and warnings."""
    if not isinstance(cfg, dict):
        return "AdamW", [
            "the DeepSpeed config names no optimizer (a client optimizer?): its state is carried as "
            "torch.optim.AdamW's; check that this is the update rule the run used"
        ]
    typ = str(cfg.get("type", "")).lower()
    params_obj = cfg.get("params")
    params: dict[str, Any] = params_obj if isinstance(params_obj, dict) else {}
    warn = []
    if typ not in ("adam", "adamw"):
        raise TorchDcpError(
            f"the run's optimizer is {cfg.get('type')!r}: only Adam/AdamW state maps onto torch.optim.AdamW/Adam"
        )
    if params.get("bias_correction") is False:
        raise TorchDcpError(
            "the run's Adam has bias_correction: false; torch's Adam/AdamW always correct the bias, "
            "so the resumed run would update differently"
        )
    # DeepSpeed: type AdamW, or Adam with adam_w_mode (default true), is decoupled weight decay (torch AdamW)
    adamw = typ == "adamw" or params.get("adam_w_mode", True) is not False
    if not params.get("torch_adam"):
        warn.append(
            "the run used DeepSpeed's own Adam kernel (FusedAdam/DeepSpeedCPUAdam), not torch's: the same "
            "update rule, but not bit-identical arithmetic"
        )
    return ("AdamW" if adamw else "Adam"), warn


def _torch_group_defaults(cls: str) -> dict[str, Any]:
    """The param_group keys and default values of torch's ``cls`` in this torch (what get_state_dict
    would save and dcp.load will look for)."""
    import torch

    p = torch.nn.Parameter(torch.zeros(1))
    return {k: v for k, v in getattr(torch.optim, cls)([p]).param_groups[0].items() if k != "params"}


def torch_dcp_plan(
    src: Union[str, os.PathLike[str]],
    out: Union[str, os.PathLike[str], None] = None,
    *,
    tag: Optional[str] = None,
    trust_pickles: bool = False,
    strip_prefix: Optional[str] = None,
    keep_prefix: bool = False,
) -> TorchDcpPlan:
    """Resolve SRC to a DeepSpeed ZeRO tag and say what converting it to torch DCP in ``out`` will
    write. Raises ``ScanError`` for an unreadable path, :class:`TorchDcpError` where it cannot convert."""
    from ...export import prefix as prefixes
    from ...formats.deepspeed.optim import deepspeed_optimizer_source
    from ...formats.deepspeed.zero import deepspeed_source, open_zero_tag

    src = Path(src)
    rep, node, said = resolve_tag(src, tag, trust_pickles, TorchDcpError)
    inv = rep.inventory
    if node is None or not format_of(node).tag:
        raise TorchDcpError(
            f"{src} is not a DeepSpeed ZeRO checkpoint ({inv.summary}); --to torch-dcp converts a "
            "DeepSpeed tag folder (global_stepN/ with *_optim_states.pt files), or the checkpoint "
            "folder holding one"
        )
    tag_dir = cast(Path, node.abspath)  # SRC is a local Path (above): so are the scan's nodes
    errs = [x for x in rep.findings if x.severity == "error" and node.contains(x.path) and x.code != "unsafe-pickle"]
    if errs:
        raise TorchDcpError(
            f"{tag_dir} has errors and cannot be converted: "
            + "; ".join(f"{x.code} {x.path}: {x.message}" for x in errs[:4])
        )
    try:
        zt = open_zero_tag(tag_dir)
        model_src = deepspeed_source(tag_dir)
        opt_src, config, names = deepspeed_optimizer_source(tag_dir)
    except ValueError as e:
        raise TorchDcpError(f"{tag_dir}: {e}") from None
    if zt.stage not in (1, 2, 3):
        raise TorchDcpError(f"unsupported ZeRO stage {zt.stage!r} in {tag_dir} (ZeRO-1/2/3 only)")
    ms = zt.model_states
    if (ms.get("mp_world_size") or 1) > 1:
        raise TorchDcpError(f"model-parallel checkpoints (mp_world_size={ms.get('mp_world_size')}) are not supported")

    choice = prefixes.choose(node, names, strip_prefix=strip_prefix, keep_prefix=keep_prefix)
    strip = choice.strip

    def fqn(n: str) -> str:
        return n[len(strip) :] if strip and n.startswith(strip) else n

    model: list[SourceTensor] = []
    for t in model_src.tensors:
        t.name = fqn(t.name)
        if t.tied_to:
            t.tied_to = fqn(t.tied_to)
        model.append(t)
    optim: list[OptimTensor] = []
    for t in opt_src.tensors:
        base, _, key = t.name.rpartition(".")
        if key in ("exp_avg", "exp_avg_sq"):
            optim.append(OptimTensor(fqn(base), key, t))

    cls, warnings = _optimizer_class(config.get("optimizer"))
    defaults = _torch_group_defaults(cls)
    groups: list[dict[str, Any]] = []
    steps: dict[str, Any] = {}
    opt_obj = config.get("optimizer")
    opt_cfg: dict[str, Any] = opt_obj if isinstance(opt_obj, dict) else {}
    ds_params_obj = opt_cfg.get("params")
    ds_params: dict[str, Any] = ds_params_obj if isinstance(ds_params_obj, dict) else {}
    defaulted: list[str] = []
    for g in config["param_groups"]:
        step = g.get("step")
        if step is None:
            raise TorchDcpError(
                f"{tag_dir}: no optimizer step recorded for the group of {g['params'][:1]} "
                "(saved before the first step?)"
            )
        group = dict(defaults)
        for k in HYPER:
            v = g.get(k, ds_params.get(k))  # the saved param group's, else the DeepSpeed config's
            if v is not None and k in group:
                group[k] = tuple(v) if k == "betas" else v
            elif k in ("lr", "betas", "eps", "weight_decay") and not defaulted.count(k):
                defaulted.append(k)
        group["params"] = [fqn(n) for n in g["params"]]
        groups.append(group)
        for n in group["params"]:
            steps[n] = step
    if defaulted:
        warnings.append(
            f"neither the checkpoint nor its DeepSpeed config records {', '.join(defaulted)}: torch's "
            "defaults were written; pass the run's values to the optimizer and check them after loading"
        )
    hyper: dict[str, Any] = {
        k: groups[0][k] for k in ("lr", "betas", "eps", "weight_decay") if groups and k in groups[0]
    }
    if len(groups) > 1:
        warnings.append(
            f"the run had {len(groups)} param groups: build the optimizer with the same groups "
            "(the hyper-parameters of each are restored from the checkpoint)"
        )

    train_dtype = zt.train_dtype
    not_carried: list[str] = []
    if train_dtype in ("bfloat16", "float16"):
        not_carried.append(
            f"the {'bf16' if train_dtype == 'bfloat16' else 'fp16'} module weights: the fp32 masters "
            "are carried instead, as the parameters (an FSDP2 run keeps fp32 parameters; train in "
            f"{'bf16' if train_dtype == 'bfloat16' else 'fp16'} with fully_shard(mp_policy="
            "MixedPrecisionPolicy(param_dtype=...)))"
        )
    if ms.get("lr_scheduler") is not None:
        not_carried.append(
            "DeepSpeed's LR scheduler state (lr_scheduler in the model states): not a torch "
            "scheduler; rebuild it and set it to the step"
        )
    if train_dtype == "float16":
        not_carried.append("the fp16 loss scaler state")
    if model_src.tensors and any(t.frozen for t in model_src.tensors):
        not_carried.append("optimizer state of frozen parameters (they have none; their weights are carried)")
    not_carried.append(
        "DeepSpeed's engine counters (global_samples, skipped_steps) and client state "
        "(a Lightning/Trainer loop state, the data sampler)"
    )
    carried: list[Path] = []
    ck = tag_dir.parent
    for f in sorted(ck.iterdir()) if ck.is_dir() else []:
        if f.is_file() and CARRIED_RE.match(f.name):
            why = regular_inside(f, ck)
            if why is None:
                carried.append(f)
            else:  # never copied out of the checkpoint through a link
                not_carried.append(f"{f.name}: {why}, so it was not copied")
    if any(f.name.startswith("rng_state") for f in carried):
        warnings.append(
            f"rng_state_*.pth are per rank of the {zt.world}-rank run: copied as they are; at another "
            "world size ranks without a file start from fresh RNG state"
        )
    if not any(f.name.startswith("rng_state") for f in carried):
        not_carried.append("RNG state (the checkpoint holds none in torch form)")
    if choice.note:
        said.append(choice.note)

    estimated = sum(t.source.nbytes for t in optim) + sum(t.nbytes for t in model if not t.tied_to)
    if out is None:
        out = default_out(tag_dir)
    out = Path(os.path.abspath(out))
    try:
        preflight_output(out, need=2 * estimated, source=tag_dir.parent)
    except OutputError as e:
        raise TorchDcpError(output_refusal(e, out, tag_dir)) from None
    return TorchDcpPlan(
        src=src,
        tag_dir=tag_dir,
        out=out,
        stage=zt.stage,
        world_size=zt.world,
        global_step=ms.get("global_steps") if isinstance(ms.get("global_steps"), int) else None,
        framework=inv.framework,
        model=model,
        optim=optim,
        param_groups=groups,
        steps=steps,
        optimizer_class=cls,
        hyper=hyper,
        train_dtype=train_dtype,
        strip_prefix=strip,
        carried=carried,
        not_carried=not_carried,
        estimated_bytes=estimated,
        warnings=warnings,
        said=said,
        given=os.fspath(src),
    )


def output_refusal(e: OutputError, out: Path, tag_dir: Path) -> str:
    return refusal(e, "torch-dcp")
