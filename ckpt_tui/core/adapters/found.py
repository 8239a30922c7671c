"""A LoRA adapter among a checkpoint's components: what it is, what it needs, and where its base is.

    info = adapter_info(report.inventory)     # None: the model component is not a LoRA adapter
    info.headline()                           # LoRA adapter (r=4, alpha=8, on q_proj, v_proj; 1.8K params)
                                              #   for `base-model` — found at `../base-model`

Reads the component's tensor names and shapes (headers only), ``adapter_config.json`` beside it or in its
run (:mod:`.config`), and looks for the base model on the local disk (:mod:`.base`). Never imports peft.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..safetext import visible
from ..storage import is_url
from ..types import Inventory, Node
from ..units import param_count
from .base import BaseLookup, find_base
from .config import CONFIG_NAME, AdapterConfigError, LoraConfig, read_lora_config
from .names import AdapterTensors, lora_layout

MAX_LISTED = 200_000  # tensors of a component read for names: an adapter has a few hundred to a few thousand


@dataclass
class AdapterInfo:
    node: Node  # the component holding the adapter's tensors
    layout: AdapterTensors
    params: int
    config: Optional[LoraConfig] = None
    config_error: Optional[str] = None  # adapter_config.json there but refused: why
    config_looked: list[Path] = field(default_factory=list)
    base: Optional[BaseLookup] = None
    cwd: Optional[Path] = None

    @property
    def rank(self) -> Optional[int]:
        """r as adapter_config.json says it, else as the tensors show it where every module agrees."""
        if self.config is not None:
            return self.config.r
        ranks = {m.rank for m in self.layout.modules}
        return ranks.pop() if len(ranks) == 1 else None

    def targets(self) -> str:
        """The target modules' own names (``q_proj, v_proj``), as the tensors show them: a config's list may be
        full module paths (PEFT saves ``all-linear`` expanded)."""
        return ", ".join(self.layout.targets()) or "?"

    def what(self) -> str:
        """``LoRA adapter (r=4, alpha=8, on q_proj, v_proj; 1.8K params)``."""
        bits = []
        r = self.rank
        bits.append(
            f"r={r}"
            if r is not None
            else "r=" + "/".join(str(x) for x in sorted({m.rank for m in self.layout.modules}))
        )
        if self.config is not None:
            a = self.config.lora_alpha
            bits.append(f"alpha={int(a) if float(a).is_integer() else a}")
            if self.config.use_rslora:
                bits.append("rslora")
        inner = ", ".join(bits) + f", on {visible(self.targets())}"
        if self.layout.modules_to_save:
            inner += f"; saves {', '.join(visible(n.rsplit('.', 1)[0]) for n in list(self.layout.modules_to_save)[:3])}"
        return f"LoRA adapter ({inner}; {param_count(self.params)} params)"

    def base_text(self) -> str:
        """`` for `base-model` — found at `../base-model` `` and its two other forms."""
        if self.config is None:
            why = self.config_error or f"no {CONFIG_NAME} beside it or in its run"
            return f"; {visible(why)}: pass `--adapter-config PATH`"
        b = self.base
        if b is None or b.recorded is None:
            return " — base not recorded (`base_model_name_or_path` is null): pass `--base PATH`"
        name = visible(b.recorded)
        if b.found is not None:
            return f" for `{name}` — found at `{visible(self.shown(b.found))}`"
        return f" for `{name}` — not found: pass `--base PATH`"

    def headline(self) -> str:
        return self.what() + self.base_text()

    def shown(self, p: Path) -> str:
        """A found path as the user can type it from where they are: relative where that is shorter, else absolute."""
        if self.cwd is None:
            return str(p)
        try:
            rel = os.path.relpath(p, self.cwd)
        except ValueError:
            return str(p)
        return rel if len(rel) < len(str(p)) else str(p)  # ../base-model, not ../../../../tmp/x/base-model


def _names(node: Node, inv: Inventory) -> Optional[dict[str, tuple[int, ...]]]:
    from ..formats import FormatError
    from ..tensors import list_tensors

    out: dict[str, tuple[int, ...]] = {}
    try:
        for t in list_tensors(node, inv.parsed):
            out[t.name] = tuple(t.shape)
            if len(out) > MAX_LISTED:
                return None
    except (FormatError, OSError, ValueError):
        return None
    return out


def config_places(node: Node) -> list[Path]:
    """Where an adapter's ``adapter_config.json`` may be: beside the component, in its checkpoint, in the run."""
    here = Path(str(node.abspath))  # a local node (adapter_info takes no object storage)
    p = here if node.is_dir else here.parent
    places = [p, p.parent]
    if p.name.startswith("checkpoint-") or p.parent.name.startswith("checkpoint-"):
        places.append(p.parent.parent if p.parent.name.startswith("checkpoint-") else p.parent)
    out: list[Path] = []
    for d in places:
        if d not in out:
            out.append(d)
    return out


def adapter_info(
    inv: Inventory,
    node: Optional[Node] = None,
    *,
    cwd: Optional[Path] = None,
    config_path: Optional[Path] = None,
) -> Optional[AdapterInfo]:
    """The LoRA adapter held by ``node`` (default: the inventory's model component, of its newest checkpoint
    in a run folder), or None where it holds no LoRA tensors or also holds a whole model's."""
    if node is None:
        node = inv.model_node()
        if node is None and inv.layout == "run-folder" and inv.checkpoints:
            node = inv.model_node(inv.checkpoints[0]["path"])
    if node is None or is_url(node.abspath):
        return None
    count = node.facts.get("tensor_count")
    if isinstance(count, int) and count > MAX_LISTED:
        return None  # a whole model's worth of tensors: not listed at every inspect to find it is no adapter
    shapes = _names(node, inv)
    if not shapes:
        return None
    layout = lora_layout(shapes)
    if layout is None or not layout.modules or layout.others:
        return None
    info = AdapterInfo(node, layout, layout.params(), cwd=cwd if cwd is not None else Path.cwd())
    places = [config_path] if config_path is not None else [d / CONFIG_NAME for d in config_places(node)]
    info.config_looked = places
    for c in places:
        if not os.path.lexists(c):
            continue
        try:
            info.config = read_lora_config(c)
        except AdapterConfigError as e:
            info.config_error = str(e)
        break
    if info.config is not None:
        ck = config_places(node)[0]  # the folder holding the component; a tag's or DCP folder's: its checkpoint
        if not ck.name.startswith("checkpoint-") and ck.parent.name.startswith("checkpoint-"):
            ck = ck.parent
        info.base = find_base(
            info.config.base_model_name_or_path,
            checkpoint=ck,
            run=ck.parent,
            cwd=info.cwd,
            revision=info.config.revision,
        )
    return info
