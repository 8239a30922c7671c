"""DeepSpeed checkpoints: ZeRO tag folders (``global_stepN/`` with model- and optim-states files)
and universal checkpoints (``zero/<param>/fp32.pt``). Analysed from rank 0's states files (the
other ranks get a zip-directory check), exported as the fp32 weights ``zero_to_fp32`` rebuilds,
checked against DeepSpeed's ``zero_to_fp32`` (tags) or ``torch.load`` (universal)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

from ...dtypes import short_dtype
from ...facts import (
    DeepSpeedModelStatesFacts,
    DeepSpeedOptimStatesFacts,
    DeepSpeedUniversalFacts,
    DeepSpeedZeroFacts,
    NodeFacts,
    PickleFacts,
    TensorFacts,
    TextFacts,
)
from ...names import step_of, trainer_written
from ...present import universal_summary
from ...storage import open_read
from ...types import Finding, Inventory, Node, Parsed, TensorInfo, numel
from .. import FormatError, screen
from ..format import Described, FileFormat, FolderFormat, NotExportable, set_tensor_facts
from ..torch_save import torchfile
from ..torch_save.format import MAX_UNSAFE, TorchFileFormat, fact_text, read_torch_file
from ..unpickle import TensorRef, iter_tensors
from . import reader as dsfmt
from .findings import tag_findings, universal_findings
from .moe import EXPERT_FILE_RE, expected_expert_files, experts_words

if TYPE_CHECKING:
    from ...export.sources import Source


def deepspeed_layout(f: DeepSpeedZeroFacts) -> Optional[str]:
    """What kind of DeepSpeed tag folder this is, in words: "ZeRO-2"; "ZeRO stage 0" (no ZeRO: the optimizer,
    FP16_UnfusedOptimizer or the plain torch one, inside mp_rank_00_model_states.pt); "BF16_Optimizer (ZeRO-1)";
    "pipeline parallel, N stages"."""
    st = f.get("zero_stage")
    kind = f.get("ds_layout")
    if kind == "pipeline":
        n = f.get("pipeline_stages") or f.get("mp_world_size")
        return f"pipeline parallel, {n} stages" if n else "pipeline parallel"
    if kind == "zero-0":
        return "ZeRO stage 0"
    if kind == "bf16-optimizer":
        return "BF16_Optimizer (ZeRO-1)"
    if st is not None and f.get("moe"):
        return f"ZeRO-{st} MoE"
    return f"ZeRO-{st}" if st is not None else None


def _child(node: Node, name: str) -> Node:
    """The child of ``node`` named ``name``, which is one of its children's names (the tag's file lists)."""
    return cast(Node, node.child(name))


def _layer_index(name: str) -> int:
    """The layer number of a pipeline layer file's name (LAYER_RE matched it)."""
    return int(cast("re.Match[str]", dsfmt.LAYER_INDEX_RE.match(name)).group(1))


def _local(node: Node) -> Path:
    """``node``'s local path: a reference loader (torch.load, zero_to_fp32) reads local files only."""
    return Path(cast("os.PathLike[str]", node.abspath))


def latest_tag(node: Node, tags: list[Node]) -> Node:
    """The tag of ``tags`` (in folder ``node``) that ``latest`` names, else the newest."""
    latest = node.child("latest")
    if latest is not None:
        for t in tags:
            if t.name == cast(TextFacts, latest.facts).get("names"):
                return t
    return sorted(tags, key=lambda t: (step_of(t.name) or -1, t.name))[-1]


class DeepSpeedStatesFiles(TorchFileFormat):
    """``*_model_states.pt``: read with its tag folder (rank 0), so the file itself is not analysed.
    Lists (every tensor of the file: the module's, frozen fragments) and exports as a torch file."""

    formats = {"deepspeed-model-states": DeepSpeedModelStatesFacts}
    reference = None  # verify reports the format's name
    file_layout = "torch-file"

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        if dsfmt.MODEL_STATES_RE.match(name) or dsfmt.LAYER_RE.match(name) or EXPERT_FILE_RE.match(name):
            return "deepspeed-model-states", "model"
        return None


class DeepSpeedOptimStatesFiles(FileFormat):
    """``*_optim_states.pt``: read with its tag folder (rank 0). Lists its tensors (the rank's fp32 master
    partitions, exp_avg, exp_avg_sq, step) from data.pkl (``deepspeed.read_optim_states``); not a model
    to export by itself: its tag folder is."""

    formats = {"deepspeed-optim-states": DeepSpeedOptimStatesFacts}
    file_layout = "torch-file"

    def loader_files(self, node: Node) -> list[Path]:
        path = _local(node)
        return [] if path.is_dir() else [path]

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        return ("deepspeed-optim-states", "optimizer") if dsfmt.OPTIM_STATES_RE.match(name) else None

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        yield from dsfmt.read_optim_states(node.abspath).tensor_infos()

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        tag = node.path.rsplit("/", 1)[0] if "/" in node.path else "its folder"
        raise NotExportable(
            f"`{node.path}` is one rank's optimizer states, not a model: export the tag folder "
            f"`{tag}`, whose fp32 weights are rebuilt from every rank's optimizer states"
        )


def _record(c: Node, e: Exception) -> None:
    if isinstance(e, FormatError):
        c.facts.update(NodeFacts(error=str(e), error_kind=e.kind))
    else:
        c.facts.update(
            NodeFacts(
                error=f"cannot read: {cast(OSError, e).strerror or e}",  # not a FormatError: an OSError
                error_kind="permission" if isinstance(e, PermissionError) else "unreadable",
            )
        )


def _layer_files(node: Node, tf: dsfmt.TagFacts) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """Each pipeline layer file's tensors from its data.pkl, in layer order (``tf.layer_tensors`` named as
    the PipelineModule names them); errors are recorded on the files."""
    out = []
    for name in sorted(tf.layer_files, key=_layer_index):
        c = _child(node, name)
        try:
            obj = read_torch_file(c).obj
        except (FormatError, OSError) as e:
            _record(c, e)
            continue
        ts = []
        for key, t in iter_tensors(obj if isinstance(obj, dict) else {}):
            full = dsfmt.layer_name(name, key)
            tf.layer_tensors[full] = (tuple(t.shape), t.dtype)
            ts.append((full, tuple(t.shape)))
        out.append((name, ts))
    return out


def _pipeline_layers(node: Node, tf: dsfmt.TagFacts, ms_name: Optional[str]) -> list[str]:
    """A pipeline tag's layer files that are missing: each stage's optimizer (in ``mp_rank_XX_model_states.pt``)
    must hold exactly a consecutive run of the layers' tensors. Where it does not, the gaps in the layer numbers
    are named (a layer of functions writes no file, so a gap alone is no proof)."""
    layers = tf.layers
    stages: list[list[tuple[int, ...]]] = []
    stages_n = tf.facts.get("mp_world_size") or max((k[1] for k in tf.model_files), default=-1) + 1
    for m in range(stages_n):
        name = tf.model_files.get((-1, m))
        c = node.child(name) if name else None
        if c is None or "error" in c.facts:
            return []  # reported as a missing or broken file already
        try:
            shapes = dsfmt.inline_param_shapes(read_torch_file(c).obj)
        except (FormatError, OSError) as e:
            _record(c, e)
            return []
        if shapes is None:
            return []  # no optimizer state to check against (saved without it, or wrapped in ZeRO files)
        stages.append(shapes)
    if dsfmt.match_pipeline(layers, stages) is not None:
        return []
    idx = sorted(_layer_index(n) for n, _ in layers)
    gaps = [f"layer_{i:02d}-model_states.pt" for i in range(max(idx, default=-1) + 1) if i not in idx]
    if gaps:
        return gaps
    have = sum(len(ts) for _, ts in layers)
    want = sum(len(s) for s in stages)
    return [
        f"layer_{(max(idx, default=-1) + 1):02d}-model_states.pt (or later: the stages' optimizers hold {want} "
        f"parameters, the layer files {have})"
    ]


def read_tag(node: Node) -> tuple[dsfmt.TagFacts, Optional[str], Optional[str]]:
    """Classify a tag folder's files and read rank 0's model and optim states (errors recorded on
    the files): (facts, model-states file read, optim-states file read)."""
    tf = dsfmt.classify_files([c.name for c in node.children])
    ms_name = tf.model_files.get((-1, 0)) or tf.model_files.get((0, 0))
    obj = None
    if ms_name:
        c = _child(node, ms_name)
        if "error" not in c.facts:
            try:
                obj = read_torch_file(c).obj
            except (FormatError, OSError) as e:
                _record(c, e)
    if obj is not None:
        dsfmt.analyze_model_states(obj, tf)
    if tf.layer_files:
        tf.layers = _layer_files(node, tf)
    opt_name = tf.optim_files.get((0, 0)) or (next(iter(tf.optim_files.values())) if tf.optim_files else None)
    if opt_name:
        oc = _child(node, opt_name)
        try:
            otf = torchfile.read(oc.abspath)
            if otf.unsafe:
                cast(PickleFacts, oc.facts)["unsafe_globals"] = [fact_text(g) for g in sorted(otf.unsafe)[:MAX_UNSAFE]]
            dsfmt.analyze_optim_states(otf.obj, tf)
        except (FormatError, OSError) as e:
            _record(oc, e)
    dsfmt.globalize_experts(tf, tf.facts.get("dp_world_size") or tf.facts.get("partition_count"))
    return tf, ms_name, opt_name


class DeepSpeedTag(FolderFormat):
    formats = {"deepspeed-zero": DeepSpeedZeroFacts}
    reference = "DeepSpeed zero_to_fp32"
    checkpoint = True
    exportable = True
    tag = True
    optimizer = "DeepSpeed ZeRO-1/2/3 tag folders"
    optimizer_with_model = True
    holder_order = 30

    def describe(self, node: Node) -> Optional[Described]:
        return "deepspeed", {"model": node.path, "optimizer": node.path}

    def describe_holder(self, node: Node, members: list[Node]) -> Optional[Described]:
        """A DeepSpeed save_dir: its tags (``latest`` names the one read), by who wrote them."""
        names = {c.name for c in node.children}
        latest = node.child("latest")
        chosen = latest_tag(node, members)
        comps = {"model": chosen.path, "optimizer": chosen.path}
        if trainer_written(names):
            return "hf-trainer-deepspeed", comps
        if node.name.endswith(".ckpt") or (
            latest is not None and cast(TextFacts, latest.facts).get("names") == "checkpoint"
        ):
            return "lightning-deepspeed", comps
        if any(n.startswith("random_states") for n in names):
            return "accelerate-deepspeed", comps
        return "deepspeed", comps

    def summary_detail(self, node: Node) -> str:
        tag = cast(DeepSpeedZeroFacts, node.facts)
        name = deepspeed_layout(tag)
        head = f" {name}" if name else ""
        td = tag.get("train_dtype")
        words = [short_dtype(td)] if td else []
        experts = experts_words(tag)
        if experts:
            words.append(experts)
        if words:
            head += f" ({', '.join(words)})"
        return head

    def tree_label(self, node: Node) -> Optional[str]:
        return deepspeed_layout(cast(DeepSpeedZeroFacts, node.facts))

    def findings(self, inv: Inventory, node: Node) -> list[Finding]:
        return tag_findings(inv, node)

    def loader_files(self, node: Node) -> list[Path]:
        return screen.tag_files(_local(node))

    def optimizer_source(
        self,
        node: Node,
        *,
        model_tensors: Optional[list[tuple[str, tuple[int, ...]]]] = None,
        model_what: str = "",
        trust_pickles: bool = False,
    ) -> tuple[Source, dict[str, Any], Optional[list[str]]]:
        from .optim import deepspeed_optimizer_source

        return deepspeed_optimizer_source(node.abspath)

    def detect(self, node: Node) -> bool:
        return dsfmt.is_tag_dir(c.name for c in node.children)

    def analyze(self, node: Node, parsed: Parsed) -> None:
        node.format = "deepspeed-zero"
        node.role = "model+optimizer"
        f = cast(DeepSpeedZeroFacts, node.facts)
        tf, ms_name, opt_name = read_tag(node)
        # integrity of every rank file: the zip directory must be there
        ranks = list(tf.optim_files.values()) + list(tf.model_files.values())
        for fname in ranks + list(tf.expert_files.values()) + tf.expp_files:
            c = _child(node, fname)
            if fname in (ms_name, opt_name) or "error" in c.facts:
                continue
            zip_check(c)
        f.update(tf.facts)
        stage = f.get("zero_stage")
        if stage is None:
            stage = 3 if any(k[0] >= 0 for k in tf.model_files) else None
            if stage is not None:
                f["zero_stage"] = stage
        f["optim_prefix"] = tf.optim_prefix
        dp_present = sorted({k[0] for k in tf.optim_files})
        f["ranks_present"] = dp_present
        ws = f.get("dp_world_size")
        if ws is None and tf.optim_files and isinstance(f.get("partition_count"), int):
            ws = f["partition_count"]  # the model states, which record dp_world_size, are gone: the partitions say it
        mp = f.get("mp_world_size") or 1
        f["world_size"] = ws
        inline = tf.inline_optimizer is not None or (stage == 0 and not tf.optim_files)
        f["ds_layout"] = (
            "pipeline"
            if tf.layer_files or f.get("pipeline")
            else "zero-0"
            if inline
            else "bf16-optimizer"
            if f.get("optimizer_kind") == "bf16-optimizer"
            else "zero"
        )
        missing: list[str] = []
        if not inline:  # ZeRO stage 0 keeps its optimizer in the model states: it writes no *_optim_states.pt
            expected_optim = [(r, m) for r in range(ws or 0) for m in range(mp)] if ws else []
            missing = [
                f"{tf.optim_prefix}zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt"
                for (r, m) in expected_optim
                if (r, m) not in tf.optim_files
            ]
        if stage == 3 and ws:
            missing += [
                f"zero_pp_rank_{r}_mp_rank_{m:02d}_model_states.pt"
                for r in range(ws)
                for m in range(mp)
                if (r, m) not in tf.model_files
            ]
        elif ws or inline:
            missing += [f"mp_rank_{m:02d}_model_states.pt" for m in range(mp) if (-1, m) not in tf.model_files]
        if tf.num_experts is not None and not any(k[0] < 0 for k in tf.expert_files):
            # every expert of every MoE layer has its file (the old expert_E_* names: not checked)
            present = set(tf.expert_files.values())
            missing += [n for n in expected_expert_files(tf.num_experts) if n not in present]
        if tf.layer_files:  # a stage's file below the highest one present (mp_rank_00 read: mp_world_size says)
            top = max((k[1] for k in tf.model_files), default=-1)
            missing += [
                n
                for n in (f"mp_rank_{m:02d}_model_states.pt" for m in range(top + 1) if (-1, m) not in tf.model_files)
                if n not in missing
            ]
            missing += _pipeline_layers(node, tf, ms_name)
        if missing:
            f["missing_files"] = missing
        if f["ds_layout"] == "pipeline" and ws and f.get("pipeline_stages"):
            f["world_size"] = ws * f["pipeline_stages"]  # every rank: data-parallel x pipeline stages
        extra = [tf.optim_files[k] for k in sorted(tf.optim_files) if ws and k[0] >= ws]
        if extra:
            f["extra_rank_files"] = extra
        pc = f.get("partition_count")
        if ws and isinstance(pc, int) and pc != ws:
            f["partition_mismatch"] = pc
        ts = dsfmt.tensors(tf)
        set_tensor_facts(node, ts, count=False)
        f["tensor_count"] = len(ts)
        f["params_trainable"] = sum(numel(s) for s in tf.param_shapes.values())
        if tf.frozen_shapes:
            f["frozen_params"] = sorted(tf.frozen_shapes)
        elif f.get("module_params") and f["module_params"] > f["params_trainable"] and stage in (1, 2):
            # ZeRO-1 saves no frozen_param_shapes: frozen weights show only in the module
            f["frozen_params_unrecorded"] = f["module_params"] - f["params_trainable"]
        if tf.module_dtypes:
            f["module_dtypes"] = sorted(tf.module_dtypes)
        if tf.layer_files:
            f["pipeline"] = True
            f["layer_files"] = len(tf.layer_files)
        if tf.expert_files:
            f["expert_files"] = len(tf.expert_files)
        # what each states file holds: stage 0's mp_rank_00 the module and the optimizer; a pipeline's
        # mp_rank_XX the stage's optimizer (its weights are in the layer files)
        for (dp, m), name in tf.model_files.items():
            c = _child(node, name)
            if f["ds_layout"] == "zero-0" and dp == -1:
                c.role = "model+optimizer"
            elif f["ds_layout"] == "pipeline" and dp == -1 and not tf.module_tensors:
                c.role = "optimizer"
        if f.get("optimizer_kind") in dsfmt.OPTIMIZER_CLASS:
            f["optimizer_class"] = dsfmt.OPTIMIZER_CLASS[f["optimizer_kind"]]
        parsed.put(node, tf)

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        tf = parsed.get(node, dsfmt.TagFacts) if parsed is not None else None
        if tf is None:
            tf = read_tag(node)[0]
        yield from dsfmt.tensors(tf)

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        from ...export.sources import strip_names
        from .source import tag_source

        try:
            src = tag_source(node.abspath, exclude_frozen=exclude_frozen)
        except ValueError as e:
            raise NotExportable(str(e)) from None
        return strip_names(src, strip_prefix)

    def reference_for(self, node: Node) -> Optional[str]:
        """The reference loader verify names: zero_to_fp32 rejects stage 0, BF16_Optimizer, pipeline and MoE tags."""
        if cast(DeepSpeedZeroFacts, node.facts).get("moe"):
            return MOE_REFERENCE
        return {
            "zero-0": "torch.load (mp_rank_00_model_states.pt: module, FP16_UnfusedOptimizer fp32_groups)",
            "pipeline": "torch.load (layer_XX-model_states.pt)",
            "bf16-optimizer": "DeepSpeed zero_to_fp32's ZeRO-1/2 reconstruction (its zero_stage check skipped)",
        }.get(cast(DeepSpeedZeroFacts, node.facts).get("ds_layout", ""), self.reference)

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        import contextlib
        import io
        import os

        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from ..screen import zero_to_fp32

        get_fp32_state_dict_from_zero_checkpoint = zero_to_fp32().get_fp32_state_dict_from_zero_checkpoint

        layout = cast(DeepSpeedZeroFacts, node.facts).get("ds_layout")
        if cast(DeepSpeedZeroFacts, node.facts).get("moe"):  # zero_to_fp32 takes the expert files for model states
            with contextlib.redirect_stdout(io.StringIO()):
                yield from _moe_reference(_local(node))
            return
        if layout in ("zero-0", "pipeline", "bf16-optimizer"):  # zero_to_fp32 rejects these
            with contextlib.redirect_stdout(io.StringIO()):
                yield from _beyond_reference(_local(node), layout)
            return
        with contextlib.redirect_stdout(io.StringIO()):  # it prints progress on stdout, our contract's channel
            sd = get_fp32_state_dict_from_zero_checkpoint(str(node.abspath.parent), tag=node.abspath.name)
        yield from sd.items()


MOE_REFERENCE = (
    "DeepSpeed zero_to_fp32's ZeRO-1/2 reconstruction, per param group and expert-parallel rank (its ranks by "
    "DeepSpeed's expert-data-parallel groups; expert names with global ids)"
)


def _moe_reference(tag_dir: Path) -> Iterator[tuple[str, Any]]:
    """The fp32 model of a ZeRO-1/2 mixture-of-experts tag, read with torch.load: zero_to_fp32's own
    reconstruction (``_zero2_merge_trainable_params``) of each flat vector -- a dense group over every rank, an
    expert group once per expert-parallel rank over its expert-data-parallel ranks (DeepSpeed's groups.py rule,
    :func:`.moe.parts`), the local expert names renamed to global ids -- and zero_to_fp32's buffers, frozen
    params and tied aliases of ``mp_rank_00_model_states.pt`` (it reads the expert files as model states and
    fails, so it is not called as a whole)."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from ..screen import torch_load, zero_to_fp32
    from .moe import data_before_expert, group_ep_sizes, parts

    z = zero_to_fp32()
    ms_file = tag_dir / "mp_rank_00_model_states.pt"
    zms = z.parse_model_states([str(ms_file)])
    ms = torch_load(ms_file, map_location="cpu")
    osds = [torch_load(f, map_location="cpu")["optimizer_state_dict"] for f in z.get_optim_files(str(tag_dir))]
    world = len(osds)
    shapes = [OrderedDict((str(k), tuple(v)) for k, v in g.items()) for g in ms["param_shapes"]]
    eps = group_ep_sizes(osds[0]["base_optimizer_state"]["param_groups"], list(osds[0]["partition_count"]), world)
    state_dict: dict[str, Any] = dict(zms[0].buffers)
    z._zero2_merge_frozen_params(state_dict, zms)
    for part in parts(shapes, eps, world, data_before_expert(ms)):
        flat = [[osds[r]["single_partition_of_fp32_groups"][part.group]] for r in part.ranks]
        pads = osds[part.ranks[0]].get("param_alignment_paddings")
        one = SimpleNamespace(param_shapes=[part.shapes])
        z._zero2_merge_trainable_params(
            state_dict, len(part.ranks), flat, [one], [pads[part.group]] if pads is not None else None
        )
    for alias, target in zms[0].shared_params:
        if target in state_dict:
            state_dict[alias] = state_dict[target]
    yield from state_dict.items()


def _beyond_reference(tag_dir: Path, layout: str) -> Iterator[tuple[str, Any]]:
    """The fp32 model of a tag zero_to_fp32 rejects, read with torch.load: BF16_Optimizer through
    zero_to_fp32's own ZeRO-1/2 reconstruction (only its zero_stage check skipped); stage 0 the module,
    each parameter replaced by FP16_UnfusedOptimizer's fp32 master of the same place; a pipeline's layer
    files, keys prefixed with their layer index."""
    from ..screen import torch_load, zero_to_fp32

    z = zero_to_fp32()
    if layout == "bf16-optimizer":
        model_states = z.parse_model_states(z.get_model_state_files(str(tag_dir)))
        optim = [torch_load(f, map_location="cpu") for f in z.get_optim_files(str(tag_dir))]
        groups = [o["optimizer_state_dict"]["single_partition_of_fp32_groups"] for o in optim]
        yield from z._get_fp32_state_dict_from_zero2_checkpoint(len(groups), groups, model_states, False, None).items()
        return
    if layout == "pipeline":
        for f in sorted(tag_dir.glob("layer_*-model_states.pt"), key=lambda p: _layer_index(p.name)):
            for k, t in torch_load(f, map_location="cpu").items():
                yield dsfmt.layer_name(f.name, k), t
        return
    sd = torch_load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu")
    module, opt = sd["module"], sd.get("optimizer") or {}
    buffers = set(sd.get("buffer_names") or [])
    masters = [t for g in opt.get("fp32_groups") or [] for t in g]
    seen: set[tuple[Any, ...]] = set()
    params = []
    for k, t in module.items():  # named_parameters() order: no buffers, a tied view once
        view = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if k not in buffers and view not in seen:
            seen.add(view)
            params.append(k)
    by_name = dict(zip(params, masters)) if len(masters) == len(params) else {}
    for k, t in module.items():
        yield k, by_name.get(k, t)


def zip_check(c: Node) -> None:
    """A rank file not read in full: its zip directory must be there and fit in the file."""
    import zipfile

    try:
        with zipfile.ZipFile(c.abspath if isinstance(c.abspath, Path) else open_read(c.abspath)) as zf:
            size = c.size
            for i in zf.infolist():
                if i.header_offset + 30 + len(i.filename) + i.compress_size > size:
                    raise FormatError(f"entry {i.filename} runs past the end of the file: truncated", "truncated")
            torchfile.loader_record(zf.infolist())  # one data.pkl, where torch.load reads it
    except zipfile.BadZipFile:
        c.facts.update(
            NodeFacts(
                error="zip archive without its central directory: the file was cut short, "
                "most likely by an interrupted save",
                error_kind="truncated",
            )
        )
    except FormatError as e:
        c.facts.update(NodeFacts(error=str(e), error_kind=e.kind))
    except PermissionError:
        c.facts.update(NodeFacts(error="permission denied: the file cannot be read", error_kind="permission"))
    except OSError as e:
        c.facts.update(NodeFacts(error=f"cannot read: {e.strerror or e}", error_kind="unreadable"))
    except Exception as e:  # zipfile raises NotImplementedError, ValueError... on a corrupt directory
        c.facts.update(NodeFacts(error=f"corrupt zip directory: {type(e).__name__}: {e}", error_kind="corrupt"))


def _bare_tensor_facts(x: Node) -> None:
    """Tensor facts of a universal ``fp32.pt`` that holds a bare tensor (ZeRO-3's converter saves the
    tensor itself, ZeRO-1/2's a ``{"param": ...}`` dict), from its data.pkl."""
    try:
        obj = torchfile.read(x.abspath).obj
    except (FormatError, OSError) as e:
        _record(x, e)
        return
    t = obj.get("param") if isinstance(obj, dict) else obj
    if isinstance(t, TensorRef):
        set_tensor_facts(x, [TensorInfo("param", t.shape, t.dtype, t.nbytes)])


class DeepSpeedUniversal(FolderFormat):
    formats = {"deepspeed-universal": DeepSpeedUniversalFacts}
    reference = "torch.load (fp32.pt)"
    checkpoint = True
    exportable = True
    universal = True
    collapsed = True
    one_line = True
    holder_order = 40

    def describe(self, node: Node) -> Optional[Described]:
        return "universal", {"model": node.path, "optimizer": node.path}

    def describe_holder(self, node: Node, members: list[Node]) -> Optional[Described]:
        """A folder of universal checkpoints: the one ``latest_universal`` names, else the first."""
        chosen = members[0]
        lu = node.child("latest_universal")
        if lu is not None:
            for c in members:
                if c.name == cast(TextFacts, lu.facts).get("names"):
                    chosen = c
        return "universal", {"model": chosen.path, "optimizer": chosen.path}

    def tree_label(self, node: Node) -> Optional[str]:
        return universal_summary(node.facts)

    def findings(self, inv: Inventory, node: Node) -> list[Finding]:
        return universal_findings(inv, node)

    def loader_files(self, node: Node) -> list[Path]:
        zero = _local(node) / "zero"
        return sorted(zero.glob("*/*.pt")) + sorted(zero.glob("*.pt")) if zero.is_dir() else []

    def detect(self, node: Node) -> bool:
        zero = node.child("zero")
        return (
            zero is not None
            and zero.is_dir
            and (
                any(c.is_dir and c.child("fp32.pt") is not None for c in zero.children[:64])
                or zero.child("optimizer_state.pt") is not None
            )
        )

    def analyze(self, node: Node, parsed: Parsed) -> None:
        node.format = "deepspeed-universal"
        node.role = "model+optimizer"
        zero = _child(node, "zero")  # detect found it
        params = [c for c in zero.children if c.is_dir]
        f = cast(DeepSpeedUniversalFacts, node.facts)
        ms = [c.name for c in node.children if dsfmt.MODEL_STATES_RE.match(c.name)]
        f.update(
            DeepSpeedUniversalFacts(
                param_folders=len(params),
                with_optimizer_state=sum(1 for p in params if p.child("exp_avg.pt") is not None),
                fp32_only=sorted(p.name for p in params if p.child("exp_avg.pt") is None)[:32],
                model_state_files=len(ms),
            )
        )
        for p in params:
            if p.child("fp32.pt") is None:
                f.setdefault("incomplete_params", []).append(p.name)
        states: set[str] = set()
        fp32: list[Node] = []
        for c in params:
            c.role = "model"
            c.format = "dir"
            for x in c.children:
                if x.is_dir or not x.name.endswith(".pt"):
                    continue
                states.add(x.name[:-3])
                x.role = dsfmt.UNIVERSAL_STATE_ROLES.get(x.name, x.role)
                if x.name == "fp32.pt":
                    fp32.append(x)
        known = [s for s in dsfmt.UNIVERSAL_STATES if s in states]
        f["states"] = known + sorted(states - set(known))
        # the fp32 weights' totals, from each fp32.pt's data.pkl as the scan read it (no tensor data)
        for x in fp32:
            if "tensor_count" not in x.facts and "error" not in x.facts:
                _bare_tensor_facts(x)
        read = [cast(TensorFacts, x.facts) for x in fp32 if x.facts.get("tensor_count")]
        dtypes: dict[str, int] = {}
        for xf in read:
            for d in xf.get("dtypes") or []:
                dtypes[d] = dtypes.get(d, 0) + 1
        f.update(
            DeepSpeedUniversalFacts(
                param_count=sum(xf.get("param_count", 0) for xf in read),
                tensor_bytes=sum(xf.get("tensor_bytes", 0) for xf in read),
                dtypes=sorted(dtypes, key=lambda d: -dtypes[d]),
                tensor_count=sum(xf.get("tensor_count", 0) for xf in read),
            )
        )

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        for d in sorted((node.abspath / "zero").iterdir(), key=lambda d: d.name):  # siblings: by name
            f = d / "fp32.pt"
            if not f.is_file():
                continue
            obj = torchfile.read(f).obj
            t: Any = obj.get("param") if isinstance(obj, dict) else obj  # a TensorRef, or what the file holds
            if hasattr(t, "shape"):
                yield TensorInfo(d.name, t.shape, t.dtype, t.nbytes)

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        from ...export.sources import strip_names
        from .universal import universal_source

        return strip_names(universal_source(node.abspath), strip_prefix)

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        import torch

        for d in sorted((node.abspath / "zero").iterdir(), key=lambda d: d.name):  # siblings: by name
            p = d / "fp32.pt"
            if p.is_file():
                obj = torch.load(p, weights_only=True)  # {"param": tensor} or the tensor: torch's allowlist reads it
                yield d.name, (obj["param"] if isinstance(obj, dict) else obj)
