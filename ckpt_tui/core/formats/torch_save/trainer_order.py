"""The HF Trainer's parameter order: which parameter each index of a Trainer's ``optimizer.pt`` is.

    order = trainer_param_order(Path("checkpoint-2/config.json"), weight_decay=0.01)
    order = trainer_param_order(base / "config.json", adapter_config=read_lora_config(ckpt / "adapter_config.json"),
                                weight_decay=0.01)
    problem = check_against(order, [8, 0], [0.01, 0.0], {0: (4, 64), ...}, order.shapes)   # None: accepted

``Trainer.create_optimizer`` (transformers 5.24) hands the optimizer two groups: the trainable parameters whose
names ``get_decay_parameter_names`` lists (weight_decay = args.weight_decay), then the other trainable ones
(0.0), each in ``model.named_parameters()`` order; both groups are kept, the second empty where nothing is
exempt. ``optimizer.state_dict()`` numbers them 0, 1, … across the groups. The split goes by module type as well
as by name: a parameter is exempt where its lower-cased name contains ``bias``, ``layernorm``, ``rmsnorm``,
``norm`` as a dotted part or ``_norm`` before a dot or the end, or where a module on its path is an
``nn.LayerNorm`` (GPT-2's ``ln_1``, whose name matches none of these). Neither ``config.json`` nor a safetensors
file's sorted names give that order, so the architecture is built: the installed transformers' model class for
``config.json``, on the meta device (no memory, no weights), refusing a config that names code of its own
(``auto_map``) or a model type the installed transformers does not have, and one whose layer or expert counts
are beyond what a model has (a meta model is still built module by module, in Python).

A PEFT LoRA run (``adapter_config.json``) is wrapped as PEFT 0.21 wraps it, without importing peft: its target
modules chosen by PEFT's rules (a list: a module name equal to an entry or ending in ``.entry``; a string: a
``re.fullmatch``; ``all-linear``: every Linear / Conv1D but the output embedding; ``exclude_modules``,
``layers_to_transform`` / ``layers_pattern`` and ``modules_to_save`` applied as PEFT applies them), each replaced
in place by a LoRA layer (``base_layer``, ``lora_A.default``, ``lora_B.default`` — with a bias under
``lora_bias`` — or ``lora_embedding_A/B.default`` for an Embedding) under ``base_model.model.``, and each
``modules_to_save`` module by a wrapper holding the frozen original and a trainable copy
(``….modules_to_save.default.…``). Everything of the base is frozen. The Trainer's split then runs on that
wrapped tree. The names handed to the state are PEFT's saved names (``get_peft_model_state_dict``'s: the adapter
name taken out), which are the adapter export's names.

The order is a claim about someone else's run: :func:`check_against` accepts it only where the optimizer's
group count, every group's size and weight_decay, and every state's shape agree; the caller keeps
``param_<i>`` otherwise. Shapes check the order, they never choose it (``q_proj``/``o_proj`` and every
``lora_A`` of one rank are alike).

transformers and torch are imported here only, inside functions; peft never.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ...adapters.config import LoraConfig
from ...safetext import visible

CONFIG_NAME = "config.json"
MAX_CONFIG_BYTES = 4 << 20  # a model's config.json is a few kB (a multimodal one some tens)
MAX_DEPTH = 32  # JSON nesting of a config
MAX_LAYERS = 1024  # any *layers / *layer count of a config (the largest released models have ~130)
MAX_EXPERTS = 1024  # any *experts count (MoE models have up to 256 routed experts)
MAX_LAYER_EXPERTS = 1 << 17  # layers x experts: the modules a MoE model's build creates, one by one
MAX_PARAMETERS = 1_000_000  # parameter tensors of the built model
MAX_PATTERN = 1000  # characters of a regular expression taken from adapter_config.json
ADAPTER = "default"  # the adapter name the Trainer's get_peft_model gives
ROOT = "base_model.model."  # a PeftModel's names of its base model
# Trainer.get_decay_parameter_names (transformers 5.24): forbidden_name_patterns, searched in the lower-cased name
NO_DECAY_PATTERNS = tuple(
    re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
)
INCLUDE_LINEAR_LAYERS_SHORTHAND = "all-linear"
# module kinds a LoRA layer of PEFT 0.21's dispatch_default takes, and the ones it has but this does not emulate
_LORA_KINDS = ("linear", "conv1d", "embedding")
_OTHER_LORA_KINDS = ("conv", "mha")


@dataclass
class TrainerOrder:
    """The Trainer's optimizer groups of one run, or why there is none (``why_not``)."""

    groups: list[list[str]]  # parameter names per optimizer group, Trainer's order (named_parameters() names)
    weight_decay: list[float]
    why_not: Optional[str] = None  # set when no order could be derived: what failed
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name in groups -> parameter shape
    saved: dict[str, str] = field(default_factory=dict)  # name in groups -> the name the export gives it
    what: str = ""  # "full fine-tuning of GPT2LMHeadModel" / "a LoRA adapter on LlamaForCausalLM"
    adapter: bool = False  # a PEFT run: the names are the adapter's (PEFT's saved names)

    def export_names(self) -> list[str]:
        """The export's names of indices 0, 1, … (the groups concatenated)."""
        return [self.saved.get(n, n) for g in self.groups for n in g]


def _refused(why: str) -> TrainerOrder:
    return TrainerOrder([], [], why)


class _Refuse(Exception):
    """No order: the message says why (already escaped where it quotes the file)."""


# -- config.json, read as data ---------------------------------------------------------------------------------


def read_model_config(path: Path, *, link_root: Optional[Path] = None) -> dict[str, Any]:
    """``config.json`` as a checked dict; _Refuse says why not. A symbolic link is followed only where
    ``link_root`` is given and the link resolves inside it (a Hugging Face cache's snapshot -> blob)."""
    try:
        if path.is_symlink():
            target = path.resolve()
            if link_root is None or not target.is_relative_to(link_root.resolve()):
                raise _Refuse(f"{visible(path.name)} is a symbolic link; not followed")
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise _Refuse(f"{visible(path.name)} is {size} bytes, larger than a model config can be")
        raw = path.read_bytes()
    except OSError as e:
        raise _Refuse(f"{visible(path.name)} cannot be read ({visible(e.strerror or e)})") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _Refuse(f"{visible(path.name)} is not valid JSON ({visible(e)})") from None
    if not isinstance(doc, dict):
        raise _Refuse(f"{visible(path.name)} is not a JSON object")
    return doc


def _walk(doc: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of the nested dicts (and dicts in lists) of ``doc``."""
    if depth > MAX_DEPTH:
        raise _Refuse(f"{CONFIG_NAME} nests deeper than {MAX_DEPTH} levels")
    items: list[tuple[str, Any]] = list(doc.items()) if isinstance(doc, dict) else [("", v) for v in doc]
    for k, v in items:
        yield str(k), v
        if isinstance(v, (dict, list)):
            yield from _walk(v, depth + 1)


def screen_config(doc: dict[str, Any]) -> None:
    """Refuse (``_Refuse``) a config that asks for code of its own or that builds beyond bounds."""
    layers, experts = 1, 1
    for k, v in _walk(doc):
        low = k.lower()
        if low == "auto_map":
            raise _Refuse(
                f"{CONFIG_NAME} has `auto_map`: the model is code shipped beside it (trust_remote_code), "
                "which is never run; its parameter order cannot be derived"
            )
        if isinstance(v, bool) or not isinstance(v, int):
            continue
        if low.endswith(("layers", "layer")) or low == "n_layer":
            if v > MAX_LAYERS:
                raise _Refuse(f"{CONFIG_NAME}: `{visible(k)}` is {v}, beyond the {MAX_LAYERS} layers a model has")
            layers = max(layers, v)
        elif "experts" in low:
            if v > MAX_EXPERTS:
                raise _Refuse(f"{CONFIG_NAME}: `{visible(k)}` is {v}, beyond the {MAX_EXPERTS} experts a model has")
            experts = max(experts, v)
    if layers * experts > MAX_LAYER_EXPERTS:
        raise _Refuse(f"{CONFIG_NAME}: {layers} layers of {experts} experts are more modules than are built here")


# -- a module tree that PEFT's wrapping and the Trainer's split run on -------------------------------------------


class _Param:
    __slots__ = ("shape", "trainable")

    def __init__(self, shape: tuple[int, ...], trainable: bool) -> None:
        self.shape = shape
        self.trainable = trainable


class _Node:
    """A module: its kind (what PEFT and the Trainer test it for), children and own parameters, in
    registration order. The same node (or parameter) object under two names is one shared module (tied)."""

    __slots__ = ("kind", "layernorm", "children", "params", "in_f", "out_f", "lora")

    def __init__(self, kind: str = "other", *, layernorm: bool = False, in_f: int = 0, out_f: int = 0) -> None:
        self.kind = kind  # linear | conv1d (transformers' Conv1D) | embedding | conv | mha | other
        self.layernorm = layernorm  # an nn.LayerNorm (the Trainer's forbidden layer type)
        self.children: dict[str, _Node] = {}
        self.params: dict[str, _Param] = {}
        self.in_f = in_f
        self.out_f = out_f
        self.lora = False  # a LoRA layer put in by the wrapping


def _named_modules(root: _Node, *, remove_duplicate: bool = True) -> list[tuple[str, _Node]]:
    """``nn.Module.named_modules()``: pre-order, each module once (``remove_duplicate``) under its first name."""
    out: list[tuple[str, _Node]] = []
    memo: set[int] = set()

    def walk(node: _Node, prefix: str) -> None:
        if remove_duplicate:
            if id(node) in memo:
                return
            memo.add(id(node))
        out.append((prefix, node))
        for k, c in node.children.items():
            walk(c, f"{prefix}.{k}" if prefix else k)

    walk(root, "")
    return out


def _decay_named_parameters(root: _Node) -> list[tuple[str, _Param, bool]]:
    """``named_parameters()`` of ``root`` (each parameter once, under its first name), each with whether the
    Trainer's ``get_decay_parameter_names`` lists it. That function recurses through ``named_children`` and drops
    a name where a module on its path is a LayerNorm or a pattern matches the name's tail at some level; a match
    in a tail is a match in the whole name (the unanchored patterns trivially, ``^`` of a tail being a dot in the
    whole), so it is: no LayerNorm on the path (the root not counted) and no pattern in the whole lower-cased name."""
    out: list[tuple[str, _Param, bool]] = []
    memo_m: set[int] = set()
    memo_p: set[int] = set()

    def walk(node: _Node, prefix: str, under_ln: bool) -> None:
        if id(node) in memo_m:
            return
        memo_m.add(id(node))
        for k, p in node.params.items():
            if id(p) in memo_p:
                continue
            memo_p.add(id(p))
            name = f"{prefix}.{k}" if prefix else k
            low = name.lower()
            out.append((name, p, not under_ln and not any(pat.search(low) for pat in NO_DECAY_PATTERNS)))
        for k, c in node.children.items():
            walk(c, f"{prefix}.{k}" if prefix else k, under_ln or c.layernorm)

    walk(root, "", False)
    return out


def _tree(model: Any) -> tuple[_Node, Optional[str]]:
    """The module tree of a built (meta) torch model, and the name of its output embedding (None: none)."""
    from torch import nn

    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - every transformers 5 has it
        Conv1D = ()  # noqa: N806
    nodes: dict[int, _Node] = {}
    params: dict[int, _Param] = {}

    def kind_of(m: Any) -> tuple[str, int, int]:
        # PEFT 0.21's dispatch_default tests in this order
        if isinstance(m, nn.Embedding):
            return "embedding", int(m.num_embeddings), int(m.embedding_dim)
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return "conv", 0, 0
        if isinstance(m, nn.MultiheadAttention):
            return "mha", 0, 0
        if isinstance(m, nn.Linear):
            return "linear", int(m.in_features), int(m.out_features)
        if Conv1D and isinstance(m, Conv1D):
            nx, nf = tuple(m.weight.shape)  # Conv1D's weight is (in, out)
            return "conv1d", int(nx), int(nf)
        return "other", 0, 0

    def conv(m: Any) -> _Node:
        n = nodes.get(id(m))
        if n is not None:
            return n
        kind, i, o = kind_of(m)
        n = _Node(kind, layernorm=isinstance(m, nn.LayerNorm), in_f=i, out_f=o)
        nodes[id(m)] = n
        for k, p in m._parameters.items():
            if p is None:
                continue
            q = params.get(id(p))
            if q is None:
                if len(params) >= MAX_PARAMETERS:
                    raise _Refuse(f"the model has more than {MAX_PARAMETERS} parameter tensors")
                q = params[id(p)] = _Param(tuple(int(d) for d in p.shape), bool(p.requires_grad))
            n.params[str(k)] = q
        for k, c in m._modules.items():
            if c is not None:
                n.children[str(k)] = conv(c)
        return n

    root = conv(model)
    out_name: Optional[str] = None
    get_out = getattr(model, "get_output_embeddings", None)
    emb = get_out() if callable(get_out) else None
    if emb is not None:
        out_name = next((name for name, mod in model.named_modules() if mod is emb), None)
    return root, out_name


# -- the architecture, built from config.json --------------------------------------------------------------------


def _model_class_name(doc: dict[str, Any]) -> tuple[str, Optional[str]]:
    """(model_type, the class named by ``architectures`` — None: AutoModelForCausalLM's)."""
    model_type = doc.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise _Refuse(f"{CONFIG_NAME} has no `model_type`")
    archs = doc.get("architectures")
    if archs is None:
        return model_type, None
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise _Refuse(f"{CONFIG_NAME}: `architectures` is not a list of class names")
    if len(archs) > 1:
        raise _Refuse(f"{CONFIG_NAME} names {len(archs)} architectures; the run's model is not known")
    return model_type, archs[0]


def build_tree(doc: dict[str, Any]) -> tuple[_Node, Optional[str], str]:
    """(the module tree, the output embedding's name, the class name) of the model ``doc`` describes, built on
    the meta device by the installed transformers; _Refuse says why not."""
    screen_config(doc)
    model_type, arch = _model_class_name(doc)
    try:
        import torch
        import transformers
        from transformers.models.auto import modeling_auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError as e:
        raise _Refuse(f"transformers is not installed ({visible(e)}): the Trainer's order needs it") from None
    if model_type not in CONFIG_MAPPING:
        raise _Refuse(
            f"`model_type` {visible(model_type)!r} is not a model transformers {transformers.__version__} has "
            "(its code would have to come from elsewhere)"
        )
    mapped: set[str] = set()
    for attr in dir(modeling_auto):
        table = getattr(modeling_auto, attr)
        if attr.endswith("_MAPPING_NAMES") and attr != "CONFIG_MAPPING_NAMES" and isinstance(table, dict):
            v = table.get(model_type)
            mapped.update([v] if isinstance(v, str) else [x for x in (v or ()) if isinstance(x, str)])
    if arch is not None and arch not in mapped:
        raise _Refuse(
            f"`architectures` names {visible(arch)!r}, not a {visible(model_type)} class of transformers "
            f"{transformers.__version__}"
        )
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = CONFIG_MAPPING[model_type].from_dict(dict(doc))
            with torch.device("meta"):
                if arch is None:
                    model = transformers.AutoModelForCausalLM.from_config(cfg)
                else:
                    model = getattr(transformers, arch)._from_config(cfg)
            root, out_name = _tree(model)
            name = type(model).__name__
            del model
    except _Refuse:
        raise
    except Exception as e:  # the installed transformers' own refusal of this config
        raise _Refuse(
            f"transformers {transformers.__version__} cannot build the model of {CONFIG_NAME}: "
            f"{visible(type(e).__name__)}: {visible(str(e)[:300])}"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return root, out_name, name


# -- PEFT's wrapping, emulated -----------------------------------------------------------------------------------


def _compile(pattern: str, what: str) -> re.Pattern[str]:
    if len(pattern) > MAX_PATTERN:
        raise _Refuse(f"adapter_config.json: `{what}` is a regular expression of {len(pattern)} characters")
    try:
        return re.compile(pattern)
    except re.error:
        raise _Refuse(f"adapter_config.json: `{what}` {visible(pattern[:60])!r} is not a regular expression") from None


def _names_list(v: Any, what: str) -> Optional[list[str] | str]:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise _Refuse(f"adapter_config.json: `{what}` is neither a name list nor a regular expression")


class _Matcher:
    """PEFT 0.21's ``check_target_module_exists`` for one LoraConfig (keys: the base model's module names)."""

    def __init__(self, cfg: LoraConfig, targets: list[str] | str) -> None:
        raw = cfg.raw
        self.targets = targets
        self.target_re = _compile(targets, "target_modules") if isinstance(targets, str) else None
        self.targets_set = set(targets) if isinstance(targets, list) else set()
        excl = _names_list(raw.get("exclude_modules"), "exclude_modules")
        self.exclude: list[str] | str | None = excl or None
        self.exclude_re = _compile(excl, "exclude_modules") if isinstance(excl, str) and excl else None
        self.mts = [_compile(rf"(^|.*\.){m}($|\..*)", "modules_to_save") for m in cfg.modules_to_save]
        lt = raw.get("layers_to_transform")
        if lt is not None and not (
            (isinstance(lt, int) and not isinstance(lt, bool))
            or (isinstance(lt, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in lt))
        ):
            raise _Refuse("adapter_config.json: `layers_to_transform` is neither a layer index nor a list of them")
        self.layers: int | list[int] | None = lt
        lp = _names_list(raw.get("layers_pattern"), "layers_pattern")
        self.layers_pattern = [lp] if isinstance(lp, str) else lp
        for p in self.layers_pattern or []:
            _compile(p, "layers_pattern")

    def __call__(self, key: str) -> Optional[bool]:
        """True: a target; False: not; None: excluded."""
        if self.exclude:
            if self.exclude_re is not None:
                if self.exclude_re.fullmatch(key):
                    return None
            elif key in self.exclude or any(key.endswith(f".{e}") for e in self.exclude):
                return None
        if any(m.match(key) for m in self.mts):
            return None
        if self.target_re is not None:
            return self.target_re.fullmatch(key) is not None
        if key in self.targets_set:
            return True
        found = any(key.endswith(f".{t}") for t in self.targets_set)
        using = self.layers is not None and (len(self.layers) != 0 if isinstance(self.layers, list) else True)
        if using and found:
            match: Optional[re.Match[str]] = None
            if not self.layers_pattern:
                match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
            else:
                for pattern in self.layers_pattern:
                    match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
                    if match is not None:
                        break
            idx = match.groupdict().get("idx") if match else None
            if idx is None:
                return False
            layers = self.layers
            return int(idx) == layers if isinstance(layers, int) else int(idx) in (layers or [])
        return found


def _remove_adapter_name(key: str) -> str:
    """PEFT 0.21's ``_remove_adapter_name_from_state_dict_key``: ``…lora_A.default.weight`` -> ``…lora_A.weight``,
    ``…lora_embedding_A.default`` -> ``…lora_embedding_A``."""
    if "." not in key:
        return key
    if key.endswith(f".{ADAPTER}"):
        return key.removesuffix(f".{ADAPTER}")
    head, _, suffix = key.rpartition(".")
    return f"{head.removesuffix(f'.{ADAPTER}')}.{suffix}"


def _lora_layer(target: _Node, r: int, lora_bias: bool) -> _Node:
    """PEFT's LoRA layer in place of ``target``: ``base_layer`` (the target itself), then lora_A / lora_B
    (ModuleDicts of nn.Linear) or lora_embedding_A / _B (ParameterDicts), trainable."""
    layer = _Node()
    layer.lora = True
    layer.children["base_layer"] = target
    a, b = _Node(), _Node()
    ea, eb = _Node(), _Node()
    if target.kind == "embedding":
        if lora_bias:
            raise _Refuse("lora_bias on an Embedding target: PEFT refuses it, so no run had it")
        ea.params[ADAPTER] = _Param((r, target.in_f), True)
        eb.params[ADAPTER] = _Param((target.out_f, r), True)
    else:
        la = _Node("linear", in_f=target.in_f, out_f=r)
        la.params["weight"] = _Param((r, target.in_f), True)
        lb = _Node("linear", in_f=r, out_f=target.out_f)
        lb.params["weight"] = _Param((target.out_f, r), True)
        if lora_bias:
            lb.params["bias"] = _Param((target.out_f,), True)
        a.children[ADAPTER] = la
        b.children[ADAPTER] = lb
    layer.children["lora_dropout"] = _Node()
    layer.children["lora_A"] = a
    layer.children["lora_B"] = b
    layer.children["lora_embedding_A"] = ea
    layer.children["lora_embedding_B"] = eb
    return layer


def _deepcopy(node: _Node) -> _Node:
    """``copy.deepcopy`` of a module: new modules and parameters (trainable), sharing kept within the copy."""
    nodes: dict[int, _Node] = {}
    params: dict[int, _Param] = {}

    def cp(n: _Node) -> _Node:
        c = nodes.get(id(n))
        if c is not None:
            return c
        c = nodes[id(n)] = _Node(n.kind, layernorm=n.layernorm, in_f=n.in_f, out_f=n.out_f)
        c.lora = n.lora
        for k, p in n.params.items():
            q = params.get(id(p))
            if q is None:
                q = params[id(p)] = _Param(p.shape, True)
            c.params[k] = q
        for k, ch in n.children.items():
            c.children[k] = cp(ch)
        return c

    return cp(node)


def _lookup(root: _Node, key: str) -> tuple[_Node, str, _Node]:
    """(parent, attribute, module) of dotted ``key`` in the tree as it is now (``_get_submodules``)."""
    parts = key.split(".")
    parent = root
    for p in parts[:-1]:
        nxt = parent.children.get(p)
        if nxt is None:
            raise _Refuse(f"PEFT would not find module {visible(key)!r} while wrapping the model")
        parent = nxt
    target = parent.children.get(parts[-1])
    if target is None:
        raise _Refuse(f"PEFT would not find module {visible(key)!r} while wrapping the model")
    return parent, parts[-1], target


def wrap_peft(base: _Node, out_name: Optional[str], cfg: LoraConfig) -> tuple[_Node, dict[int, str]]:
    """The PeftModel's tree around ``base`` (frozen), and PEFT's saved name of each trainable parameter
    (keyed by the parameter's id)."""
    unsupported = cfg.unsupported_for_merge()
    if unsupported:
        raise _Refuse(f"the adapter uses {', '.join(unsupported)}: PEFT's wrapping of it is not emulated")
    if cfg.raw.get("ensure_weight_tying"):
        raise _Refuse("the adapter uses ensure_weight_tying: PEFT's wrapping of it is not emulated")
    targets = _names_list(cfg.target_modules, "target_modules")
    if targets is None or targets == []:
        raise _Refuse("adapter_config.json records no target_modules")
    for _, p in _named_parameters_of(base):
        p.trainable = False
    keys = [(k, n) for k, n in _named_modules(base) if k]
    if isinstance(targets, str) and targets.lower() == INCLUDE_LINEAR_LAYERS_SHORTHAND:
        # _maybe_include_all_linear_layers: every Linear / Conv1D by full name, less the output embedding
        targets = [k for k, n in keys if n.kind in ("linear", "conv1d") and k != out_name]
    match = _Matcher(cfg, targets)
    saved: dict[int, str] = {}
    replaced = 0
    for key, _ in keys:
        if not match(key):
            continue
        parent, attr, target = _lookup(base, key)
        if target.kind in _OTHER_LORA_KINDS:
            raise _Refuse(f"target module {visible(key)!r} is a {target.kind} layer: PEFT's LoRA of it is not emulated")
        if target.kind not in _LORA_KINDS:
            raise _Refuse(f"target module {visible(key)!r} is not a Linear, Conv1D or Embedding: PEFT would refuse it")
        layer = _lora_layer(target, cfg.rank(key), cfg.lora_bias)
        parent.children[attr] = layer
        replaced += 1
        for sub, node in (("lora_A", "weight"), ("lora_B", "weight"), ("lora_B", "bias")):
            lp = layer.children[sub].children.get(ADAPTER, _Node()).params.get(node)
            if lp is not None:
                saved[id(lp)] = _remove_adapter_name(f"{ROOT}{key}.{sub}.{ADAPTER}.{node}")
        for sub in ("lora_embedding_A", "lora_embedding_B"):
            ep = layer.children[sub].params.get(ADAPTER)
            if ep is not None:
                saved[id(ep)] = _remove_adapter_name(f"{ROOT}{key}.{sub}.{ADAPTER}")
    if not replaced:
        raise _Refuse("no module of the model matches the adapter's target_modules (PEFT would have refused it)")
    lora_model = _Node()
    lora_model.children["model"] = base
    root = _Node()
    root.children["base_model"] = lora_model
    if cfg.modules_to_save:
        _wrap_modules_to_save(root, cfg.modules_to_save, saved)
    return root, saved


def _named_parameters_of(root: _Node) -> list[tuple[str, _Param]]:
    return [(n, p) for n, p, _ in _decay_named_parameters(root)]


def _wrap_modules_to_save(root: _Node, names: list[str], saved: dict[int, str]) -> None:
    """PEFT's ``_set_trainable``: every module whose PeftModel name ends with an entry (a plain string suffix)
    becomes a ModulesToSaveWrapper of the frozen original and a trainable deep copy."""
    all_keys = [k for k, _ in _named_modules(root, remove_duplicate=False)]
    matched = [k for k in all_keys if any(k.endswith(t) for t in names)]
    for key in matched:
        if not key.startswith(ROOT):
            raise _Refuse(f"modules_to_save matches {visible(key or '(the model)')!r}, outside the base model")
        if any(o != key and key.startswith(o + ".") for o in matched):
            raise _Refuse(f"modules_to_save matches {visible(key)!r} inside another module it matches")
    for key in matched:
        parent, attr, target = _lookup(root, key)
        node, on_path = root, False
        for part in key.split("."):
            node = node.children[part]
            on_path = on_path or node.lora
        if on_path or any(n.lora for _, n in _named_modules(target)):
            raise _Refuse(f"modules_to_save {visible(key)!r} is, holds or lies in a LoRA layer; not emulated")
        if target.kind == "mts":
            continue  # the same module under a second name: wrapped once (PEFT updates the wrapper)
        wrapper = _Node("mts")
        copy = _deepcopy(target)
        wrapper.children["original_module"] = target
        md = _Node()
        md.children[ADAPTER] = copy
        wrapper.children["modules_to_save"] = md
        parent.children[attr] = wrapper
        for name, p in _named_parameters_of(copy):
            saved[id(p)] = _remove_adapter_name(f"{key}.{name}")


# -- the order ---------------------------------------------------------------------------------------------------


def trainer_param_order(
    config_path: Path,
    *,
    adapter_config: Optional[LoraConfig] = None,
    weight_decay: float,
    link_root: Optional[Path] = None,
    vocab_size: Optional[int] = None,
) -> TrainerOrder:
    """The Trainer's optimizer groups of a run of the model ``config_path`` describes (the base's config.json
    for a PEFT run, with its ``adapter_config``), ``weight_decay`` that of the decay group; ``why_not`` set
    where none can be derived. ``link_root``: see :func:`read_model_config`; ``vocab_size``: the run's, where it
    resized the base's embedding."""
    try:
        doc = read_model_config(config_path, link_root=link_root)
        if vocab_size is not None:  # the run resized the embedding (resize_token_embeddings) before wrapping it
            doc = dict(doc, vocab_size=vocab_size)
        base, out_name, cls = build_tree(doc)
        if adapter_config is None:
            root, saved, what = base, {}, f"full fine-tuning of {cls}"
        else:
            root, saved, what = (*wrap_peft(base, out_name, adapter_config), f"a LoRA adapter on {cls}")
    except _Refuse as e:
        return _refused(str(e))
    decay: list[str] = []
    rest: list[str] = []
    shapes: dict[str, tuple[int, ...]] = {}
    names: dict[str, str] = {}
    for name, p, d in _decay_named_parameters(root):
        if not p.trainable:
            continue
        (decay if d else rest).append(name)
        shapes[name] = p.shape
        names[name] = saved.get(id(p), name)
    if not decay and not rest:
        return _refused("the model has no trainable parameter")
    return TrainerOrder(
        [decay, rest], [float(weight_decay), 0.0], None, shapes, names, what, adapter_config is not None
    )


def check_against(
    order: TrainerOrder,
    groups_sizes: list[int],
    groups_wd: list[float],
    state_shapes: dict[int, tuple[int, ...]],
    shapes: dict[str, tuple[int, ...]],
    *,
    saved: Optional[dict[str, tuple[int, ...]]] = None,
    saved_what: str = "the weights beside it",
) -> Optional[str]:
    """None where ``order`` is the optimizer's (its ``param_groups`` sizes and weight_decay, the shape of the
    state of index i, ``shapes`` of the order's names); else which check failed. ``saved``: the (name, shape) of
    the weights the checkpoint saved beside the optimizer (``saved_what``), which hold every name the order gives,
    in that shape (a config that disagrees with the run names what the run did not train)."""
    if order.why_not is not None:
        return order.why_not
    if len(groups_sizes) != len(order.groups) or len(groups_wd) != len(order.groups):
        return f"the optimizer has {len(groups_sizes)} param groups, the Trainer makes {len(order.groups)}"
    for i, (want, size, wd, owd) in enumerate(zip(order.groups, groups_sizes, groups_wd, order.weight_decay)):
        if size != len(want):
            return (
                f"param group {i} holds {size} parameters, the Trainer's "
                f"{'decay' if i == 0 else 'no-decay'} group of this model {len(want)}"
            )
        if wd != owd:
            return (
                f"param group {i} has weight_decay {wd}, the Trainer's {'decay' if i == 0 else 'no-decay'} group {owd}"
            )
    flat = [n for g in order.groups for n in g]
    for i, shape in sorted(state_shapes.items()):
        if not 0 <= i < len(flat):
            return f"the optimizer has state for index {i}, beyond its {len(flat)} parameters"
        have = shapes.get(flat[i])
        if have != tuple(shape):
            return (
                f"the state of index {i} has shape {tuple(shape)}, the Trainer's parameter {i} "
                f"({visible(order.saved.get(flat[i], flat[i]))}) {have}"
            )
    if saved is not None:
        for n in flat:
            name = order.saved.get(n, n)
            if name not in saved:
                return f"{saved_what} holds no {visible(name)}, which the Trainer's order names"
            if tuple(saved[name]) != shapes.get(n):
                return (
                    f"{visible(name)} is {tuple(saved[name])} in {saved_what}, {shapes.get(n)} in the Trainer's order"
                )
    return None
