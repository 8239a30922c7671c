"""Every diagnose rule, table-driven: each row is a tree built from the real fixtures' headers
(data/) plus one corruption, and the finding it must produce: (code, severity, path), the words
its message must carry and the repair it offers."""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

from . import trees
from .api import inspect
from .facts import undeclared

TAG = "global_step2"
OPTIM = "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"


@dataclass(frozen=True)
class Rule:
    id: str
    build: Callable[[Path], Path]  # base folder -> the path to inspect
    code: str
    severity: str
    path: str
    message: tuple[str, ...] = ()  # fragments the message must contain
    fix: Optional[str] = None
    options: dict = field(default_factory=dict)  # inspect() keyword arguments
    marks: tuple = ()


class Corrupt:
    """A builder: ``variant`` written under base, then ``edit(root)``; inspect root/sub.
    ``pristine`` builds the same tree without the edit."""

    def __init__(self, variant: str, edit: Optional[Callable[[Path], None]] = None, sub: str = ""):
        self.variant, self.edit, self.sub = variant, edit, sub

    def __call__(self, base: Path) -> Path:
        root = trees.tree(self.variant, base)
        if self.edit is not None:
            self.edit(root)
        return root / self.sub

    @property
    def pristine(self) -> Optional["Corrupt"]:
        return Corrupt(self.variant, None, self.sub) if self.edit is not None else None


def rm(rel: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        p = root / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return edit


def write(rel: str, data: bytes) -> Callable[[Path], None]:
    return lambda root: (root / rel).write_bytes(data)


def cut(rel: str, size: Callable[[int], int]) -> Callable[[Path], None]:
    return lambda root: trees.truncate(root / rel, size((root / rel).stat().st_size))


def from_variant(variant: str, rel: str, dest: str) -> Callable[[Path], None]:
    """Put file ``rel`` of another real checkpoint at ``dest``."""
    return lambda root: trees.write_file(variant, rel, root / dest)


# ------------------------------------------------------------------ trees that need more than one edit


def interrupted_dcp_save(keep_tmp: bool) -> Callable[[Path], Path]:
    """A run folder: checkpoint-2 complete, checkpoint-4's model folder without .metadata (the save
    died before rank 0 renamed it into place; with keep_tmp, .metadata.tmp survived)."""

    def build(base: Path) -> Path:
        run = trees.run_folder("hf-fsdp1", "checkpoint-2", (2, 4), base)
        meta = run / "checkpoint-4" / "pytorch_model_fsdp_0" / ".metadata"
        if keep_tmp:
            meta.rename(meta.with_name(".metadata.tmp"))
        else:
            meta.unlink()
        return run

    return build


def edit_index(root: Path) -> None:
    idx = root / "model.safetensors.index.json"
    doc = json.loads(idx.read_text())
    del doc["weight_map"]["model.norm.weight"]
    doc["weight_map"]["ghost.weight"] = "model-00099-of-00099.safetensors"
    idx.write_text(json.dumps(doc))


def index_outside(root: Path) -> None:
    idx = root / "model.safetensors.index.json"
    doc = json.loads(idx.read_text())
    name = sorted(doc["weight_map"])[0]
    doc["weight_map"][name] = "../elsewhere/" + doc["weight_map"][name]
    idx.write_text(json.dumps(doc))


def one_tensor_bf16(root: Path) -> None:
    """Shard 1's q_proj stored as bf16 beside fp32 tensors (the header re-laid out to match)."""
    p = root / "model-00001-of-00005.safetensors"
    header, _ = trees.safetensors_header(p)
    header["model.layers.0.self_attn.q_proj.weight"]["dtype"] = "BF16"
    trees.rewrite_safetensors_header(p, header)
    idx = root / "model.safetensors.index.json"  # keep the index's total_size honest
    doc = json.loads(idx.read_text())
    doc["metadata"]["total_size"] = sum(trees.safetensors_data_bytes(s) for s in root.glob("*.safetensors"))
    idx.write_text(json.dumps(doc))


def tied_in_torch_file(root: Path) -> None:
    """lm_head.weight re-pointed at embed_tokens.weight's storage: tied embeddings in a plain torch.save."""
    p = root / "model.pt"
    pkl = trees.zip_entry(p, "data.pkl")
    trees.replace_zip_entry(p, "data.pkl", trees.alias_storage(pkl, "16", "1"))


def hostile_training_args(root: Path) -> None:
    p = root / "checkpoint-2" / "training_args.bin"
    trees.replace_zip_entry(p, "data.pkl", trees.hostile_pickle(root / "CANARY"))


def safetensors_header_length(n: int) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        p = root / "model.safetensors"
        with open(p, "r+b") as f:
            f.write(struct.pack("<Q", n))

    return edit


def flip_header_byte(root: Path) -> None:
    p = root / "model.safetensors"
    with open(p, "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0xFF]))


def safetensors_data_cut(root: Path) -> None:
    p = root / "model.safetensors"
    _, n = trees.safetensors_header(p)
    trees.truncate(p, 8 + n + 10)


class Converted(Corrupt):
    """ds-zero2-bf16 (a ZeRO-2 tag without universal_checkpoint_info) with its universal checkpoint beside
    it as `ckpt-tui universal` leaves it (``global_step2_universal/`` + ``latest_universal``; the
    universal-zero2 fixture: the same model), then ``edit(root)``."""

    def __init__(self, edit: Optional[Callable[[Path], None]] = None):
        super().__init__("ds-zero2-bf16", edit)

    def __call__(self, base: Path) -> Path:
        root = trees.tree("ds-zero2-bf16", base)
        uni = trees.tree("universal-zero2", base, ".universal")
        for name in ("global_step2_universal", "latest_universal"):
            os.rename(uni / name, root / name)
        if self.edit is not None:
            self.edit(root)
        return root

    @property
    def pristine(self) -> Optional["Corrupt"]:
        return Converted() if self.edit is not None else None


def adapter_only(base: Path) -> Path:
    d = base / "lora"
    d.mkdir()
    (d / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "base_model_name_or_path": "llama", "r": 8, "target_modules": ["q_proj"]})
    )
    trees.write_file("hf-model-sharded", "model-00005-of-00005.safetensors", d / "adapter_model.safetensors")
    return d


def notes_only(base: Path) -> Path:
    (base / "notes" / "sub").mkdir(parents=True)
    (base / "notes" / "README.txt").write_text("loss went down\n")
    return base / "notes"


def symlink_loop(root: Path) -> None:
    (root / "logs").mkdir()
    os.symlink(root, root / "logs" / "loop")


def broken_symlink(root: Path) -> None:
    os.symlink(root / "gone", root / "latest_best")


def deep_nesting(root: Path) -> None:
    (root / "logs" / "/".join(f"d{i}" for i in range(30))).mkdir(parents=True)


DEEP = "logs/" + "/".join(f"d{i}" for i in range(23))  # the 24th level is listed, not descended


def unreadable_file(root: Path) -> None:
    os.chmod(root / "global_step2" / "mp_rank_00_model_states.pt", 0)


def chunk_size(rel: str, delta: int) -> Callable[[Path], None]:
    """One chunk record of the DCP ``.metadata`` at ``rel`` made ``delta`` rows longer or shorter along dim 0, by
    rewriting the one byte of its BININT1 (no memo slot moves; no torch): -1 on a tensor's first chunk leaves a
    gap, +1 on a first chunk that another follows makes them overlap."""
    import pickletools

    def edit(root: Path) -> None:
        path = root / rel
        data = bytearray(path.read_bytes())
        memo: list = []
        last = None  # the last string literal pushed (what MEMOIZE stores)
        key = None  # "offsets" / "sizes": the field whose torch.Size comes next
        recs: list = []  # per chunk record: [dim-0 offset, (dim-0 size, its BININT1 position)]
        for op, arg, pos in pickletools.genops(bytes(data)):
            name = op.name
            if name in ("SHORT_BINUNICODE", "BINUNICODE"):
                last = arg
                key = arg if arg in ("offsets", "sizes") else None
            elif name == "MEMOIZE":
                memo.append(last)
            elif name in ("BINGET", "LONG_BINGET") and memo[arg] in ("offsets", "sizes"):
                key = memo[arg]
            elif name == "BININT1" and key == "offsets":
                recs.append([arg, None])
                key = None
            elif name == "BININT1" and key == "sizes" and recs and recs[-1][1] is None:
                recs[-1][1] = (arg, pos)
                key = None
        recs = [r for r in recs if r[1] is not None]
        for i, (off, (size, pos)) in enumerate(recs):
            follows = i + 1 < len(recs) and recs[i + 1][0] == size
            if off == 0 and 2 <= size < 250 and (delta < 0 or follows):
                data[pos + 1] = size + delta
                path.write_bytes(bytes(data))
                return
        raise AssertionError("no chunk record to edit")

    return edit


def fifo(root: Path) -> None:
    os.mkfifo(root / "events.pipe")


def killed_universal(root: Path) -> None:
    """What a kill -9 of `ckpt-tui universal` leaves (fsutil.owned_temp's folder and owner lock, nobody holding it),
    with a half-written copy of the tag inside: listed, never read (no file-truncated for it)."""
    from ckpt_tui.core.fsutil import OWNER_FILE
    from ckpt_tui.core.leftovers import UNIVERSAL_TEMP

    tmp = root / f"{UNIVERSAL_TEMP}k1lled"
    (tmp / "inner" / TAG).mkdir(parents=True)
    (tmp / OWNER_FILE).write_bytes(b"")
    trees.write_file("ds-zero2-bf16", f"{TAG}/mp_rank_00_model_states.pt", tmp / "inner" / TAG / "model.pt")
    trees.truncate(tmp / "inner" / TAG / "model.pt", 100)


def killed_export(root: Path) -> None:
    """A kill -9 of an export into root/merged: its temp folder (a partial shard inside) and its lock beside."""
    (root / ".merged.tmp-4242").mkdir()
    (root / ".merged.tmp-4242" / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 20) + b"{")
    (root / ".merged.ckpt-tui.lock").write_bytes(b"")


def rank0_slice(rel: str) -> Callable[[Path], None]:
    """``rel``'s header rewritten as rank 0 of 2 saving its FSDP2 shards (``save_file({k: v.to_local()})``): each
    tensor's first dimension halved."""

    def edit(root: Path) -> None:
        header, _ = trees.safetensors_header(root / rel)
        for k, v in header.items():
            if k != "__metadata__":
                v["shape"] = [v["shape"][0] // 2, *v["shape"][1:]]
        trees.rewrite_safetensors_header(root / rel, header)

    return edit


class Gathered(Corrupt):
    """zero3-peft-ungathered with its ungathered adapter's header given the shapes the run's LoRA weights have
    (oracle/: what a gathered save writes), then ``edit(root)``."""

    ADAPTER = "ungathered/checkpoint-2/adapter_model.safetensors"

    def __init__(self, edit: Optional[Callable[[Path], None]] = None):
        super().__init__("zero3-peft-ungathered", edit, "ungathered/checkpoint-2")

    def __call__(self, base: Path) -> Path:
        root = trees.tree("zero3-peft-ungathered", base)
        real, _ = trees.safetensors_header(root / "oracle/adapter_state.safetensors")
        header, _ = trees.safetensors_header(root / self.ADAPTER)
        for k, v in header.items():
            if k != "__metadata__":
                v["shape"] = real[k]["shape"]
        trees.rewrite_safetensors_header(root / self.ADAPTER, header)
        if self.edit is not None:
            self.edit(root)
        return root / self.sub

    @property
    def pristine(self) -> Optional["Corrupt"]:
        return Gathered() if self.edit is not None else None


def lora_not_matrices(root: Path) -> None:
    """Every lora_A a vector of its real size and every lora_B given a 0 dimension (tensors non-empty, none a LoRA
    matrix: what PEFT's own check rejects)."""
    header, _ = trees.safetensors_header(root / Gathered.ADAPTER)
    for k, v in header.items():
        if k != "__metadata__":
            a, b = v["shape"]
            v["shape"] = [a * b] if ".lora_A." in k else [a, 0]
    trees.rewrite_safetensors_header(root / Gathered.ADAPTER, header)


def checkpoint_3_without_optimizer(root: Path) -> None:
    """A rotation killed mid-delete of a newer checkpoint: checkpoint-2 copied as checkpoint-3, optimizer.pt gone."""
    shutil.copytree(root / "run/checkpoint-2", root / "run/checkpoint-3")
    (root / "run/checkpoint-3/optimizer.pt").unlink()


def prune_marker(checkpoint: str, state: str, removed: tuple[str, ...]) -> Callable[[Path], None]:
    """``ckpt-tui prune``'s marker in ``checkpoint`` (docs/prune.md), the files it lists removed (``pruned``) or
    the first of them only (``pruning``: killed halfway)."""

    def edit(root: Path) -> None:
        from ckpt_tui.core.prune import MARKER

        folder = root / checkpoint
        doc = {
            "ckpt_tui_prune": 1,
            "state": state,
            "what": "optimizer",
            "started": "2025-01-02T03:04:05Z",
            "finished": "2025-01-02T03:04:06Z" if state == "pruned" else None,
            "pid": None,
            "remove": list(removed),
            "bytes": 0,
        }
        (folder / MARKER).write_text(json.dumps(doc))
        for rel in removed if state == "pruned" else removed[:1]:
            (folder / rel).unlink()

    return edit


HF_OPTIM = ("optimizer.pt", "rng_state.pth", "scheduler.pt")
DS_OPTIM = tuple(f"global_step2/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)) + (
    "rng_state_0.pth",
    "rng_state_1.pth",
)

VERL = "checkpoints/global_step_1/actor"  # verl's actor folder in the verl-fsdp2 fixture

ROOT_READS_ALL = pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")

CASES = [
    # dcp-metadata-missing
    Rule(
        "dcp-metadata-missing",
        interrupted_dcp_save(keep_tmp=False),
        "dcp-metadata-missing",
        "error",
        "checkpoint-4/pytorch_model_fsdp_0",
        ("no .metadata", "ranks 0, 1", "`run/checkpoint-2/`"),
    ),
    Rule(
        "dcp-metadata-missing-tmp-left",
        interrupted_dcp_save(keep_tmp=True),
        "dcp-metadata-missing",
        "error",
        "checkpoint-4/pytorch_model_fsdp_0",
        ("--only dcp-metadata",),
        "dcp-metadata",
    ),
    # the first user report: accelerate merge-weights on an HF Trainer FSDP checkpoint
    Rule(
        "dcp-components-hf-trainer-fsdp",
        Corrupt("hf-fsdp1", None, "checkpoint-2"),
        "dcp-components",
        "info",
        ".",
        (
            "checkpoint-2/pytorch_model_fsdp_0/`; the optimizer in `",
            "checkpoint-2/optimizer_0/`",
            "`accelerate merge-weights ",
            "checkpoint-2/pytorch_model_fsdp_0 ",
            "checkpoint-2/pytorch_model_fsdp_0_merged`",
            "checkpoint-2 --out DIR`",
        ),
        "export",
    ),
    # the second user report: ds_to_universal on an HF Trainer ZeRO-2 checkpoint
    Rule(
        "universal-info-missing-hf-trainer-zero2",
        Corrupt("hf-ds-zero2", None, "checkpoint-2"),
        "universal-info-missing",
        "warning",
        TAG,
        (
            "Required universal_checkpoint_info state is missing",  # paths as given (relative to the folder above)
            f"`ckpt-tui universal hf-ds-zero2/checkpoint-2/{TAG}` (runs DeepSpeed's converter",
            f"`ckpt-tui fix hf-ds-zero2/checkpoint-2/{TAG} --only universal-info`",
        ),
        "universal-info",
    ),
    Rule(
        "universal-info-missing-lightning",
        Corrupt("lightning-ds-zero2", None, "checkpoints/epoch=0-step=2.ckpt"),
        "universal-info-missing",
        "warning",
        "checkpoint",
        ("`ckpt-tui universal lightning-ds-zero2/checkpoints/epoch=0-step=2.ckpt/checkpoint` (runs",),
        "universal-info",
    ),
    Rule(
        "universal-info-missing-zero1",
        Corrupt("ds-zero1-frozen", None),
        "universal-info-missing",
        "warning",
        TAG,
        fix="universal-info",
    ),
    # ... once converted: an info that says where the universal checkpoint is and how to load it
    Rule(
        "universal-info-missing-converted",
        Converted(),
        "universal-info-missing",
        "info",
        TAG,
        (
            "has been converted already",
            "global_step2_universal/` is its universal checkpoint (17 parameters",
            '"checkpoint": {"load_universal": true}',
            "`ckpt-tui universal ds-zero2-bf16/global_step2 --export-frozen` writes them",
        ),
    ),
    # ... but not when the universal checkpoint beside it is incomplete, damaged or not the one latest_universal names
    Rule(
        "universal-info-missing-converted-incomplete",
        Converted(rm("global_step2_universal/zero/lm_head.weight/exp_avg_sq.pt")),
        "universal-info-missing",
        "warning",
        TAG,
        ("global_step2_universal/` is there but incomplete (lm_head.weight: no exp_avg_sq.pt)", "ckpt-tui universal "),
        "universal-info",
    ),
    Rule(
        "universal-info-missing-converted-truncated",
        Converted(cut("global_step2_universal/zero/norm.weight/fp32.pt", lambda n: n // 2)),
        "universal-info-missing",
        "warning",
        TAG,
        ("is there but damaged",),
        "universal-info",
    ),
    Rule(
        "universal-info-missing-latest-universal-elsewhere",
        Converted(write("latest_universal", b"global_step1_universal")),
        "universal-info-missing",
        "warning",
        TAG,
        ("`latest_universal` does not name it",),
        "universal-info",
    ),
    # megatron-files-missing: rank 0's files of a Megatron-Core torch_dist save (megatron's load refuses without them)
    Rule(
        "megatron-files-missing-common",
        Corrupt("megatron-dist", rm("checkpoints/iter_0000010/common.pt")),
        "megatron-files-missing",
        "error",
        "checkpoints/iter_0000010",
        ("without common.pt", "rank 0 writes it"),
    ),
    Rule(
        "megatron-files-missing-metadata",
        Corrupt("megatron-dist", rm("checkpoints/iter_0000010/metadata.json"), "checkpoints"),
        "megatron-files-missing",
        "error",
        "iter_0000010",
        ("without metadata.json",),
    ),
    # megatron-core 0.19 writes metadata.json last: an iter_N/ copied alone without it (no tracker beside it) is
    # megatron's by its common_state/ entry, and its save did not finish
    Rule(
        "megatron-files-missing-019-alone",
        Corrupt("megatron-dist-019", rm("checkpoints/iter_0000010/metadata.json"), "checkpoints/iter_0000010"),
        "megatron-files-missing",
        "error",
        ".",
        ("without metadata.json", "megatron writes it last", "the save did not finish"),
    ),
    # megatron-common-state: a 0.19 save (common state inside the DCP, no common.pt), which 0.18 and older cannot load
    Rule(
        "megatron-common-state",
        Corrupt("megatron-dist-019", None, "checkpoints"),
        "megatron-common-state",
        "info",
        "iter_0000010",
        ("megatron-core 0.18 and older cannot load it", "common.pt", "megatron-core 0.19 or later", "ckpt-tui export"),
        "export",
    ),
    # to-hf: a Llama-family Megatron-Core GPT whose args say all --to hf needs: the command, as it runs
    Rule(
        "to-hf-megatron",
        Corrupt("megatron-hf-tp2", None, "checkpoints"),
        "to-hf",
        "info",
        "iter_0000010",
        ("a Llama-family Megatron-Core GPT model", "checkpoints/iter_0000010 --to hf --out DIR`", "Hugging Face"),
        "export",
    ),
    # a torchtitan Llama that saved no job config: the command with --config PATH, named but not offered to run
    Rule(
        "to-hf-torchtitan-needs-config",
        Corrupt("torchtitan"),
        "to-hf",
        "info",
        "checkpoint/step-1",
        ("a torchtitan Llama model", "records no model configuration", "--to hf --config PATH --out DIR"),
        "export",
    ),
    # shard-missing
    Rule(
        "shard-missing-dcp", Corrupt("fsdp1-dcp", rm("__1_0.distcp")), "shard-missing", "error", ".", ("__1_0.distcp",)
    ),
    # dcp-chunk-gap / dcp-chunk-overlap
    Rule(
        "dcp-chunk-gap",
        Corrupt("fsdp1-dcp", chunk_size(".metadata", -1)),
        "dcp-chunk-gap",
        "error",
        ".",
        ("leave part of them unwritten", "torch's DCP loader"),
    ),
    Rule(
        "dcp-chunk-overlap",
        Corrupt("fsdp1-dcp", chunk_size(".metadata", +1)),
        "dcp-chunk-overlap",
        "warning",
        ".",
        ("overlap", "as torch's DCP loader reads them"),
    ),
    Rule(
        "shard-missing-deepspeed-optim",
        Corrupt("ds-zero2-bf16", rm(f"{TAG}/{OPTIM.format(1)}")),
        "shard-missing",
        "error",
        TAG,
        ("saved by 2 data-parallel rank(s)", OPTIM.format(1)),
    ),
    Rule(
        "shard-missing-zero3-model-states",
        Corrupt("ds-zero3-bf16", rm(f"{TAG}/zero_pp_rank_1_mp_rank_00_model_states.pt")),
        "shard-missing",
        "error",
        TAG,
        ("zero_pp_rank_1_mp_rank_00_model_states.pt",),
    ),
    Rule(
        "shard-missing-zero2-model-states",
        Corrupt("ds-zero2-bf16", rm(f"{TAG}/mp_rank_00_model_states.pt")),
        "shard-missing",
        "error",
        TAG,
        ("mp_rank_00_model_states.pt", "saved by 2 data-parallel rank(s)"),
    ),
    Rule(
        "shard-missing-universal-fp32",
        Corrupt("universal-zero2", rm("global_step2_universal/zero/lm_head.weight/fp32.pt")),
        "shard-missing",
        "error",
        "global_step2_universal",
        ("lm_head.weight",),
    ),
    Rule(
        "shard-missing-verl-rank",
        Corrupt("verl-fsdp2", rm(f"{VERL}/model_world_size_2_rank_1.pt"), VERL),
        "shard-missing",
        "error",
        ".",
        ("model_world_size_2_rank_1.pt", "world size 2"),
    ),
    # world-size-mismatch
    Rule(
        "world-size-mismatch-verl-config",
        Corrupt("verl-fsdp2", write(f"{VERL}/fsdp_config.json", b'{"FSDP_version": 2, "world_size": 4}'), VERL),
        "world-size-mismatch",
        "error",
        ".",
        ("fsdp_config.json says world_size 4", "world size 2"),
    ),
    Rule(
        "world-size-mismatch-dcp-leftover-shard",
        Corrupt("fsdp1-dcp", lambda r: trees.sparse_file(r / "__2_0.distcp", 4096)),
        "world-size-mismatch",
        "warning",
        ".",
        ("__2_0.distcp",),
    ),
    Rule(
        "world-size-mismatch-deepspeed-extra-rank",
        Corrupt(
            "ds-zero2-bf16", from_variant("ds-zero2-3ranks", f"{TAG}/{OPTIM.format(2)}", f"{TAG}/{OPTIM.format(2)}")
        ),
        "world-size-mismatch",
        "warning",
        TAG,
        ("dp_world_size=2", OPTIM.format(2)),
    ),
    Rule(
        "world-size-mismatch-deepspeed-partitions",
        Corrupt(
            "ds-zero2-bf16", from_variant("ds-zero2-3ranks", f"{TAG}/{OPTIM.format(0)}", f"{TAG}/{OPTIM.format(0)}")
        ),
        "world-size-mismatch",
        "error",
        TAG,
        ("dp_world_size=2", "partitioned 3 ways"),
    ),
    Rule(
        "world-size-mismatch-pipeline",
        Corrupt(
            "ds-zero2-bf16",
            from_variant(
                "ds-zero2-bf16", f"{TAG}/mp_rank_00_model_states.pt", f"{TAG}/layer_01-model_00-model_states.pt"
            ),
        ),
        "world-size-mismatch",
        "info",
        TAG,
        ("pipeline-parallel",),
    ),
    # latest-dangling / latest-missing
    Rule(
        "latest-dangling",
        Corrupt("ds-zero2-bf16", write("latest", b"global_step99")),
        "latest-dangling",
        "error",
        "latest",
        ("`global_step99`", f"The newest tag here is `{TAG}`"),
        "latest",
    ),
    Rule(
        "latest-dangling-outside",
        Corrupt("ds-zero2-bf16", write("latest", b"../../etc")),
        "latest-dangling",
        "error",
        "latest",
        ("`../../etc`",),
        "latest",
    ),
    Rule(
        "latest-dangling-binary",
        Corrupt("ds-zero2-bf16", write("latest", b"\x00\xff garbage")),
        "latest-dangling",
        "error",
        "latest",
        (TAG,),
        "latest",
    ),
    Rule(
        "latest-dangling-universal",
        Corrupt("universal-zero2", write("latest_universal", b"global_step9_universal")),
        "latest-dangling",
        "error",
        "latest_universal",
        ("global_step2_universal",),
        "latest",
    ),
    Rule(
        "latest-dangling-megatron",
        Corrupt("megatron-legacy", write("latest_checkpointed_iteration.txt", b"20")),
        "latest-dangling",
        "error",
        "latest_checkpointed_iteration.txt",
        ("`20`", "iter_0000010"),
        "latest",
    ),
    Rule(
        "latest-missing",
        Corrupt("ds-zero2-bf16", rm("latest")),
        "latest-missing",
        "warning",
        ".",
        (f"echo {TAG} > ds-zero2-bf16/latest", "ckpt-tui fix ds-zero2-bf16 --only latest"),
        "latest",
    ),
    Rule(
        "latest-missing-universal",
        Corrupt("universal-zero2", rm("latest_universal")),
        "latest-missing",
        "warning",
        ".",
        ("latest_universal",),
        "latest",
    ),
    # file-truncated
    Rule(
        "file-truncated-distcp",
        Corrupt("fsdp1-dcp", cut("__0_0.distcp", lambda n: n // 2)),
        "file-truncated",
        "error",
        "__0_0.distcp",
        ("truncated",),
    ),
    Rule(
        "file-truncated-dcp-metadata-empty",
        Corrupt("fsdp1-dcp", write(".metadata", b"")),
        "file-truncated",
        "error",
        ".",
        ("empty",),
    ),
    Rule(
        "file-truncated-optim-states",
        Corrupt("ds-zero2-bf16", cut(f"{TAG}/{OPTIM.format(1)}", lambda n: n - 100)),
        "file-truncated",
        "error",
        f"{TAG}/{OPTIM.format(1)}",
        ("central directory",),
    ),
    Rule(
        "file-truncated-optim-states-empty",
        Corrupt("ds-zero2-bf16", write(f"{TAG}/{OPTIM.format(1)}", b"")),
        "file-truncated",
        "error",
        f"{TAG}/{OPTIM.format(1)}",
    ),
    Rule(
        "file-truncated-model-states",
        Corrupt("ds-zero2-bf16", cut(f"{TAG}/mp_rank_00_model_states.pt", lambda n: 1000)),
        "file-truncated",
        "error",
        f"{TAG}/mp_rank_00_model_states.pt",
    ),
    Rule(
        "file-truncated-safetensors-data",
        Corrupt("accelerate-save-state", safetensors_data_cut),
        "file-truncated",
        "error",
        "model.safetensors",
        ("truncated",),
    ),
    # file-corrupt
    Rule(
        "file-corrupt-safetensors-2^63-header",
        Corrupt("accelerate-save-state", safetensors_header_length(2**63)),
        "file-corrupt",
        "error",
        "model.safetensors",
        ("exceeds",),
    ),
    Rule(
        "file-corrupt-safetensors-flipped-byte",
        Corrupt("accelerate-save-state", flip_header_byte),
        "file-corrupt",
        "error",
        "model.safetensors",
        ("JSON",),
    ),
    Rule(
        "file-corrupt-dcp-metadata",
        Corrupt("fsdp1-dcp", write(".metadata", b"PK\x03\x04 not a pickle")),
        "file-corrupt",
        "error",
        ".",
    ),
    Rule(
        "file-corrupt-trainer-state",
        Corrupt("hf-ds-zero2", write("checkpoint-2/trainer_state.json", b'{"global_step": 2,')),
        "file-corrupt",
        "error",
        "checkpoint-2/trainer_state.json",
        ("not valid JSON",),
    ),
    # unsafe-pickle
    Rule(
        "unsafe-pickle",
        Corrupt("hf-ds-zero2", hostile_training_args),
        "unsafe-pickle",
        "error",
        "checkpoint-2/training_args.bin",
        ("system", "--trust-pickles"),
    ),
    Rule(
        "unsafe-pickle-trusted",
        Corrupt("hf-ds-zero2", hostile_training_args),
        "unsafe-pickle",
        "info",
        "checkpoint-2/training_args.bin",
        ("system",),
        options={"trust_pickles": True},
    ),
    # index-mismatch
    Rule(
        "index-mismatch",
        Corrupt("hf-model-sharded", edit_index),
        "index-mismatch",
        "error",
        ".",
        ("model-00099-of-00099.safetensors", "model.norm.weight"),
        "index",
    ),
    Rule(
        "index-mismatch-outside",
        Corrupt("hf-model-sharded", index_outside),
        "index-mismatch",
        "error",
        ".",
        ("points outside the folder",),
        "index",
    ),
    # facts an export must handle
    Rule(
        "mixed-dtypes",
        Corrupt("hf-model-sharded", one_tensor_bf16),
        "mixed-dtypes",
        "info",
        "model-00001-of-00005.safetensors",
        ("float32", "bfloat16"),
    ),
    Rule(
        "frozen-params-recorded",
        Corrupt("ds-zero2-frozen", None),
        "frozen-params",
        "info",
        TAG,
        ("embed_tokens.weight",),
        "export",
    ),
    Rule(
        "frozen-params-zero1-unrecorded",
        Corrupt("ds-zero1-frozen", None),
        "frozen-params",
        "info",
        TAG,
        ("16K frozen parameter values that ZeRO-1 did not record", "zero_to_fp32 drops them"),
        "export",
    ),
    Rule(
        "tied-weights-deepspeed",
        Corrupt("ds-zero2-tied", None),
        "tied-weights",
        "info",
        TAG,
        ("lm_head.weight = embed_tokens.weight",),
        "export",
    ),
    Rule(
        "tied-weights-torch-file",
        Corrupt("plain-pt", tied_in_torch_file),
        "tied-weights",
        "info",
        "model.pt",
        ("embed_tokens.weight = lm_head.weight",),
        "export",
    ),
    Rule("adapter-only", adapter_only, "adapter-only", "info", ".", ("PEFT adapter",)),
    # weights-empty: real ungathered ZeRO-3 saves (save_pretrained, torch.save, PEFT's save_pretrained and the call
    # older transformers made, state_dict={}); the weights are whole in the tag beside them
    Rule(
        "weights-empty-zero3-save-pretrained",
        Corrupt("zero3-ungathered", None, "checkpoint-2"),
        "weights-empty",
        "error",
        "model.safetensors",
        ("21 tensors, every one empty", "checkpoint-2/global_step2/` beside it", "export ", "checkpoint-2 --out DIR`"),
    ),
    Rule(
        "weights-empty-zero3-torch-save",
        Corrupt("zero3-ungathered", None, "state_dict.pt"),
        "weights-empty",
        "error",
        ".",
        ("21 tensors, every one empty", "Nothing beside it holds the weights"),
    ),
    Rule(
        "weights-empty-file-alone-beside-its-tag",
        Corrupt("zero3-ungathered", None, "checkpoint-2/model.safetensors"),
        "weights-empty",
        "error",
        ".",
        ("global_step2/` beside it", "ckpt-tui inspect ", "checkpoint-2 --out DIR`"),
    ),
    Rule(
        "weights-empty-adapter-ungathered",
        Corrupt("zero3-peft-ungathered", None, "ungathered/checkpoint-2"),
        "weights-empty",
        "error",
        "adapter_model.safetensors",
        ("8 tensors, every one empty", "an adapter that changes nothing", "adapter_config.json"),
    ),
    Rule(
        "weights-empty-adapter-no-tensors",
        Corrupt("zero3-peft-ungathered", None, "no-tensors/checkpoint-2"),
        "weights-empty",
        "error",
        "adapter_model.safetensors",
        ("holds no tensors at all", "no-tensors/checkpoint-2 --out DIR`"),
    ),
    Rule(
        "weights-empty-rank0-slice-beside-its-dcp",
        Corrupt("fsdp2-rank0-slice", None, "checkpoint-2"),
        "weights-empty",
        "error",
        "model.safetensors",
        ("16 of its 17 tensors smaller", "128×64 here, 256×64 there", "pytorch_model_fsdp_0 --out DIR`"),
    ),
    Rule(
        "weights-empty-rank0-slice-beside-its-deepspeed-tag",
        Corrupt("hf-ds-zero2", rank0_slice("checkpoint-2/model.safetensors"), "checkpoint-2"),
        "weights-empty",
        "error",
        "model.safetensors",
        (
            "21 of its 21 tensors smaller",
            "128×64 here, 256×64 there",
            "global_step2/` beside it",
            "checkpoint-2 --out DIR`",
        ),
    ),
    Rule(
        "weights-empty-rank0-slice-alone-beside-its-deepspeed-tag",
        Corrupt("hf-ds-zero2", rank0_slice("checkpoint-2/model.safetensors"), "checkpoint-2/model.safetensors"),
        "weights-empty",
        "error",
        ".",
        ("21 of its 21 tensors smaller", "global_step2/` beside it", "checkpoint-2 --out DIR`"),
    ),
    Rule(
        "weights-empty-adapter-lora-not-matrices",
        Gathered(lora_not_matrices),
        "weights-empty",
        "error",
        "adapter_model.safetensors",
        ("8 LoRA tensors, none of them a matrix", "ungathered/checkpoint-2 --out DIR`"),
    ),
    Rule(
        "resume-world-size-zero3",
        Corrupt("ds-zero3-bf16", None),
        "resume-world-size",
        "info",
        TAG,
        ("exactly 2 data-parallel rank(s)", "ZeRO-3", "`ckpt-tui universal "),
    ),
    # a whole model file, then one with its header rewritten to zero tensors (a careless copy of a 40-byte save)
    Rule(
        "weights-empty-header-emptied",
        Corrupt(
            "hf-model-only",
            write("run/checkpoint-2/model.safetensors", struct.pack("<Q", 32) + b'{"__metadata__":{"format":"pt"}}'),
            "run/checkpoint-2",
        ),
        "weights-empty",
        "error",
        "model.safetensors",
        ("holds no tensors at all",),
    ),
    # checkpoint-incomplete: a Trainer killed inside _save_rng_state; a rotation killed mid-delete
    Rule(
        "checkpoint-incomplete-killed-save",
        Corrupt("hf-killed-save", None, "run"),
        "checkpoint-incomplete",
        "error",
        "checkpoint-4",
        (
            "no trainer_state.json",
            'resume_from_checkpoint="',
            'run/checkpoint-2")`',
            "resume_from_checkpoint=True would pick",
            "run/checkpoint-4.incomplete`",
            "run/checkpoint-4 --out DIR`",
        ),
    ),
    Rule(
        "checkpoint-incomplete-inspected-alone",
        Corrupt("hf-killed-save", None, "run/checkpoint-4"),
        "checkpoint-incomplete",
        "error",
        ".",
        ('checkpoint-2")`', "checkpoint-4.incomplete`"),
    ),
    Rule(
        "checkpoint-incomplete-tmp-checkpoint",
        Corrupt(
            "hf-killed-save",
            lambda root: (root / "run/checkpoint-4").rename(root / "run/tmp-checkpoint-4"),
            "run",
        ),
        "checkpoint-incomplete",
        "error",
        "tmp-checkpoint-4",
        ("no trainer_state.json", 'checkpoint-2")`'),
    ),
    Rule(
        "checkpoint-incomplete-rotation-killed",
        Corrupt("hf-rotation-killed", None, "run"),
        "checkpoint-incomplete",
        "error",
        "checkpoint-1",
        ("lacks the model weights", "rotation", 'checkpoint-2")`'),
    ),
    Rule(
        "checkpoint-incomplete-scheduler-deleted",
        Corrupt("hf-rotation-killed", rm("run/checkpoint-2/scheduler.pt"), "run"),
        "checkpoint-incomplete",
        "error",
        "checkpoint-2",
        ("lacks scheduler.pt",),
    ),
    Rule(
        "checkpoint-incomplete-optimizer-deleted",
        Corrupt("hf-rotation-killed", checkpoint_3_without_optimizer, "run"),
        "checkpoint-incomplete",
        "error",
        "checkpoint-3",
        ("lacks the optimizer state (optimizer.pt)", 'checkpoint-2")`', "checkpoint-3.incomplete`"),
    ),
    Rule(
        "rng-state-missing",
        Corrupt("hf-rotation-killed", rm("run/checkpoint-2/rng_state.pth"), "run/checkpoint-2"),
        "rng-state-missing",
        "info",
        ".",
        ("no rng_state.pth", "not bit-for-bit"),
    ),
    Rule(
        "rng-state-missing-one-rank",
        Corrupt("hf-ds-zero2", rm("checkpoint-2/rng_state_1.pth"), "checkpoint-2"),
        "rng-state-missing",
        "info",
        ".",
        ("no rng_state_1.pth", "not bit-for-bit"),
    ),
    Rule(
        "resume-model-only",
        Corrupt("hf-model-only", None, "run/checkpoint-2"),
        "resume-model-only",
        "info",
        ".",
        ("save_only_model=True", "fresh optimizer"),
    ),
    Rule(
        "resume-model-only-deepspeed",
        Corrupt("hf-ds-model-only", None, "run/checkpoint-2"),
        "resume-model-only",
        "warning",
        ".",
        ("under DeepSpeed", "Can't find a valid checkpoint", 'LlamaForCausalLM.from_pretrained("'),
    ),
    Rule(
        "prune-interrupted",
        Corrupt("hf-rotation-killed", prune_marker("run/checkpoint-2", "pruning", HF_OPTIM), "run"),
        "prune-interrupted",
        "error",
        "checkpoint-2",
        ("half pruned", "started 2025-01-02", "Do not resume or export it", "`ckpt-tui prune hf-rotation-killed/run`"),
    ),
    Rule(
        "optimizer-pruned",
        Corrupt("hf-rotation-killed", prune_marker("run/checkpoint-2", "pruned", HF_OPTIM), "run"),
        "optimizer-pruned",
        "info",
        "checkpoint-2",
        ("model only", "pruned on 2025-01-02", "fresh optimizer"),
    ),
    Rule(
        "optimizer-pruned-deepspeed",
        Corrupt("hf-ds-zero2", prune_marker("checkpoint-2", "pruned", DS_OPTIM), "checkpoint-2"),
        "optimizer-pruned",
        "warning",
        ".",
        ("model only", "DeepSpeed cannot resume it"),
    ),
    Rule(
        "optimizer-state-missing",
        Corrupt("dcp-optim-nograd", None, "checkpoint-2"),
        "optimizer-state-missing",
        "warning",
        ".",
        (
            "`unused.weight`",
            "Missing key in checkpoint state_dict: optimizer.state.unused.weight",
            "allow_partial_load",
        ),
    ),
    Rule("not-a-checkpoint", notes_only, "not-a-checkpoint", "error", "."),
    # unreadable / special-file
    Rule(
        "unreadable-symlink-loop",
        Corrupt("ds-zero2-bf16", symlink_loop),
        "unreadable",
        "warning",
        "logs/loop",
        ("loop",),
    ),
    Rule(
        "unreadable-broken-symlink",
        Corrupt("ds-zero2-bf16", broken_symlink),
        "unreadable",
        "warning",
        "latest_best",
        ("broken",),
    ),
    Rule("unreadable-too-deep", Corrupt("ds-zero2-bf16", deep_nesting), "unreadable", "warning", DEEP, ("deep",)),
    Rule(
        "unreadable-permission",
        Corrupt("ds-zero2-bf16", unreadable_file),
        "unreadable",
        "error",
        f"{TAG}/mp_rank_00_model_states.pt",
        ("permission denied",),
        marks=(ROOT_READS_ALL,),
    ),
    Rule("special-file-fifo", Corrupt("ds-zero2-bf16", fifo), "special-file", "warning", "events.pipe", ("fifo",)),
    # leftover-temp
    Rule(
        "leftover-temp-universal",
        Corrupt("ds-zero2-bf16", killed_universal),
        "leftover-temp",
        "warning",
        ".ckpt-tui-universal-k1lled",
        ("killed ckpt-tui universal", "rm -rf -- ds-zero2-bf16/.ckpt-tui-universal-k1lled"),
    ),
    Rule(
        "leftover-temp-export",
        Corrupt("ds-zero2-bf16", killed_export),
        "leftover-temp",
        "warning",
        ".merged.tmp-4242",
        ("next ckpt-tui export into ds-zero2-bf16/merged", "rm -rf -- ds-zero2-bf16/.merged.tmp-4242"),
    ),
]

# Where the code and the registry's documented severities (docs/reference/finding-codes.md) disagree: (code, severity) -> why. The test below fails
# once either side changes, so an entry cannot outlive the disagreement.
UNDOCUMENTED_SEVERITIES = {
    ("world-size-mismatch", "info"): "a pipeline-parallel tag with ZeRO files is reported as world-size-mismatch/info",
    ("unsafe-pickle", "info"): "with --trust-pickles an unsafe pickle is reported as info",
}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_finding(case: Rule, tmp_path, monkeypatch):
    path = case.build(tmp_path)
    monkeypatch.chdir(tmp_path)  # as a user would: from the folder above, with a relative path
    rep = inspect(os.path.relpath(path, tmp_path), **case.options)
    hits = [f for f in rep.findings if (f.code, f.severity, f.path) == (case.code, case.severity, case.path)]
    assert hits, f"no {(case.code, case.severity, case.path)} in {[(f.code, f.severity, f.path) for f in rep.findings]}"
    f = hits[0]
    for fragment in case.message:
        assert fragment in f.message, f.message
    assert f.fix == case.fix
    if f.command:  # the command the JSON gives is the one the message shows
        assert f"`{f.command}`" in f.message
    assert not (tmp_path / "hf-ds-zero2" / "CANARY").exists()  # no pickle was ever executed
    assert undeclared(rep) == []  # a damaged tree's facts (errors, missing files) are declared too


def documented_codes() -> dict[str, set[str]]:
    """code -> its documented severities: the registry, which docs/reference/finding-codes.md is generated from."""
    from ckpt_tui.core.codes import CODES

    return {c.code: set(c.severities) for c in CODES.values()}


def test_every_documented_code_has_a_row():
    assert sorted(documented_codes()) == sorted({c.code for c in CASES})


def test_severities_are_the_documented_ones():
    documented = documented_codes()
    undocumented = {(c.code, c.severity) for c in CASES if c.severity not in documented.get(c.code, set())}
    assert undocumented == set(UNDOCUMENTED_SEVERITIES)


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if getattr(c.build, "pristine", None)],
    ids=[c.id for c in CASES if getattr(c.build, "pristine", None)],
)
def test_the_corruption_is_what_the_finding_reports(case: Rule, tmp_path):
    """The same tree without the corruption does not give the finding (so each row tests its rule)."""
    rep = inspect(case.build.pristine(tmp_path), **case.options)
    assert (case.code, case.severity, case.path) not in {(f.code, f.severity, f.path) for f in rep.findings}


def test_a_users_own_save_pretrained_named_checkpoint_n_is_no_trainer_checkpoint(tmp_path):
    """`model.save_pretrained("checkpoint-5")` (and "checkpoint-10" beside it) writes no Trainer file: it stays an
    hf-model, whole, with no checkpoint-incomplete or rng-state-missing finding."""
    run = tmp_path / "run"
    for step in (5, 10):
        trees.tree("hf-model-bin", run, name=f"checkpoint-{step}")
    rep = inspect(run / "checkpoint-5")
    assert rep.inventory.layout == "hf-model"
    assert not [f for f in rep.findings if f.code in ("checkpoint-incomplete", "rng-state-missing")], rep.findings
    rep = inspect(run)
    assert [c["complete"] for c in rep.inventory.checkpoints] == [True, True]
    assert not [f for f in rep.findings if f.code in ("checkpoint-incomplete", "rng-state-missing")], rep.findings


def test_a_save_only_model_checkpoint_without_optimizer_is_complete(tmp_path):
    """The checkpoint-incomplete-optimizer-deleted tree, its training_args.bin saying save_only_model: the Trainer
    writes no optimizer.pt then, so nothing is missing."""
    root = trees.tree("hf-rotation-killed", tmp_path)
    checkpoint_3_without_optimizer(root)
    trees.write_file("hf-model-only", "run/checkpoint-2/training_args.bin", root / "run/checkpoint-3/training_args.bin")
    rep = inspect(root / "run")
    assert [f.path for f in rep.findings if f.code == "checkpoint-incomplete"] == ["checkpoint-1"], rep.findings
    assert ("resume-model-only", "checkpoint-3") in {(f.code, f.path) for f in rep.findings}


def test_every_rng_state_there_is_no_finding(tmp_path):
    rep = inspect(trees.tree("hf-ds-zero2", tmp_path) / "checkpoint-2")
    assert not [f for f in rep.findings if f.code == "rng-state-missing"], rep.findings
