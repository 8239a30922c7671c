"""torch.save files (``pytorch_model.bin``, ``.pt``/``.pth``, Lightning ``.ckpt``, Trainer/Accelerate
state files): detected by name, analysed from the zip directory and data.pkl, exported by byte
range, checked against ``torch.load``."""

from __future__ import annotations

import reprlib
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, cast

from ...facts import TorchFileFacts, TorchZipFacts
from ...types import Node, Parsed, TensorInfo
from ..format import Described, FileFormat, set_tensor_facts
from ..unpickle import Stub, iter_tensors
from . import torchfile
from .torchfile import TorchFile, dig, is_composer, pick_state_dict

if TYPE_CHECKING:
    from ...export.sources import Source

# The facts of one torch file are bounded whatever it holds: a pickle stores an object once and refers to it
# again in two bytes, so a 470 kB file can hold keys whose text is 20 MB each (a tuple repeating one long string)
MAX_KEYS = 12  # top-level keys the `keys` fact lists (`keys_total` counts them all when there are more)
MAX_KEY_CHARS = 200  # characters of each key, tensor name or class name a fact quotes (longer: cut, ending "…")
MAX_TIED = 16  # groups of tied tensors the `tied` fact lists, and names listed per group
MAX_UNSAFE = 64  # globals `unsafe_globals` lists (sorted)

_REPR = reprlib.Repr()  # a key that is not a string: its repr built to a bounded size, never in full
_REPR.maxstring = _REPR.maxother = MAX_KEY_CHARS
_REPR.maxlong = 60

# (test, role) in order: Trainer/Accelerate state files by name, then any torch extension
_NAMED: tuple[tuple[Callable[[str, str], bool], str], ...] = (
    (lambda name, low: name == "training_args.bin", "training-args"),
    (lambda name, low: low.startswith("rng_state") or low.startswith("random_states"), "rng"),
    (lambda name, low: low.startswith("scheduler") or low.startswith("lr_scheduler"), "scheduler"),
    (lambda name, low: low.startswith("sampler") or low.startswith("dataloader"), "data-loader"),
    (lambda name, low: low.startswith("scaler"), "scaler"),
    (lambda name, low: low.startswith("optimizer"), "optimizer"),
    (lambda name, low: name == "model_optim_rng.pt", "model+optimizer"),
    (lambda name, low: name == "meta.pt", "metadata"),
    (lambda name, low: name == "common.pt", "metadata"),  # Megatron-Core torch_dist: the state every rank shares
)


def fact_text(k: Any) -> str:
    """A key or name as a fact quotes it: a string as it is, anything else as a bounded repr (a tuple key
    that repeats one long string is never built in full), at most MAX_KEY_CHARS characters."""
    try:
        text = k if isinstance(k, str) else _REPR.repr(k)
    except ValueError:  # an int of more than 4,300 digits has no str()
        text = f"<{type(k).__name__}>"
    return text if len(text) <= MAX_KEY_CHARS else text[: MAX_KEY_CHARS - 1] + "…"


def read_torch_file(node: Node) -> TorchFile:
    """Read ``node``'s structure and record what every torch file gets: unsafe globals, pickle kind."""
    tf = torchfile.read(node.abspath)
    f = cast(TorchFileFacts, node.facts)
    if tf.unsafe:
        f["unsafe_globals"] = [fact_text(g) for g in sorted(tf.unsafe)[:MAX_UNSAFE]]
    f["pickle"] = "zip" if tf.is_zip else "legacy"
    return tf


def torch_file_tensors(node: Node) -> Iterator[TensorInfo]:
    """Every tensor of the file, named as torch.load's object nests it (a file holding one bare tensor,
    as a ZeRO-3 universal ``fp32.pt`` does: by the file's name)."""
    obj = torchfile.read(node.abspath).obj
    for name, t in iter_tensors(obj):
        yield TensorInfo(name or node.name, t.shape, t.dtype, t.nbytes)


def torch_file_source(node: Node, strip_prefix: Optional[str], trust_pickles: bool) -> Source:
    from .source import torch_file_source as open_source

    return open_source(node.abspath, strip_prefix=strip_prefix, trust_pickles=trust_pickles)


def torch_load_tensors(node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
    """The reference: ``torch.load`` (unrestricted: only after the safety screen)."""
    import torch

    from ..screen import torch_load

    # torch's restricted unpickler wherever it can read the file (admitting the framework classes ckpt-tui's own
    # allowlist admits); unrestricted only for what it cannot read, a file that passed ckpt-tui's screen
    obj = torch_load(node.abspath, map_location="cpu", mmap=True)
    # the entry the export read (Lightning's `state_dict`, Megatron's `model`...), as the restricted
    # reader picks it: pick_state_dict looks for tensor references, which torch.load's output has not
    _, wrapper = pick_state_dict(torchfile.read(node.abspath).obj)
    sd = dig(obj, wrapper)
    stack = [("", sd)]
    seen = {id(sd)}  # each dict once: a graph of shared children is not walked per path
    while stack:
        prefix, d = stack.pop()
        for k, v in d.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict) and id(v) not in seen:
                seen.add(id(v))
                stack.append((name + ".", v))
            elif isinstance(v, torch.Tensor):
                yield (name[len(strip_prefix) :] if strip_prefix and name.startswith(strip_prefix) else name), v


class TorchFileFormat(FileFormat):
    """A file written by ``torch.save``: listed from its zip directory and ``data.pkl``, exported by
    byte ranges, checked against ``torch.load``. Subclasses say which files and what to analyse."""

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        return torch_file_tensors(node)

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        return torch_file_source(node, strip_prefix, trust_pickles)

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        return torch_load_tensors(node, strip_prefix)

    def loader_files(self, node: Node) -> list[Path]:
        from ..screen import local_path

        path = local_path(node.abspath)
        return [] if path.is_dir() else [path]


class TorchSave(TorchFileFormat):
    formats = {"torch-zip": TorchZipFacts}
    reference = "torch.load"
    file_layout = "torch-file"
    exportable = True
    weights_as_saved = True
    optimizer = "torch files with an optimizer state dict (Lightning .ckpt, torch.save, Accelerate optimizer.bin)"

    def describe(self, node: Node) -> Optional[Described]:
        if node.is_dir:
            return None
        if node.facts.get("weights_under") == "state.model":  # composer's Trainer (torchfile.is_composer)
            return "composer", {node.role: node.path}
        return ("lightning" if node.name.endswith(".ckpt") else "torch-file"), {node.role: node.path}

    def optimizer_source(
        self,
        node: Node,
        *,
        model_tensors: Optional[list[tuple[str, tuple[int, ...]]]] = None,
        model_what: str = "",
        trust_pickles: bool = False,
    ) -> tuple[Source, dict[str, Any], Optional[list[str]]]:
        from .optim import torch_optimizer_source

        source, config = torch_optimizer_source(
            node.abspath, model_tensors, model_what=model_what, trust_pickles=trust_pickles
        )
        return source, config, None

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        for test, role in _NAMED:
            if test(name, low):
                return "torch-zip", role
        if low.endswith((".pt", ".pth", ".bin", ".ckpt", ".pkl")):
            return "torch-zip", "model+optimizer" if low.endswith(".ckpt") else "model"
        return None

    def analyze(self, node: Node, parsed: Parsed) -> None:
        obj = read_torch_file(node).obj
        f = cast(TorchZipFacts, node.facts)
        if isinstance(obj, dict):
            f["keys"] = [fact_text(k) for k in islice(obj.keys(), MAX_KEYS)]
            if len(obj) > MAX_KEYS:
                f["keys_total"] = len(obj)
            sd, wrapper = pick_state_dict(obj)
            if wrapper:
                f["weights_under"] = wrapper
            tensors = list(iter_tensors(sd))
            if tensors:
                set_tensor_facts(node, [TensorInfo(n, t.shape, t.dtype, t.nbytes) for n, t in tensors])
                # tied weights: two names viewing one storage
                by_storage: dict[tuple[str, int, tuple[int, ...]], list[str]] = {}
                for n, t in tensors:
                    if t.storage is not None:
                        by_storage.setdefault((t.storage.key, t.offset, t.shape), []).append(n)
                tied = [v for v in by_storage.values() if len(v) > 1]
                if tied:
                    f["tied"] = [[fact_text(n) for n in names[:MAX_TIED]] for names in tied[:MAX_TIED]]
            for k in ("global_step", "iteration", "epoch"):
                if isinstance(obj.get(k), int):
                    f[k] = obj[k]
            if "optimizer_states" in obj or "optimizer" in obj or (is_composer(obj) and obj["state"].get("optimizers")):
                if tensors and node.role == "model":
                    node.role = "model+optimizer"
            if node.role == "model" and "state" in obj and "param_groups" in obj:
                node.role = "optimizer"
        elif obj is not None:
            f["object"] = fact_text(getattr(obj, "_qualname", type(obj).__name__))
            if node.role == "training-args" and isinstance(obj, Stub):  # TrainingArguments, read as data
                fields = obj.__dict__
                if isinstance(fields.get("save_only_model"), bool):
                    f["save_only_model"] = fields["save_only_model"]
                if isinstance(fields.get("metric_for_best_model"), str):
                    f["metric_for_best_model"] = fact_text(fields["metric_for_best_model"])
                if isinstance(fields.get("greater_is_better"), bool):
                    f["greater_is_better"] = fields["greater_is_better"]
                ds = fields.get("deepspeed")
                f["deepspeed"] = bool(ds) if isinstance(ds, (str, dict)) else ds is not None
