"""The files beside the weights: ``latest`` markers, trainer state, configs, tokenizer files,
scripts and text. Detected by name; markers and JSON add facts; they hold no tensors."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any, Literal, Optional, cast

from ...facts import DirFacts, JsonFacts, LeftoverFacts, NodeFacts, SpecialFacts, TextFacts
from ...storage import open_read
from ...types import Finding, Inventory, Node, Parsed
from ...units import naturalsize
from ..format import FileFormat, Format
from .findings import leftover_finding

MAX_TEXT_BYTES = 4096
MAX_JSON_BYTES = 16 * 1024 * 1024
# a fact copied from a JSON file is bounded whatever the file says: strings cut to MAX_FACT_CHARS (ending "…"),
# lists and objects to their first MAX_FACT_ITEMS, nesting to MAX_FACT_DEPTH
MAX_FACT_CHARS = 1024
MAX_FACT_ITEMS = 32
MAX_FACT_DEPTH = 4
# the facts copied from trainer_state.json, config.json and (DCP's) metadata.json
TRAINER_STATE_KEYS: tuple[Literal["global_step", "epoch", "max_steps", "best_model_checkpoint"], ...] = (
    "global_step",
    "epoch",
    "max_steps",
    "best_model_checkpoint",
)
CONFIG_KEYS: tuple[Literal["model_type", "architectures", "torch_dtype", "dtype", "tie_word_embeddings"], ...] = (
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
)
METADATA_KEYS: tuple[Literal["sharded_backend", "sharded_backend_version", "common_backend"], ...] = (
    "sharded_backend",
    "sharded_backend_version",
    "common_backend",
)
MARKERS = ("latest", "latest_universal", "latest_checkpointed_iteration.txt")
TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.txt",
    "spiece.model",
    "chat_template.jinja",
}


class PlainFiles(FileFormat):
    formats = {"json": JsonFacts, "text": TextFacts, "python": NodeFacts}
    shown = False

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        if name in MARKERS:
            return "text", "marker"
        if name == "trainer_state.json":
            return "json", "trainer-state"
        if name in TOKENIZER_FILES or low.startswith("tokenizer"):
            return ("json" if low.endswith(".json") else "text"), "tokenizer"
        if low.endswith(".json"):
            if name == "metadata.json":
                return "json", "metadata"
            return "json", "config" if "config" in low else "unknown"
        if low.endswith(".py"):
            return "python", "script"
        return None

    def analyze(self, node: Node, parsed: Parsed) -> None:
        if node.format == "text" and node.role == "marker":
            with open_read(node.abspath) as f:
                raw = f.read(MAX_TEXT_BYTES)
            cast(TextFacts, node.facts)["names"] = raw.decode("utf-8", errors="replace").strip()
        elif node.format == "json":
            _json_facts(node)


class TextFiles(FileFormat):
    """Text by extension; tried after the torch file names (``rng_state.txt`` is not text)."""

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        if low.endswith((".txt", ".md", ".yaml", ".yml", ".log")):
            return "text", "unknown"
        return None


def bounded(v: Any, depth: int = 0) -> Any:
    """``v`` (a value from a JSON document) cut to the sizes above."""
    if isinstance(v, str):
        return v if len(v) <= MAX_FACT_CHARS else v[: MAX_FACT_CHARS - 1] + "…"
    if isinstance(v, (list, dict)) and depth >= MAX_FACT_DEPTH:
        return "…"
    if isinstance(v, list):
        return [bounded(x, depth + 1) for x in v[:MAX_FACT_ITEMS]]
    if isinstance(v, dict):
        return {bounded(k): bounded(x, depth + 1) for k, x in islice(v.items(), MAX_FACT_ITEMS)}
    return v


_LOG_OPEN = b'\n  "log_history": ['
_LOG_CLOSE = b"\n  ]"


def _trainer_state_head(raw: bytes) -> Optional[dict[str, Any]]:
    """A ``trainer_state.json`` as the HF Trainer writes it (``json.dumps(indent=2, sort_keys=True)``) without its
    ``log_history``, which is most of the file and none of the facts (``TRAINER_STATE_KEYS``): the array spliced
    out where it opens and closes at the top level's indent (JSON strings hold no raw newline, so the first
    ``\\n  ]`` after it opens is its end). ``None`` where the file is not laid out so, or the rest is no JSON
    object: the caller parses it whole (a truncated file is then ``corrupt`` as before). The history itself is
    parsed where it is used: the run view reads the newest complete checkpoint's."""
    start = raw.find(_LOG_OPEN)
    if start < 0 or raw[start + len(_LOG_OPEN) : start + len(_LOG_OPEN) + 1] != b"\n":
        return None  # no history, or an empty one (``[]``): its close is no line of its own
    end = raw.find(_LOG_CLOSE, start + len(_LOG_OPEN))
    if end < 0:
        return None
    try:
        doc = json.loads(raw[:start] + b'\n  "log_history": []' + raw[end + len(_LOG_CLOSE) :])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _json_facts(node: Node) -> None:
    f = cast(JsonFacts, node.facts)
    if node.size > MAX_JSON_BYTES:
        f.update(
            JsonFacts(error=f"JSON file larger than {naturalsize(MAX_JSON_BYTES)}; not read", error_kind="too-large")
        )
        return
    try:
        raw = node.abspath.read_bytes()
        doc = _trainer_state_head(raw) if node.role == "trainer-state" else None
        if doc is None:
            doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        f.update(JsonFacts(error=f"not valid JSON: {e}", error_kind="corrupt"))
        return
    if not isinstance(doc, dict):
        return
    if node.role == "trainer-state":
        for k in TRAINER_STATE_KEYS:
            if doc.get(k) is not None:
                f[k] = bounded(doc[k])
    elif node.name == "config.json":
        for c in CONFIG_KEYS:
            if doc.get(c) is not None:
                f[c] = bounded(doc[c])
    elif node.name == "adapter_config.json":
        f["peft_type"] = bounded(doc.get("peft_type"))
        node.role = "config"
    elif node.name == "metadata.json":
        for m in METADATA_KEYS:
            if m in doc:
                f[m] = bounded(doc[m])


# ---------------------------------------------------------------- pseudo-formats: what the walk names itself


class PlainFolder(Format):
    """A folder of no format (``dir``): what it is comes from what it holds."""

    formats = {"dir": DirFacts}
    plain_folder = True
    shown = False


class UnknownFile(Format):
    """A file no format names (``unknown``)."""

    formats = {"unknown": NodeFacts}
    shown = False


class SpecialFile(Format):
    """A FIFO, socket or device (``special``): named by the walk, never opened."""

    formats = {"special": SpecialFacts}
    from_walk = True


class Leftover(Format):
    """What a killed ckpt-tui run left (``leftover``: a temp file or folder, see ``leftovers.py``): named by the
    walk, never read; diagnose reports it with the command that removes it."""

    formats = {"leftover": LeftoverFacts}
    from_walk = True

    def findings(self, inv: Inventory, node: Node) -> list[Finding]:
        return [leftover_finding(inv, node)]
