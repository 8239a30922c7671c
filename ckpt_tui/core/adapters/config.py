"""``adapter_config.json``, read as data: the LoRA hyper-parameters an adapter export copies and a merge uses.

    cfg = read_lora_config(Path("checkpoint-2/adapter_config.json"))   # LoraConfig, or AdapterConfigError
    cfg.scale("model.layers.0.self_attn.q_proj")                      # lora_alpha / r (rank/alpha_pattern)
    cfg.unsupported_for_merge()                                        # the variants a merge refuses

Never imports peft. The file is someone's: bounded in size, every field type-checked, nothing from it is
evaluated.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

CONFIG_NAME = "adapter_config.json"
# what the tensors of an adapter cannot tell, and a PEFT adapter folder needs (adapter_config.json's keys)
UNREADABLE = ("lora_alpha", "use_rslora", "fan_in_fan_out", "lora_bias", "base_model_name_or_path")
MAX_CONFIG_BYTES = 4 << 20  # adapter_config.json files are a few kB; larger is not one

# adapter_config.json keys that select a LoRA variant (peft 0.21 LoraConfig fields with ``is_lora_variant``), or
# a structure a plain ``W + B @ A * s`` merge does not cover: a merge refuses them, naming the key
VARIANT_KEYS = (
    "use_dora",
    "velora_config",
    "alora_invocation_tokens",
    "monteclora_config",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "target_parameters",
    "trainable_token_indices",
    "layer_replication",
    "use_qalora",
)
# init_lora_weights values that make a variant (peft's ``lora_variants``: "mica")
VARIANT_INITS = ("mica",)


class AdapterConfigError(ValueError):
    """adapter_config.json is missing, unreadable or not a LoRA config; the message says which."""


@dataclass
class LoraConfig:
    r: int
    lora_alpha: float
    target_modules: Optional[list[str] | str] = None  # a list of suffixes, or a regex (PEFT's two forms)
    use_rslora: bool = False
    fan_in_fan_out: bool = False
    lora_bias: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    modules_to_save: list[str] = field(default_factory=list)
    base_model_name_or_path: Optional[str] = None
    revision: Optional[str] = None
    raw: dict[str, Any] = field(default_factory=dict)  # the whole document, as read
    path: Optional[Path] = None

    def _pattern_value(self, patterns: dict[str, Any], module: str) -> Any:
        """PEFT's lookup (``peft.utils.other.get_pattern_key``): a key matches a module name by
        ``re.match(rf"(.*\\.)?({key})$", name)``; the first key in the dict that matches wins."""
        for key, value in patterns.items():
            if re.match(rf"(.*\.)?({key})$", module):
                return value
        return None

    def rank(self, module: str) -> int:
        v = self._pattern_value(self.rank_pattern, module)
        return int(v) if v is not None else self.r

    def alpha(self, module: str) -> float:
        v = self._pattern_value(self.alpha_pattern, module)
        return float(v) if v is not None else float(self.lora_alpha)

    def scale(self, module: str) -> float:
        """The LoRA scaling of ``module`` as PEFT computes it (``LoraLayer.update_layer``):
        ``alpha / r``, or ``alpha / sqrt(r)`` with ``use_rslora`` — a Python float."""
        r, a = self.rank(module), self.alpha(module)
        return a / math.sqrt(r) if self.use_rslora else a / r

    def targets_shown(self) -> str:
        """``q_proj, v_proj`` (a list) or the regex as written."""
        t = self.target_modules
        if t is None:
            return "?"
        return t if isinstance(t, str) else ", ".join(sorted(t))

    def unsupported_for_merge(self) -> list[str]:
        """The keys of this config that a plain LoRA merge does not cover (empty: it can merge)."""
        out = []
        for k in VARIANT_KEYS:
            v = self.raw.get(k)
            if v not in (None, False, [], {}, 0, ""):
                out.append(k)
        init = self.raw.get("init_lora_weights")
        if isinstance(init, str) and any(init.startswith(v) for v in VARIANT_INITS):
            out.append(f"init_lora_weights={init}")
        return out


def _typed(doc: dict[str, Any], key: str, types: tuple[type, ...], default: Any) -> Any:
    v = doc.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in types:
        raise AdapterConfigError(f"{CONFIG_NAME}: `{key}` is {v!r}, not a {types[0].__name__}")
    if not isinstance(v, types):
        raise AdapterConfigError(f"{CONFIG_NAME}: `{key}` is a {type(v).__name__}, not a {types[0].__name__}")
    return v


def parse_lora_config(doc: Any, path: Optional[Path] = None) -> LoraConfig:
    """A parsed ``adapter_config.json`` document (a dict), checked field by field."""
    if not isinstance(doc, dict):
        raise AdapterConfigError(f"{CONFIG_NAME} is not a JSON object")
    peft_type = doc.get("peft_type")
    if peft_type not in (None, "LORA"):
        raise AdapterConfigError(f"{CONFIG_NAME}: peft_type is {str(peft_type)[:40]!r}; only LoRA adapters are read")
    r = _typed(doc, "r", (int,), None)
    if r is None or r <= 0:
        raise AdapterConfigError(f"{CONFIG_NAME}: `r` is missing or not a positive integer")
    alpha = _typed(doc, "lora_alpha", (int, float), 8)
    targets = doc.get("target_modules")
    if targets is not None and not (
        isinstance(targets, str) or (isinstance(targets, list) and all(isinstance(t, str) for t in targets))
    ):
        raise AdapterConfigError(f"{CONFIG_NAME}: `target_modules` is neither a list of names nor a regex")
    rank_pattern = _typed(doc, "rank_pattern", (dict,), {})
    alpha_pattern = _typed(doc, "alpha_pattern", (dict,), {})
    for name, pat, types in (("rank_pattern", rank_pattern, (int,)), ("alpha_pattern", alpha_pattern, (int, float))):
        for k, v in pat.items():
            if isinstance(v, bool) or not isinstance(v, types) or v <= 0:
                raise AdapterConfigError(f"{CONFIG_NAME}: `{name}` value for {k[:40]!r} is not a positive number")
            try:
                re.compile(k)
            except re.error:
                raise AdapterConfigError(
                    f"{CONFIG_NAME}: `{name}` key {k[:40]!r} is not a regular expression"
                ) from None
    mts = _typed(doc, "modules_to_save", (list,), [])
    if not all(isinstance(m, str) for m in mts):
        raise AdapterConfigError(f"{CONFIG_NAME}: `modules_to_save` is not a list of names")
    bias = doc.get("bias", "none")
    if bias not in (None, "none"):
        raise AdapterConfigError(f"{CONFIG_NAME}: bias={str(bias)[:20]!r} trains the base biases; not supported")
    base = doc.get("base_model_name_or_path")
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=targets,
        use_rslora=bool(_typed(doc, "use_rslora", (bool,), False)),
        fan_in_fan_out=bool(_typed(doc, "fan_in_fan_out", (bool,), False)),
        lora_bias=bool(_typed(doc, "lora_bias", (bool,), False)),
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        modules_to_save=list(mts),
        base_model_name_or_path=base if isinstance(base, str) and base else None,
        revision=doc.get("revision") if isinstance(doc.get("revision"), str) else None,
        raw=doc,
        path=path,
    )


def read_lora_config(path: Path) -> LoraConfig:
    """Read and check ``path`` (an adapter_config.json); AdapterConfigError says what is wrong."""
    try:
        if path.is_symlink():
            raise AdapterConfigError(f"{path}: a symbolic link; not followed")
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise AdapterConfigError(f"{path}: {size} bytes is larger than an adapter config can be")
        doc = json.loads(path.read_bytes())
    except OSError as e:
        raise AdapterConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterConfigError(f"{path}: not valid JSON ({e})") from None
    return parse_lora_config(doc, path)
