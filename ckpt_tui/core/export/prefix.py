"""Wrapper prefixes on tensor names: Lightning saves ``LightningModule.state_dict()``, whose names
start with the module's attributes (``model.model.embed_tokens.weight`` for ``self.model =
LlamaForCausalLM(...)``). Loaded as they are into the model itself, nothing matches.

The rule is conservative: a prefix is stripped by default only when the source is a Lightning
checkpoint (a ``.ckpt`` file or folder, or a DeepSpeed tag inside a ``.ckpt`` folder) and ALL its
names share one first component. A Hugging Face checkpoint whose names are ``model.layers...``
and ``lm_head.weight`` (or only ``model.*`` when the head is tied) is HF-style already: untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..formats.registry import format_of
from ..types import Node


@dataclass
class PrefixChoice:
    strip: Optional[str] = None  # the prefix removed from every name ("model."), if any
    lightning: bool = False  # the names are a LightningModule's state_dict names
    attributes: list[str] = field(default_factory=list)  # its top-level attributes, as found
    note: Optional[str] = None  # what was decided, said to the user

    @property
    def module_names(self) -> bool:
        """The output names are the LightningModule's own (nothing stripped): they load into it,
        not into the model it holds."""
        return self.lightning and self.strip is None


def composer_source(node: Node) -> bool:
    """composer's Trainer wrote ``node`` (``ep0-ba2-rank0.pt``): its model is ``state.model``, the ComposerModel's
    state dict, whose names start with its one attribute (``module.`` of a ComposerClassifier, ``model.`` of a
    HuggingFaceModel), stripped as a LightningModule's is."""
    return node.facts.get("weights_under") == "state.model"


def lightning_source(node: Node) -> bool:
    """Lightning wrote ``node``: a ``.ckpt`` file (its ``state_dict`` entry), a ``.ckpt`` folder
    (FSDP sharded: DCP + ``meta.pt``), or the DeepSpeed tag folder inside a ``.ckpt`` folder; or composer, whose
    ComposerModel wraps the model the same way (:func:`composer_source`)."""
    if node.abspath.name.endswith(".ckpt") or composer_source(node):
        return True
    return format_of(node).tag and node.abspath.parent.name.endswith(".ckpt")


def top_attributes(names: Iterable[str]) -> list[str]:
    """The distinct first components of ``names`` (a name without a dot counts as its own)."""
    return sorted({n.split(".", 1)[0] + ("." if "." in n else "") for n in names})


def common_prefix(names: Iterable[str]) -> Optional[str]:
    """``"model."`` when every name is ``model.<something>``; else None."""
    attrs = top_attributes(names)
    return attrs[0] if len(attrs) == 1 and attrs[0].endswith(".") else None


def choose(
    node: Node, names: list[str], *, strip_prefix: Optional[str] = None, keep_prefix: bool = False
) -> PrefixChoice:
    """Which prefix an export (and ``verify``) removes from ``node``'s tensor ``names``."""
    lightning = lightning_source(node)
    attrs = top_attributes(names) if lightning else []
    if strip_prefix:
        return PrefixChoice(strip_prefix, lightning, attrs)
    if not lightning:
        return PrefixChoice()
    one = common_prefix(names)
    shown = ", ".join(f"`{a}`" for a in attrs[:4]) + (" …" if len(attrs) > 4 else "")
    if one and keep_prefix:
        return PrefixChoice(
            None,
            True,
            attrs,
            f"kept the {_wrapper(node)} attribute prefix `{one}` (--keep-prefix): "
            f"the names load into the {_wrapper(node)} itself",
        )
    if one:
        return PrefixChoice(
            one,
            True,
            attrs,
            f"stripped the {_wrapper(node)} attribute prefix `{one}` from every name; --keep-prefix keeps it",
        )
    return PrefixChoice(
        None,
        True,
        attrs,
        f"the names start with the {_wrapper(node)}'s attributes ({shown}): "
        f"nothing stripped, they load into the {_wrapper(node)} itself "
        "(--strip-prefix P removes one)",
    )


def _wrapper(node: Node) -> str:
    return "ComposerModel" if composer_source(node) else "LightningModule"
