"""LoRA tensors among a checkpoint's tensor names, and the names PEFT saves them under.

    layout = lora_layout({name: shape for name, shape in ...})   # AdapterTensors, or None: no LoRA here
    layout.saved        # source name -> the name in adapter_model.safetensors (get_peft_model_state_dict's)
    layout.modules      # LoraModule per LoRA layer: its base module, rank, A/B (and lora_B.bias) names
    layout.problems     # why an export would be wrong: an unpaired A or B, ranks that disagree, ...

Where a LoRA run leaves its tensors, and what PEFT 0.21's ``get_peft_model_state_dict`` makes of each (checked
against PEFT itself in tests/functional/core/test_adapter_names.py):

- ``adapter_model.safetensors`` / ``.bin`` (``save_pretrained``, the Trainer): PEFT's names already,
  ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``;
- a live ``PeftModel``'s state dict, a DeepSpeed tag's ``module`` (the Trainer saves PEFT runs with
  ``exclude_frozen_parameters=True``: the trainable tensors only), a DDP ``module.``-prefixed dict: the adapter
  name inside, ``…q_proj.lora_A.default.weight`` -> ``…q_proj.lora_A.weight``;
- an FSDP2 DCP folder of the Trainer (``pytorch_model_fsdp_0/``, Accelerate's ``save_fsdp_model(adapter_only=True)``
  saves ``{"model": get_peft_model_state_dict(model)}``): PEFT's names under DCP's ``model.`` container prefix,
  ``model.base_model.model.…q_proj.lora_A.weight``;
- an Embedding target: ``…embed_tokens.lora_embedding_A.default`` (a parameter, no ``.weight``) ->
  ``…embed_tokens.lora_embedding_A``; PEFT also saves the targeted embedding's base weight
  (``…embed_tokens.base_layer.weight``, ``save_embedding_layers="auto"``), which a tag of trainable tensors lacks:
  :meth:`AdapterTensors.from_base` names it and the base tensor it is;
- ``lora_bias=True``: ``…lora_B.default.bias`` -> ``…lora_B.bias``;
- ``modules_to_save``: ``base_model.model.lm_head.modules_to_save.default.weight`` -> ``base_model.model.lm_head.weight``;
  the frozen ``…lm_head.original_module.weight`` copy is not saved;
- DoRA's ``…lora_magnitude_vector.default.weight`` -> ``…lora_magnitude_vector`` (named; a merge refuses DoRA).

Only the adapter named ``default`` is read (the name the Trainer and ``get_peft_model`` give); another adapter's
tensors are dropped, and a problem says so.

The names are someone's: the work is linear in their total length, nothing raises on a strange name (it is
counted as not adapter, or dropped with a problem), and problems quote names escaped and come in bounded number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import prod
from typing import Mapping, Optional, Sequence

from ckpt_tui.core.safetext import visible

ADAPTER = "default"  # the only adapter name read
ROOT = "base_model.model."  # a PeftModel's names of its base model's tensors
# module attributes of a LoRA layer holding its tensors (peft.tuners.lora.LoraLayer.adapter_layer_names)
LORA_WEIGHTS = ("lora_A", "lora_B")  # nn.Linear / nn.Conv*d: a ``.weight`` (and lora_B's ``.bias`` with lora_bias)
LORA_EMBEDDINGS = ("lora_embedding_A", "lora_embedding_B")  # nn.Parameter: the adapter name is the last part
MAGNITUDE = "lora_magnitude_vector"  # DoRA
# PEFT's EMBEDDING_LAYER_NAMES: a LoRA on one of these makes save_embedding_layers="auto" save its base layer
EMBEDDING_LAYER_NAMES = ("embed_tokens", "lm_head")
INCLUDE_LINEAR_LAYERS_SHORTHAND = "all-linear"
# wrappers torch puts into module names (FSDP1, activation checkpointing, torch.compile), never in PEFT's names
WRAPPER_PARTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
# what may stand before ``base_model.model.``: DDP's / an engine's ``module.``, DCP's ``model.`` container key
PREFIX_PARTS = frozenset({"module", "model"}) | WRAPPER_PARTS
MAX_PREFIX = 80  # characters before base_model.model. that are still a container prefix
MAX_NAME = 4096  # a longer name is not a tensor name any framework writes
MAX_PROBLEMS = 20  # problems listed; the rest are counted

CONTAINERS = ("peft", "live", "deepspeed", "dcp")


@dataclass(frozen=True)
class LoraModule:
    module: str  # the base model's module name, e.g. "model.layers.0.self_attn.q_proj" (no base_model.model.)
    a: str  # PEFT saved name of lora_A (or lora_embedding_A)
    b: str  # PEFT saved name of lora_B (or lora_embedding_B)
    rank: int  # from the shapes: lora_A is (r, in, ...), lora_B (out, r, ...); embeddings (r, num) and (dim, r)
    embedding: bool  # lora_embedding_A/B (an nn.Embedding target)
    b_bias: Optional[str] = None  # PEFT saved name of lora_B.bias (lora_bias=True)
    magnitude: Optional[str] = None  # PEFT saved name of DoRA's lora_magnitude_vector


@dataclass
class AdapterTensors:
    saved: dict[str, str]  # source tensor name -> PEFT saved name, for every adapter tensor kept
    modules: list[LoraModule]  # in source order
    modules_to_save: dict[str, str]  # base model tensor name (e.g. "lm_head.weight") -> PEFT saved name
    container: str  # "peft" (already saved names) | "live" (.default names) | "deepspeed" | "dcp"
    dropped: list[str]  # source names not exported (original_module copies, other adapters, strange names)
    others: int = 0  # source tensors that are not adapter tensors (base weights: a full model's state dict)
    problems: list[str] = field(default_factory=list)  # why an export from these names would be wrong
    prefix: str = ""  # the container prefix taken off the source names: "model." (DCP), "module." (DDP) or ""
    adapter_named: bool = False  # the source names carry the adapter name (``.default``)
    # saved name of a base embedding layer PEFT saves beside a LoRA on it -> the base model's tensor name
    embedding_layers: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # PEFT saved name -> shape
    # saved names of the copies PEFT's file holds of a modules_to_save wrapper's tensors when the run resized the
    # embedding (`lm_head.original_module.weight`, `lm_head.modules_to_save.weight`): exported, never merged
    wrapper_copies: list[str] = field(default_factory=list)

    def targets(self) -> list[str]:
        """The distinct last components of the LoRA modules' names, sorted: ``["q_proj", "v_proj"]``."""
        return sorted({m.module.rpartition(".")[2] for m in self.modules})

    def params(self) -> int:
        """Elements of every tensor kept (LoRA and modules_to_save alike; not PEFT's copies of a wrapper's)."""
        copies = set(self.wrapper_copies)
        return sum(prod(s) for n, s in self.shapes.items() if n not in copies)

    def lora_params(self) -> int:
        """Elements of the LoRA tensors alone (A, B, lora_B.bias, magnitude)."""
        names = [n for m in self.modules for n in (m.a, m.b, m.b_bias, m.magnitude) if n is not None]
        return sum(prod(self.shapes.get(n, ())) for n in names)

    def from_base(self) -> dict[str, str]:
        """The saved names PEFT's file holds that these tensors lack -> the base model's tensor to take each from
        (the targeted embedding's base layer, which a tag of trainable tensors does not hold)."""
        have = set(self.saved.values())
        return {k: v for k, v in self.embedding_layers.items() if k not in have}


def base_name(peft_saved_name: str) -> str:
    """The base model's name of a tensor PEFT saves: ``base_model.model.lm_head.weight`` -> ``lm_head.weight``,
    ``base_model.model.model.embed_tokens.base_layer.weight`` -> ``model.embed_tokens.weight``."""
    n = peft_saved_name.removeprefix(ROOT)
    head, dot, leaf = n.rpartition(".")
    if dot and (head == "base_layer" or head.endswith(".base_layer")):
        n = f"{head.removesuffix('base_layer').removesuffix('.')}.{leaf}".lstrip(".")
    return n


def peft_saves_embedding_layers(target_modules: Optional[Sequence[str] | str], lora_modules: Sequence[str]) -> bool:
    """Whether ``get_peft_model_state_dict`` (``save_embedding_layers="auto"``) saves the base layers of the LoRA
    embeddings, as PEFT decides it from the config: a list of targets naming ``embed_tokens`` or ``lm_head``, or a
    regex that fully matches a module so named. (PEFT's other reason, a vocabulary resized since the base, needs
    the base's config and is not decided here.)"""
    if target_modules is None:
        return False
    if isinstance(target_modules, str):
        if target_modules == INCLUDE_LINEAR_LAYERS_SHORTHAND:
            return False
        try:
            pattern = re.compile(target_modules)
        except re.error:
            return False
        return any(pattern.fullmatch(m) for m in lora_modules if re.match(r"(.*\.)?(embed_tokens|lm_head)$", m))
    return any(k in target_modules for k in EMBEDDING_LAYER_NAMES)


class _Problems:
    """At most MAX_PROBLEMS messages, then a count: a hostile file cannot make a million of them."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.more = 0
        self.seen: set[str] = set()

    def add(self, text: str, *, key: Optional[str] = None) -> None:
        if key is not None:
            if key in self.seen:
                return
            if len(self.seen) < 1000:
                self.seen.add(key)
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(text)
        else:
            self.more += 1

    def done(self) -> list[str]:
        return self.items + ([f"… and {self.more} more"] if self.more else [])


def _q(name: str) -> str:
    """A source name quoted for a message: escaped, and cut if long."""
    s = name if len(name) <= 160 else name[:150] + "…"
    return f"`{visible(s)}`"


@dataclass(slots=True)
class _Parsed:
    kind: str  # "lora" | "emb" | "mag" | "mts" | "orig" | "plain" | "bad"
    module: str = ""  # the base module name (no ROOT)
    part: str = ""  # lora_A / lora_B / lora_embedding_A / ...
    leaf: str = ""  # weight / bias ("" for a parameter)
    adapter: Optional[str] = None  # None: no adapter name (PEFT's saved form)
    rest: str = ""  # modules_to_save: the wrapped module's tensor name; plain: the name under ROOT
    why: str = ""  # bad: what is wrong


def _split_prefix(name: str) -> Optional[tuple[str, str]]:
    """(container prefix, name under base_model.model.), or None: not a PeftModel's name."""
    if name.startswith(ROOT):
        return "", name[len(ROOT) :]
    pos = name.find("." + ROOT, 0, MAX_PREFIX + 1)
    if pos < 0:
        return None
    head = name[: pos + 1]
    if not all(p in PREFIX_PARTS for p in head[:-1].split(".")):
        return None
    return head, name[pos + 1 + len(ROOT) :]


LEAVES = ("weight", "bias")


def _parse(rest: str) -> _Parsed:
    """What the name under ``base_model.model.`` is. String searches first: a base weight (no ``lora_`` in it,
    most names of a whole model) costs a few of them, and only the last parts of a LoRA name are split off."""
    if "_wrapped_module" in rest or "_orig_mod" in rest:
        rest = ".".join(p for p in rest.split(".") if p not in WRAPPER_PARTS)
    d = f".{rest}."
    if not rest or ".." in d:
        lora_ish = ".lora_" in d or ".modules_to_save." in d or ".original_module." in d
        return _Parsed("bad" if lora_ish else "plain", rest=rest, why="an empty part in the name")
    if ".original_module." in d:
        return _Parsed("orig", rest=rest)
    i = d.find(".modules_to_save.")
    if i >= 0:
        module = d[1:i] if i > 0 else ""
        adapter, _, inner = d[i + len(".modules_to_save.") : -1].partition(".")
        if module and not inner and adapter in LEAVES:
            # `lm_head.modules_to_save.weight`: PEFT's saved form of the wrapper's own copy, which it writes
            # beside `lm_head.weight` when the run resized the embedding (save_embedding_layers)
            return _Parsed("orig", rest=rest)
        if not module or not inner:
            return _Parsed("bad", why="a modules_to_save name without its module or tensor")
        if f".{inner}".find(".lora_") >= 0:
            return _Parsed("bad", why="a LoRA layer inside a modules_to_save copy")
        return _Parsed("mts", module=module, adapter=adapter, rest=inner)
    if ".token_adapter." in d:
        return _Parsed("bad", why="trainable tokens (trainable_token_indices) are not read")
    if ".lora_" not in d:
        return _Parsed("plain", rest=rest)
    t = rest.rsplit(".", 3)
    n = len(t)
    if n == 4 and t[1] in LORA_WEIGHTS and t[3] in LEAVES:
        return _Parsed("lora", t[0], t[1], t[3], t[2])
    if n >= 3 and t[-2] in LORA_WEIGHTS and t[-1] in LEAVES:
        return _Parsed("lora", ".".join(t[:-2]), t[-2], t[-1], None)
    if n >= 3 and t[-2] in LORA_EMBEDDINGS:
        return _Parsed("emb", ".".join(t[:-2]), t[-2], "", t[-1])
    if n >= 2 and t[-1] in LORA_EMBEDDINGS:
        return _Parsed("emb", ".".join(t[:-1]), t[-1], "", None)
    if n == 4 and t[1] == MAGNITUDE and t[3] == "weight":
        return _Parsed("mag", t[0], MAGNITUDE, "", t[2])
    if n >= 2 and t[-1] == MAGNITUDE:
        return _Parsed("mag", ".".join(t[:-1]), MAGNITUDE, "", None)
    return _Parsed("bad", why="not a plain LoRA tensor (a LoRA variant this tool does not read)")


def _lora_ish(name: str) -> bool:
    return "lora_" in name or "modules_to_save" in name


def _base_layer_of(rest: str) -> Optional[str]:
    """``model.embed_tokens`` for ``model.embed_tokens.base_layer.weight`` (a LoRA layer's wrapped module)."""
    head, dot, _ = rest.rpartition(".")
    if not dot or not (head == "base_layer" or head.endswith(".base_layer")):
        return None
    return head[: -len(".base_layer")] if head != "base_layer" else ""


def _rank(shape: tuple[int, ...], axis: int) -> Optional[int]:
    if len(shape) < 2 or shape[axis] <= 0:
        return None
    return shape[axis]


@dataclass
class _Layer:
    order: int
    embedding: bool = False
    a: Optional[tuple[str, str]] = None  # (source, saved)
    b: Optional[tuple[str, str]] = None
    b_bias: Optional[tuple[str, str]] = None
    magnitude: Optional[tuple[str, str]] = None
    bad: bool = False
    extra: list[str] = field(default_factory=list)  # source names of a second A/B/... (duplicates)


def lora_layout(
    shapes: Mapping[str, tuple[int, ...]],
    *,
    container: Optional[str] = None,
    target_modules: Optional[Sequence[str] | str] = None,
) -> Optional[AdapterTensors]:
    """The LoRA tensors among ``shapes`` (tensor name -> shape) and the names PEFT saves them under; None when
    no name is a LoRA or modules_to_save tensor of a PeftModel.

    ``container`` names where the tensors came from when the caller knows it (``"deepspeed"``: names cannot tell
    a tag's ``module`` from a live state dict); otherwise it is read from the names: ``"dcp"`` under the
    ``model.`` prefix, ``"live"`` with adapter names, ``"peft"`` without. ``target_modules`` (adapter_config.json's)
    decides whether PEFT saves the base layers of LoRA embeddings, as PEFT decides it; without it, a LoRA on a
    module named ``embed_tokens`` or ``lm_head`` is taken to mean it does (what a list of targets naming it does).

    In PEFT's saved form a modules_to_save tensor (``base_model.model.lm_head.weight``) reads like a base weight:
    such names are taken as modules_to_save, unless the names hold a LoRA module's own base weight
    (``…q_proj.base_layer.weight``: a whole model's state dict), where they count as ``others``.
    """
    from ..formats.unpickle import gc_paused

    with gc_paused():  # a million small acyclic objects: the cyclic GC would walk them again and again
        return _layout(shapes, container, target_modules)


def _layout(
    shapes: Mapping[str, tuple[int, ...]],
    container: Optional[str],
    target_modules: Optional[Sequence[str] | str],
) -> Optional[AdapterTensors]:
    probs = _Problems()
    dropped: list[str] = []
    others = 0
    prefixes: dict[str, int] = {}
    layers: dict[str, _Layer] = {}
    mts: list[tuple[str, _Parsed]] = []  # (source, parsed) of live modules_to_save tensors
    plain: list[tuple[str, str]] = []  # (source, name under ROOT) of everything else under ROOT
    copies: list[tuple[str, str]] = []  # (source, name under ROOT) of a modules_to_save wrapper's own tensors
    named = saved_form = False
    adapters_ignored: set[str] = set()
    found = False  # any LoRA-family name at all (the layout exists)

    for src in shapes:
        if not isinstance(src, str) or len(src) > MAX_NAME:
            if isinstance(src, str) and _lora_ish(src):
                found = True
                dropped.append(src)
                probs.add(f"a name of {len(src)} characters is not read", key="long")
            else:
                others += 1
            continue
        split = _split_prefix(src)
        if split is None:
            if _lora_ish(src) and _parse(src).kind in ("lora", "emb", "mag", "mts"):
                found = True
                dropped.append(src)
                probs.add(f"{_q(src)} is not under `{ROOT}`: not a PeftModel's name", key="root")
            else:
                others += 1
            continue
        head, rest = split
        p = _parse(rest)
        if p.kind == "plain":
            plain.append((src, p.rest))
            continue
        found = True
        prefixes[head] = prefixes.get(head, 0) + 1
        if p.kind == "orig":
            copies.append((src, p.rest))
            continue
        if p.kind == "bad":
            dropped.append(src)
            probs.add(f"{_q(src)}: {p.why}", key=p.why)
            continue
        if p.adapter is not None and p.adapter != ADAPTER:
            dropped.append(src)
            if p.adapter not in adapters_ignored and len(adapters_ignored) < 100:
                adapters_ignored.add(p.adapter)
                probs.add(
                    f"adapter {_q(p.adapter)} ({_q(src)}): only the adapter named `{ADAPTER}` is read",
                    key="adapter:" + p.adapter,
                )
            continue
        if p.adapter is None:
            saved_form = True
        else:
            named = True
        if p.kind == "mts":
            mts.append((src, p))
            continue
        # a LoRA tensor: lora_A/B(.bias), lora_embedding_A/B, lora_magnitude_vector
        layer = layers.get(p.module)
        if layer is None:
            layer = layers[p.module] = _Layer(order=len(layers))
        if p.kind == "lora":
            saved = f"{ROOT}{p.module}.{p.part}.{p.leaf}"
            if p.part == "lora_A" and p.leaf == "bias":
                dropped.append(src)
                probs.add(f"{_q(src)}: lora_A has no bias in PEFT", key="abias")
                continue
            slot = "b_bias" if p.leaf == "bias" else ("a" if p.part == "lora_A" else "b")
        elif p.kind == "emb":
            saved = f"{ROOT}{p.module}.{p.part}"
            slot = "a" if p.part == "lora_embedding_A" else "b"
        else:
            saved = f"{ROOT}{p.module}.{MAGNITUDE}"
            slot = "magnitude"
        if slot in ("a", "b"):
            emb = p.kind == "emb"
            if (layer.a or layer.b) and layer.embedding != emb:
                layer.bad = True
                probs.add(f"`{visible(p.module)}` has both lora_A/B and lora_embedding_A/B", key="mixed:" + p.module)
            layer.embedding = emb
        if getattr(layer, slot) is not None:
            layer.extra.append(src)
            continue
        setattr(layer, slot, (src, saved))

    if not found:
        return None

    if named and saved_form:
        probs.add("the names mix PEFT's saved form (`lora_A.weight`) and a live model's (`lora_A.default.weight`)")
    if len(prefixes) > 1:
        shown = ", ".join(f"`{visible(h)}`" if h else "none" for h in list(prefixes)[:4])
        probs.add(f"the adapter tensors sit under different prefixes ({shown})")
    prefix = max(prefixes, key=lambda h: prefixes[h]) if prefixes else ""
    if container is None:
        container = "dcp" if "model" in prefix.split(".") else ("live" if named else "peft")
    elif container not in CONTAINERS:
        raise ValueError(f"container {container!r} is not one of {CONTAINERS}")

    out: dict[str, str] = {}
    out_shapes: dict[str, tuple[int, ...]] = {}
    taken: dict[str, str] = {}  # saved name -> source (a second source of one saved name is a problem)

    def keep(src: str, saved: str) -> bool:
        if saved in taken:
            dropped.append(src)
            probs.add(f"{_q(src)} and {_q(taken[saved])} are both `{visible(saved)}`", key="dup:" + saved)
            return False
        taken[saved] = src
        out[src] = saved
        out_shapes[saved] = tuple(shapes[src])
        return True

    modules: list[LoraModule] = []
    for module, layer in sorted(layers.items(), key=lambda kv: kv[1].order):
        for src in layer.extra:
            dropped.append(src)
            probs.add(f"{_q(src)}: a second tensor for one LoRA slot", key="extra:" + module)
        own = [t for t in (layer.a, layer.b, layer.b_bias, layer.magnitude) if t is not None]
        mod = f"`{visible(module)}`"
        bad = layer.bad
        if layer.a is None or layer.b is None:
            which = "lora_B" if layer.a is not None else "lora_A"
            if layer.a is not None or layer.b is not None:
                probs.add(f"{mod} has no {which}: an unpaired LoRA tensor")
            else:
                probs.add(f"{mod} has a lora_B.bias or magnitude but no lora_A/lora_B")
            bad = True
        ra = rb = None
        if not bad and layer.a is not None and layer.b is not None:
            sa, sb = tuple(shapes[layer.a[0]]), tuple(shapes[layer.b[0]])
            ra, rb = _rank(sa, 0), _rank(sb, 1)
            if ra is None or rb is None or ra != rb:
                probs.add(f"{mod}: lora_A {sa} and lora_B {sb} do not agree on a rank")
                bad = True
            elif layer.b_bias is not None and tuple(shapes[layer.b_bias[0]]) != (sb[0],):
                probs.add(f"{mod}: lora_B.bias {tuple(shapes[layer.b_bias[0]])} is not ({sb[0]},)")
                bad = True
        if bad:
            dropped.extend(src for src, _ in own)
            continue
        assert layer.a is not None and layer.b is not None and ra is not None
        if not all(keep(src, saved) for src, saved in own):
            continue
        modules.append(
            LoraModule(
                module=module,
                a=layer.a[1],
                b=layer.b[1],
                rank=ra,
                embedding=layer.embedding,
                b_bias=layer.b_bias[1] if layer.b_bias else None,
                magnitude=layer.magnitude[1] if layer.magnitude else None,
            )
        )

    to_save: dict[str, str] = {}
    for src, p in mts:
        saved = f"{ROOT}{p.module}.{p.rest}"
        if keep(src, saved):
            to_save[f"{p.module}.{p.rest}"] = saved

    # PEFT saves the base layer of a LoRA'd input/output embedding beside the adapter (save_embedding_layers):
    # in the saved form the names say whether it did; from live names it is predicted as PEFT decides it
    lora_names = {m.module for m in modules}
    emb_named = {m for m in lora_names if m.rpartition(".")[2] in EMBEDDING_LAYER_NAMES}
    embedding_layers: dict[str, str] = {}
    saves = named and (
        peft_saves_embedding_layers(target_modules, sorted(emb_named)) if target_modules is not None else True
    )
    for m in sorted(emb_named, key=lambda m: layers[m].order) if saves else ():
        embedding_layers[f"{ROOT}{m}.base_layer.weight"] = f"{m}.weight"
    # a LoRA module's own base weight among saved-form names: a whole model's state dict, not an adapter file
    plain_lora = lora_names - emb_named
    whole = not named and any(_base_layer_of(r) in plain_lora for _, r in plain)
    for src, r in plain:
        saved = ROOT + r
        if named or whole:
            if saves and _base_layer_of(r) in emb_named:
                embedding_layers[saved] = base_name(saved)
                keep(src, saved)
            else:
                others += 1
        elif _base_layer_of(r) in emb_named:  # PEFT's file: the embedding's base layer it saved
            embedding_layers[saved] = base_name(saved)
            keep(src, saved)
        elif ".base_layer." in f".{r}":
            others += 1
        elif keep(src, saved):  # PEFT's file: a modules_to_save tensor (or a resized embedding)
            to_save[r] = saved

    # a modules_to_save wrapper's original_module (and, saved, its modules_to_save copy): a live model's are not
    # the adapter's; PEFT's file holds them only where it saved the resized embedding layers whole beside
    # modules_to_save (save_embedding_layers): kept as it saved them, for the adapter; never merged
    wrapper_copies: list[str] = []
    for src, r in copies:
        head, _, leaf = r.rpartition(".")
        module = head.rpartition(".")[0]  # `lm_head` of `lm_head.original_module.weight`
        if named or f"{module}.{leaf}" not in to_save:
            dropped.append(src)  # a live model's wrapper, or a copy of nothing the file saves
        elif keep(src, ROOT + r):
            wrapper_copies.append(ROOT + r)

    return AdapterTensors(
        saved=out,
        wrapper_copies=wrapper_copies,
        modules=modules,
        modules_to_save=to_save,
        container=container,
        dropped=dropped,
        others=others,
        problems=probs.done(),
        prefix=prefix,
        adapter_named=named,
        embedding_layers=embedding_layers,
        shapes=out_shapes,
    )
