"""Export a LoRA adapter: as PEFT saves it (``adapter_model.safetensors`` + ``adapter_config.json``), or merged
into its base model as a Hugging Face folder (``--merge``).

    plan = plan_adapter(info, source, out)                 # the adapter, under get_peft_model_state_dict's names
    plan = plan_merge(info, out, base=Path("base-model"))  # the base with every LoRA layer merged

The adapter's tensors are renamed only (:mod:`..adapters.names`); a merged weight is computed in row blocks
(:mod:`.merge`); every other tensor of the base is copied by byte range. Imports neither peft nor transformers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ..adapters.base import model_folder_problem
from ..adapters.config import CONFIG_NAME, UNREADABLE, LoraConfig
from ..adapters.found import AdapterInfo, config_places
from ..safetext import visible
from ..storage import Location, as_path
from .plan import CONFIG_FILES, TOKENIZER_FILES, ExportPlan, make_plan, side_file_problem
from .sources import Source, SourceTensor
from .write import ExportError

ADAPTER_STEM = "adapter_model"
NO_SHARDS = 1 << 62  # PEFT reads one adapter_model.safetensors: an adapter is never sharded
# module names of input embeddings and output heads, whose weights a model may tie
TIEABLE = ("lm_head", "embed_tokens", "wte", "word_embeddings", "embed_in", "embed_out", "tok_embeddings", "output")


def _what_read(info: AdapterInfo) -> str:
    ranks = sorted({m.rank for m in info.layout.modules})
    return f"r={'/'.join(map(str, ranks))} on {visible(', '.join(info.layout.targets()))}"


def need_config(info: AdapterInfo, given: str) -> ExportError:
    """The refusal of an adapter export without an adapter_config.json (FSDP and DeepSpeed saves write none)."""
    looked = ", ".join(visible(str(p)) for p in info.config_looked[:4])
    why = visible(info.config_error) if info.config_error else f"no {CONFIG_NAME} (looked: {looked})"
    return ExportError(
        f"{given} holds a LoRA adapter ({_what_read(info)}; {len(info.layout.modules)} layers), but {why}. "
        f"Its tensors do not say {', '.join(UNREADABLE)}, which PEFT needs to load it: give the run's "
        f"{CONFIG_NAME} with --adapter-config PATH"
    )


def adapter_tensors(source: Source, info: AdapterInfo, given: str) -> dict[str, SourceTensor]:
    """PEFT saved name -> the source tensor holding it. The inspection named the tensors as the file lists them
    (a DCP folder's under its ``model.`` container); the source may have taken the container off. Every adapter
    tensor must be there: an adapter export never writes fewer tensors than the adapter has."""
    saved = info.layout.saved
    prefix = info.layout.prefix
    out: dict[str, SourceTensor] = {}
    for t in source.tensors:
        for listed in (t.listed_as, t.name, prefix + t.name if prefix else None):
            if listed is not None and listed in saved:
                out[saved[listed]] = t
                break
    missing = sorted(set(saved.values()) - set(out))
    if missing:
        raise ExportError(
            f"{given}: {len(missing)} of the adapter's {len(saved)} tensors are not in what its format reads "
            f"(e.g. {visible(missing[0])}); nothing was written"
        )
    return out


def _renamed(source: Source, info: AdapterInfo, given: str) -> Source:
    by_saved = adapter_tensors(source, info, given)
    tensors = [replace(t, name=name, tied_to=None, listed_as=None) for name, t in by_saved.items()]
    notes = list(source.notes)
    if info.layout.container != "peft":
        notes.append("named as PEFT's get_peft_model_state_dict names them (the adapter name `.default` dropped)")
    return replace(source, tensors=tensors, notes=notes, excluded=[])


def _config_text(cfg: LoraConfig) -> str:
    assert cfg.path is not None
    return as_path(cfg.path).read_bytes().decode("utf-8")


def plan_adapter(
    info: AdapterInfo, source: Source, out: Path, *, dtype: str = "keep", given: str = "the checkpoint"
) -> ExportPlan:
    """The adapter export: ``adapter_model.safetensors`` with get_peft_model_state_dict's keys and values, and the
    adapter_config.json it was trained with."""
    if info.config is None:
        raise need_config(info, given)
    plan = make_plan(_renamed(source, info, given), out, dtype=dtype, max_shard_size=NO_SHARDS, stem=ADAPTER_STEM)
    plan.extra_files.append((CONFIG_NAME, _config_text(info.config)))
    plan.load_base = info.base.recorded if info.base is not None else None
    if info.base is not None and info.base.found is not None:
        plan.load_base = info.shown(info.base.found)
    plan.load_vocab = _resized_vocab(info)
    return plan


def _resized_vocab(info: AdapterInfo) -> Optional[int]:
    """The rows of the embedding the run saved (modules_to_save) where it resized the base's (new tokens), so
    the base must be resized before PEFT loads the adapter onto it; None where it did not or cannot be told."""
    layout = info.layout
    rows = {
        layout.shapes[saved][0]
        for name, saved in layout.modules_to_save.items()
        if _tieable(name.rsplit(".", 1)[0]) and len(layout.shapes.get(saved, ())) == 2
    }
    if len(rows) != 1:
        return None
    (vocab,) = rows
    if info.base is not None and info.base.found is not None:
        try:
            known = _base_config(Path(info.base.found)).get("vocab_size")
        except ExportError:
            known = None
        if isinstance(known, int) and not isinstance(known, bool):
            return vocab if known != vocab else None
    # no base to compare with: PEFT saved the wrapper's copies only because it found the embedding resized
    return vocab if layout.wrapper_copies else None


# ---------------------------------------------------------------- merge


def read_files(source: Source) -> list[Location]:
    """The files a merge reads of the adapter: its byte ranges' files; every file of its folder where a tensor
    is loaded otherwise (a DeepSpeed tag's partitions)."""
    files: set[Path] = {Path(r.path) for t in source.tensors for r in (t.ranges or ())}
    if any(t.ranges is None for t in source.tensors):
        root = Path(str(source.path))
        root = root if root.is_dir() else root.parent
        files |= {p for p in root.iterdir() if p.is_file()}
    return list(sorted(files))


def _tied(config: dict[str, Any], names: set[str]) -> bool:
    tie = config.get("tie_word_embeddings")
    if isinstance(tie, bool):
        return tie
    return "lm_head.weight" not in names  # no head of its own: it shares the embedding's


def _tieable(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in TIEABLE


# transformers' models whose layers are Conv1D (weight stored (in, out)), and those layers' names (transformers 5:
# models/{gpt2,openai,imagegpt,decision_transformer,clvp}/modeling_*.py); every other layer of theirs is nn.Linear
CONV1D_LAYERS: dict[str, frozenset[str]] = {
    "gpt2": frozenset({"c_attn", "q_attn", "c_proj", "c_fc"}),
    "openai-gpt": frozenset({"c_attn", "c_proj", "c_fc"}),
    "imagegpt": frozenset({"c_attn", "q_attn", "c_proj", "c_fc"}),
    "decision_transformer": frozenset({"c_attn", "q_attn", "c_proj", "c_fc"}),
    "clvp": frozenset({"c_fc", "c_proj"}),
}


def fan_in_fan_out(config: dict[str, Any], module: str, saved: bool) -> Optional[bool]:
    """Whether PEFT merged ``module``'s LoRA transposed: it decides per layer by the base module's type (a Conv1D
    True, an nn.Linear False, whatever the config said: it rewrites the saved ``fan_in_fan_out`` as it wraps each
    layer, so the saved value is only the last wrapped layer's). None: not knowable here (a model of remote code
    whose saved value says some layer was a Conv1D)."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in CONV1D_LAYERS:
        return module.rsplit(".", 1)[-1] in CONV1D_LAYERS[model_type]
    if config.get("auto_map") and saved:
        return None
    return False


def _base_config(folder: Path) -> dict[str, Any]:
    try:
        doc = json.loads((folder / "config.json").read_bytes())
    except (OSError, ValueError) as e:
        raise ExportError(f"the base model's config.json in {folder} cannot be read: {e}") from None
    if not isinstance(doc, dict):
        raise ExportError(f"the base model's config.json in {folder} is not a JSON object")
    return doc


def plan_merge(
    info: AdapterInfo,
    source: Source,
    out: Path,
    *,
    read_base: Callable[[Path], Source],
    base: Optional[Path] = None,
    dtype: str = "keep",
    max_shard_size: Union[int, str] = "50GB",
    given: str = "the checkpoint",
) -> ExportPlan:
    """The merged model: the base's tensors, every LoRA target's weight as PEFT's merge_and_unload computes it,
    the adapter's modules_to_save in place of the base's; the base's config (vocab_size as the adapter's
    embedding, where modules_to_save resized it), generation config and tokenizer (the checkpoint's first).
    ``read_base``: the base folder's weights as an export source, screened as every source is (export.api)."""
    from .merge import merged_bias, merged_tensor

    cfg = info.config
    if cfg is None:
        raise need_config(info, given)
    unsupported = cfg.unsupported_for_merge()
    if unsupported:
        raise ExportError(
            f"{given}: the adapter uses {', '.join(unsupported)}, which a plain LoRA merge (W + B·A·scale) does "
            "not compute; merge it with PEFT itself (merge_and_unload)"
        )
    folder = base
    if folder is None:
        lookup = info.base
        if lookup is None or lookup.found is None:
            where = "; ".join(lookup.looked) if lookup is not None and lookup.looked else "nowhere: none recorded"
            rec = f"`{visible(lookup.recorded)}`" if lookup is not None and lookup.recorded else "the base model"
            raise ExportError(
                f"--merge needs the base model: {rec} was not found (looked: {visible(where)}). "
                "Pass --base PATH (a folder holding its config.json and weights)"
            )
        folder = lookup.found
    folder = Path(folder)
    problem = model_folder_problem(folder)
    if problem is not None:
        raise ExportError(f"--base {visible(str(folder))}: {visible(problem)}")
    bsrc = read_base(folder)
    bcfg = _base_config(folder)
    by_name = {t.name: t for t in bsrc.tensors}
    names = set(by_name)
    tied = _tied(bcfg, names)
    by_saved = adapter_tensors(source, info, given)

    def adapter_tensor(saved: str) -> SourceTensor:
        return by_saved[saved]

    problems: list[str] = []
    replaced: dict[str, SourceTensor] = {}
    unknown_fifo: list[str] = []  # layers whose fan_in_fan_out cannot be known (a base of remote code)
    for m in info.layout.modules:
        if tied and _tieable(m.module):
            problems.append(f"a LoRA on `{visible(m.module)}`, whose weight the base ties to another")
            continue
        wname = f"{m.module}.weight"
        w = by_name.get(wname)
        if w is None:
            # PEFT's MultiheadAttention LoRA: another merge entirely, on the packed in_proj_weight and (always, as
            # `<mha>.base_layer.out_proj`) on its out_proj; one problem for the two
            outer = m.module.removesuffix(".base_layer.out_proj")
            mha = next((n for n in (m.module, outer) if f"{n}.in_proj_weight" in by_name), None)
            if mha is not None:
                said = f"a LoRA on the MultiheadAttention `{visible(mha)}`: not merged (PEFT only)"
                if said not in problems:
                    problems.append(said)
            else:
                problems.append(f"`{visible(wname)}` is not in the base model")
            continue
        a, b = adapter_tensor(m.a), adapter_tensor(m.b)
        layer_fifo = False if m.embedding else fan_in_fan_out(bcfg, m.module, cfg.fan_in_fan_out)
        if layer_fifo is None:
            unknown_fifo.append(m.module)
            continue
        fifo = layer_fifo
        if m.embedding:
            want = (a.shape[1], b.shape[0])
        else:
            want = (b.shape[0], a.shape[1])
            if fifo:
                want = (want[1], want[0])
        if tuple(w.shape) != want:
            problems.append(f"`{visible(wname)}` is {list(w.shape)} in the base, the LoRA on it makes {list(want)}")
            continue
        scale = cfg.scale(m.module)
        try:
            replaced[wname] = merged_tensor(w, a, b, scale, fan_in_fan_out=fifo, embedding=m.embedding)
            if m.b_bias is not None:
                bias = by_name.get(f"{m.module}.bias")
                if bias is None:
                    problems.append(f"lora_bias on `{visible(m.module)}`, which has no bias in the base")
                    continue
                replaced[bias.name] = merged_bias(bias, adapter_tensor(m.b_bias), scale)
        except ValueError as e:  # a dtype the merge does not compute, shapes that do not fit: said per layer
            problems.append(str(e))
    vocab: Optional[int] = None
    for tname, saved in info.layout.modules_to_save.items():
        t = adapter_tensor(saved)
        if tied and _tieable(tname.rsplit(".", 1)[0]):
            problems.append(f"modules_to_save `{visible(tname)}`, a weight the base ties to another")
            continue
        w = by_name.get(tname)
        if w is None:
            problems.append(f"modules_to_save `{visible(tname)}` is not in the base model")
            continue
        if tuple(w.shape) != tuple(t.shape):
            if tname.rsplit(".", 2)[-2] in TIEABLE and len(t.shape) == 2 and t.shape[1:] == w.shape[1:]:
                vocab = t.shape[0]  # the run resized the embedding (new tokens): the config follows it
            else:
                problems.append(f"modules_to_save `{visible(tname)}` is {list(t.shape)}, the base's {list(w.shape)}")
                continue
        replaced[tname] = replace(t, name=tname)
    if unknown_fifo:
        layers = ", ".join(f"`{visible(x)}`" for x in unknown_fifo[:3]) + (", …" if len(unknown_fifo) > 3 else "")
        problems.append(
            f"the base is a model of its own code (auto_map) and the adapter says fan_in_fan_out: whether its "
            f"{len(unknown_fifo)} LoRA layer(s) ({layers}) are Conv1D, merged transposed, cannot be told from files"
        )
    if problems:
        raise ExportError(
            f"cannot merge {given} into the base in {visible(str(folder))}:\n  " + "\n  ".join(problems[:8])
        )
    tensors = [replaced.get(t.name, t) for t in bsrc.tensors]
    merged = Source(
        "merged",
        bsrc.path,
        tensors,
        notes=[
            f"{len(info.layout.modules)} LoRA layers merged into the base model in {visible(info.shown(folder))} "
            "as PEFT's merge_and_unload computes them"
        ],
    )
    places = config_places(info.node)
    plan = make_plan(merged, out, dtype=dtype, max_shard_size=max_shard_size, config_dirs=[*places, folder])
    # the model config and generation config are the base's, never a checkpoint's; the tokenizer: the checkpoint's
    # first (a run that added tokens saved its own), whole: every file of it from the first folder holding one, none
    # of another's beside them (the base's special_tokens_map.json or chat template would change the run's tokenizer)
    tok_dir = next((d for d in [*places, folder] if any((d / n).is_file() for n in TOKENIZER_FILES)), None)

    def kept(name: str, where: Path) -> bool:
        return name not in TOKENIZER_FILES or where == tok_dir

    plan.copies = [
        (p, n)
        for p, n in plan.copies
        if n not in ("config.json", "generation_config.json") and kept(n, Path(str(p)).parent)
    ]
    plan.not_copied = [(n, d, why) for n, d, why in plan.not_copied if kept(n, d)]
    gen = folder / "generation_config.json"
    if gen.is_file() and side_file_problem(gen, folder) is None:
        plan.copies.append((gen, gen.name))
    if vocab is not None:
        bcfg = dict(bcfg, vocab_size=vocab)
        plan.notes.append(
            f"vocab_size {vocab}: the embedding the run saved (modules_to_save) is larger than the base's"
        )
    plan.extra_files.append(("config.json", json.dumps(bcfg, indent=2, sort_keys=True) + "\n"))
    plan.missing_config = []
    # what the plan's tensors do not point at by byte range: the adapter's files, and the base's under merged weights
    base_files = {Path(r.path) for t in bsrc.tensors for r in (t.ranges or ())}
    plan.also_read = list(dict.fromkeys([*read_files(source), *sorted(base_files)]))
    # OUT may not be, hold or lie inside what the merge reads: the adapter's component and its checkpoint (not the
    # run: a new folder beside the checkpoint is where outputs go), and the base model's folder
    comp = Path(str(info.node.abspath))
    ck = comp if comp.is_dir() else comp.parent
    if not ck.name.startswith("checkpoint-") and ck.parent.name.startswith("checkpoint-"):
        ck = ck.parent
    plan.also_folders = list(dict.fromkeys([*([comp] if comp.is_dir() else []), ck, folder.absolute()]))
    return plan


__all__ = ["plan_adapter", "plan_merge", "need_config", "ADAPTER_STEM", "CONFIG_FILES"]
