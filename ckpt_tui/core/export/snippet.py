"""The "Load it with" code an export prints: the one form that loads this output, with no missing or
unexpected key, into the model it came from. Both faces (CLI, TUI) print this text.

- ``from_pretrained`` only when the output has a ``config.json`` naming an architecture and the
  names are HF-style: no wrapper prefix (``module.``, ``_orig_mod.`` …) and not a LightningModule's
  own names (those load into the LightningModule, not into the model it holds);
- otherwise ``model.load_state_dict(sd, strict=True)`` over every output file (one file, or the
  shards an index lists), with each tied alias the export wrote once put back under its own name
  (a plain ``load_state_dict`` of the file would miss it).
"""

from __future__ import annotations

import json
import re
from typing import Optional

from ..storage import as_path
from ..types import user_path
from .plan import ExportPlan
from .prefix import PrefixChoice

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def _architecture(plan: ExportPlan) -> Optional[str]:
    """The first ``architectures`` entry of the config.json the export writes (copied, or written: a merge's
    base config), if it is one."""
    raw: Optional[bytes] = next((text.encode() for name, text in plan.extra_files if name == "config.json"), None)
    try:
        if raw is None:
            src = next((src for src, name in plan.copies if name == "config.json"), None)
            if src is None:
                return None
            raw = as_path(src).read_bytes()
        arch = (json.loads(raw).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return arch if isinstance(arch, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", arch) else None


def _adapter_snippet(plan: ExportPlan, out: str) -> str:
    """A PEFT adapter folder: the base model, then the adapter on it (``PeftModel.from_pretrained``)."""
    base = plan.load_base
    lines = ["from peft import PeftModel", "from transformers import AutoModelForCausalLM", ""]
    if base is None:
        lines.append("base = AutoModelForCausalLM.from_pretrained(BASE)  # BASE: the base model's folder or hub id")
    else:
        lines.append(f"base = AutoModelForCausalLM.from_pretrained({base!r})")
    if plan.load_vocab is not None:
        lines.append(
            f"base.resize_token_embeddings({plan.load_vocab})  # the run added tokens: the adapter's embedding"
        )
    lines.append(f"model = PeftModel.from_pretrained(base, {out!r})")
    return "\n".join(lines)


def hf_style(names: list[str], prefix: Optional[PrefixChoice]) -> bool:
    """Names a transformers model's ``state_dict()`` has: no wrapper prefix, and not the names of a
    LightningModule (whose first components are its own attributes)."""
    if prefix is not None and prefix.module_names:
        return False
    return bool(names) and not any(n.startswith(WRAPPER_PREFIXES) for n in names)


def _model_comment(prefix: Optional[PrefixChoice]) -> str:
    if prefix is not None and prefix.lightning and prefix.strip:
        attr = prefix.strip.rstrip(".")
        return (
            f"# `model` is your model: what your LightningModule holds as `self.{attr}` "
            f"(the `{prefix.strip}` prefix was stripped)"
        )
    if prefix is not None and prefix.module_names:
        attrs = ", ".join(f"`{a}`" for a in prefix.attributes[:4])
        return f"# `model` is your LightningModule (the names start with its attributes: {attrs})"
    return "# `model` is your model, built as in training (the exported names are its state_dict() names)"


def load_snippet(plan: ExportPlan, given: Optional[str] = None) -> str:
    """Python code that loads the output of ``plan``; the output folder is spelt as the user gave it
    (``given``: relative stays relative)."""
    out = user_path(given if given is not None else (plan.out_given or str(plan.out)))
    if plan.stem == "optimizer":
        return _optimizer_snippet(plan, out)
    if plan.stem == "adapter_model":
        return _adapter_snippet(plan, out)
    names = [t.name for f in plan.files for t in f.tensors]
    arch = _architecture(plan)
    frozen = len(plan.excluded)
    if arch and hf_style(names, plan.prefix):
        cls = "AutoModelForCausalLM" if arch.endswith("ForCausalLM") else arch
        lines = [f"from transformers import {cls}", f"model = {cls}.from_pretrained({out!r})"]
        if frozen:
            lines.append(f"# --exclude-frozen left out {frozen} frozen tensor(s): from_pretrained initialises them")
        return "\n".join(lines)
    lines = ["import json"] if plan.index else []
    lines += ["from safetensors.torch import load_file", "", _model_comment(plan.prefix), f"out = {out!r}"]
    lines += _load_sd(plan)
    written = set(names)
    for alias, target in plan.dropped_tied:
        if target in written:
            lines.append(f"sd[{alias!r}] = sd[{target!r}]  # tied: the export wrote it once")
    if frozen:
        lines.append(f"# --exclude-frozen left out {frozen} frozen tensor(s): they keep the values `model` has")
        lines.append("missing, unexpected = model.load_state_dict(sd, strict=False)")
        lines.append("assert not unexpected, unexpected")
    else:
        lines.append("model.load_state_dict(sd, strict=True)")
    return "\n".join(lines)


def _load_sd(plan: ExportPlan) -> list[str]:
    """Lines that read every tensor of the output into ``sd`` (``out`` names the folder): the one file, or
    each shard its index names."""
    if plan.index:
        return [
            f'with open(f"{{out}}/{plan.index_name}") as f:',
            '    shards = sorted(set(json.load(f)["weight_map"].values()))',
            "sd = {}",
            "for shard in shards:",
            '    sd.update(load_file(f"{out}/{shard}"))',
        ]
    return [f'sd = load_file(f"{{out}}/{plan.files[0].name}")']


def _optimizer_snippet(plan: ExportPlan, out: str) -> str:
    """An optimizer export: its tensors by parameter name, and its step and param groups."""
    lines = ["import json", "from safetensors.torch import load_file", "", f"out = {out!r}"]
    lines += _load_sd(plan)
    extra = [name for name, _ in plan.extra_files]
    if extra:
        lines += [
            f'with open(f"{{out}}/{extra[0]}") as f:',
            "    config = json.load(f)  # step, param_groups (lr, betas, eps, weight_decay, params)",
        ]
    lines.append(
        '# per parameter name p: sd[f"{p}.exp_avg"], sd[f"{p}.exp_avg_sq"] (and sd[f"{p}.master"], the fp32 '
        "master, where the run kept one)"
    )
    return "\n".join(lines)
