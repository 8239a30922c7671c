"""A pure, printable export plan: which source tensor goes to which output file, how many bytes."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from operator import attrgetter
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from ..dtypes import ITEMSIZE, ST_CODE, short_dtype
from ..formats.unpickle import gc_paused
from ..fsutil import regular_inside
from ..storage import Location, LocationLike, as_path, is_url
from ..types import Plan, PlanStep, in_user_form
from .prefix import PrefixChoice
from .sources import Source, SourceTensor

DTYPES = {"keep": None, "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
FLOATS = {"float32", "float16", "bfloat16", "float64"}
DEFAULT_MAX_SHARD = "50GB"  # transformers 5.x save_pretrained
CONFIG_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.txt",
    "spiece.model",
    "tiktoken.model",
    "sentencepiece.bpe.model",
    "spm.model",
    "preprocessor_config.json",
)
# the files of a tokenizer among them: what transformers' AutoTokenizer.from_pretrained reads from a folder
# (transformers 5: tokenization_utils_base's tokenizer_config, special_tokens_map, added_tokens, tokenizer.json and
# chat_template.jinja, the legacy chat_template.json; the vocab_files_names of the Llama, GPT-2/Qwen2, BERT, T5,
# XLM-R and tiktoken tokenizers; find_sentencepiece_model_file's spm.model). A merged model and a --to hf folder
# take them from one folder
TOKENIZER_FILES = tuple(
    n for n in CONFIG_FILES if n not in ("config.json", "generation_config.json", "preprocessor_config.json")
)


def parse_size(text: Union[int, str]) -> int:
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 5GB, 500MB, 2GiB)")
    n = float(m.group(1))
    unit = (m.group(2) or "B").upper()
    mult = {
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }[unit]
    return int(n * mult)


@dataclass
class OutTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # output dtype
    src: SourceTensor
    # a computed tensor (a LoRA merge): the BLAKE2b digest of the bytes the writer wrote, which verification
    # compares the file with instead of computing the merge a second time
    written_digest: Optional[bytes] = field(default=None, compare=False, repr=False)

    @cached_property
    def nbytes(self) -> int:  # asked ~10 times per tensor by a plan: once (a header of 10^6 tensors)
        return prod(map(int, self.shape)) * ITEMSIZE[self.dtype]


@dataclass
class OutFile:
    name: str
    tensors: list[OutTensor]

    @property
    def nbytes(self) -> int:
        return sum(map(attrgetter("nbytes"), self.tensors))


@dataclass
class ExportPlan:
    source: Source
    out: Path
    files: list[OutFile]
    index: bool
    copies: list[tuple[Location, str]] = field(default_factory=list)  # (source file, name in out)
    dropped_tied: list[tuple[str, str]] = field(default_factory=list)  # (alias, written name)
    excluded: list[str] = field(default_factory=list)
    missing_config: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dtype: str = "keep"
    out_given: str = ""  # --out as the user typed it (relative stays relative): what messages and snippets show
    src_given: str = ""  # SRC as the user typed it: source paths in the plan follow its form
    prefix: Optional[PrefixChoice] = None  # the wrapper prefix decision (Lightning)
    stem: str = "model"  # output files: <stem>.safetensors, or shards + <stem>.safetensors.index.json
    extra_files: list[tuple[str, str]] = field(default_factory=list)  # (name in out, text): written beside them
    not_copied: list[tuple[str, Path, str]] = field(default_factory=list)  # side files refused: (name, folder, why)
    # a merge reads two sources: the base (``source``) and the adapter, whose files and folder these are
    also_read: list[Location] = field(default_factory=list)
    also_folders: list[Path] = field(default_factory=list)
    load_base: Optional[str] = None  # an adapter export: the base the load code builds (a folder or hub id)
    load_vocab: Optional[int] = None  # an adapter export of a run that added tokens: the base resized to this first

    @property
    def index_name(self) -> str:
        return f"{self.stem}.safetensors.index.json"

    @property
    def tensor_bytes(self) -> int:
        return sum(f.nbytes for f in self.files)

    @property
    def total_bytes(self) -> int:
        return self.tensor_bytes + sum(p.stat().st_size for p, _ in self.copies)

    @property
    def output_bytes(self) -> int:
        """The bytes the export writes, exactly: each safetensors file (header and tensors), the index of a
        sharded output, the copied config files. The free space an export needs (the CLI's preflight and
        the TUI wizard ask this); ``total_bytes`` leaves out headers and index."""
        out = sum(len(header_bytes(f)) + f.nbytes for f in self.files)
        if self.index:
            out += len(index_text(self).encode())
        out += sum(len(text.encode()) for _, text in self.extra_files)
        return out + sum(p.stat().st_size for p, _ in self.copies)

    @property
    def params(self) -> int:
        return sum(t.src.numel for f in self.files for t in f.tensors)

    def shown(self, p: object) -> str:
        """A source path as the user can type it: relative to their folder if they named SRC by a relative
        path, else absolute."""
        return in_user_form(self.src_given, p)

    def to_plan(self) -> Plan:
        src = self.shown(self.source.path)
        steps = [PlanStep("write", f.name, src, f.nbytes, f"{len(f.tensors)} tensors") for f in self.files]
        if self.index:
            steps.append(PlanStep("write", self.index_name, None, 0, "weight_map of every tensor"))
        steps += [PlanStep("write", name, None, len(text.encode())) for name, text in self.extra_files]
        steps += [PlanStep("copy", name, self.shown(p), p.stat().st_size) for p, name in self.copies]
        notes = list(self.notes)
        notes += [f"{name} in {self.shown(d)} was not copied: {why}" for name, d, why in self.not_copied]
        notes += [f"tied: {a} is {b} (written once, as save_pretrained does)" for a, b in self.dropped_tied]
        if self.missing_config:
            notes.append("no " + ", ".join(self.missing_config) + " found: " + _missing_text(self.missing_config))
        return Plan(f"Export {src} -> {self.out_given or self.out} ({self.dtype})", tuple(steps), tuple(notes))


def header_bytes(f: OutFile) -> bytes:
    """The safetensors header of ``f`` as written: 8-byte length, JSON, padded to 8 bytes."""
    hdr: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in f.tensors:
        end = off + t.nbytes
        hdr[t.name] = {"dtype": ST_CODE[t.dtype], "shape": list(t.shape), "data_offsets": [off, end]}
        off = end
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def index_text(plan: ExportPlan) -> str:
    """``<stem>.safetensors.index.json`` of a sharded output, as written."""
    wm = {t.name: f.name for f in plan.files for t in f.tensors}
    return json.dumps({"metadata": {"total_size": plan.tensor_bytes}, "weight_map": wm}, indent=2)


def _missing_text(missing: list[str]) -> str:
    if "config.json" in missing:
        return (
            "the output loads into your model with load_state_dict; for from_pretrained pass --config PATH "
            "(the model's config.json)"
        )
    return "from_pretrained will use defaults for these"


def out_dtype(t: SourceTensor, dtype: str, source_kind: str) -> str:
    want = DTYPES[dtype]
    if want is None:
        # DeepSpeed exports are fp32 masters; frozen weights taken from bf16 module weights join them in fp32
        if source_kind == "deepspeed" and t.frozen and t.dtype in FLOATS:
            return "float32"
        return t.dtype
    return want if t.dtype in FLOATS else t.dtype


def make_plan(
    source: Source,
    out: Path,
    *,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = DEFAULT_MAX_SHARD,
    exclude_frozen: bool = False,
    config_dirs: Sequence[LocationLike] = (),
    config_path: Optional[Path] = None,
    stem: str = "model",
) -> ExportPlan:
    """``stem``: "model", or "optimizer" for an optimizer export (no config files are looked for)."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}")
    limit = parse_size(max_shard_size)
    outs: list[OutTensor] = []
    dropped: list[tuple[str, str]] = []
    excluded = list(source.excluded)
    names = {t.name for t in source.tensors}
    with gc_paused():  # 10^6 tensors: no cyclic GC passes over them while they are made (nothing here is a cycle)
        for t in source.tensors:
            if exclude_frozen and t.frozen:
                excluded.append(t.name)
                continue
            if t.tied_to is not None and t.tied_to in names:
                dropped.append((t.name, t.tied_to))
                continue
            outs.append(OutTensor(t.name, t.shape, out_dtype(t, dtype, source.kind), t))
    seen: set[str] = set()
    for o in outs:
        if o.name in seen:
            raise ValueError(f"two source tensors map to the output name {o.name!r}; use --strip-prefix carefully")
        seen.add(o.name)
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for o in outs:
        if groups[-1] and size + o.nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(o)
        size += o.nbytes
    n = len(groups)
    files = [
        OutFile(f"{stem}.safetensors" if n == 1 else f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors", g)
        for i, g in enumerate(groups)
    ]
    plan = ExportPlan(source, Path(out), files, n > 1, dropped_tied=dropped, excluded=excluded, dtype=dtype, stem=stem)
    plan.notes.extend(source.notes)
    if source.train_dtype and source.train_dtype != "float32" and dtype == "keep":
        short = short_dtype(source.train_dtype)
        upcast = [o for o in outs if o.src.frozen and o.src.dtype != o.dtype and o.dtype == "float32"]
        if upcast:
            listed = ", ".join(o.name for o in upcast[:4]) + (", ..." if len(upcast) > 4 else "")
            plan.notes.append(
                f"the run trained in {short}; these are its fp32 master weights, except {len(upcast)} "
                f"frozen parameter(s) that have none ({listed}): stored in "
                f"{short_dtype(upcast[0].src.dtype)}, written upcast to fp32 — --dtype {short} "
                "halves the size"
            )
        else:
            plan.notes.append(
                f"the run trained in {short}; these are its fp32 master weights — --dtype {short} halves the size"
            )
    for t in source.tensors:
        if t.note and t.note not in plan.notes and "torch DCP" in t.note:
            plan.notes.append(f"some tensors {t.note}")
            break
    if stem == "model":
        _find_configs(plan, list(config_dirs), config_path)
    return plan


SIDE_JSON_MAX = 16 << 20  # what the inspector reads of a JSON file


def side_file_problem(p: Location, folder: Path) -> Optional[str]:
    """Why the side file ``p`` (config, tokenizer), found in ``folder``, is not copied into an export, or
    None: only a regular file whose real path lies inside ``folder`` (a symbolic link to a file elsewhere,
    someone's private file, is not); a ``.json`` one must be JSON, as the inspector reads it. ``p`` is a local
    file (a remote one is not checked: :func:`_find_configs`)."""
    why = regular_inside(str(p), folder)  # a local path's str is its os.fspath
    if why is not None or p.suffix != ".json":
        return why
    try:
        if p.stat().st_size > SIDE_JSON_MAX:
            return "it is larger than a config file can be"
        json.loads(p.read_bytes())
    except (OSError, ValueError):
        return "it is not valid JSON (corrupt)"
    return None


def _find_configs(plan: ExportPlan, dirs: list[LocationLike], config_path: Optional[Path]) -> None:
    found: dict[str, Location] = {}
    if config_path is not None:
        cp = Path(config_path)
        if cp.is_file():
            found[cp.name if cp.name in CONFIG_FILES else "config.json"] = cp
            dirs = [cp.parent] + dirs
        elif cp.is_dir():
            dirs = [cp] + dirs
        else:
            raise FileNotFoundError(f"--config {cp}: no such file or folder")
    for d in dirs:
        for name in CONFIG_FILES:
            p = as_path(d) / name
            if name in found or not p.is_file():
                continue
            # not a URL: a local folder, whose str is its os.fspath
            why = None if is_url(p) else side_file_problem(p, Path(str(d)))
            if why is not None:  # never copied: said, and a later folder's may still be taken
                plan.not_copied.append((name, Path(str(d)), why))
                continue
            found[name] = p
    plan.copies = [(p, name) for name, p in found.items()]
    plan.missing_config = [n for n in ("config.json",) if n not in found]
