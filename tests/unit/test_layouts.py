"""Layout classification, table-driven: one row per layout docs/reference/layouts.md documents, each a tree built
from the real fixtures' headers (data/), some rearranged as the framework in question lays them out."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

from . import trees
from .api import inspect
from .facts import undeclared


@dataclass(frozen=True)
class Layout:
    id: str
    build: Callable[[Path], Path]  # base folder -> the path to inspect
    layout: str
    framework: Optional[str]
    components: dict
    summary: tuple[str, ...]  # fragments the one-line summary must contain
    findings: frozenset = frozenset()  # (code, path): exactly these on this healthy tree
    checkpoints: Optional[list] = None  # run folders: [(path, step, layout, complete)], newest first
    options: dict = field(default_factory=dict)  # inspect() keyword arguments


def variant(name: str, sub: str = "") -> Callable[[Path], Path]:
    return lambda base: trees.tree(name, base) / sub


def composer_save(base: Path) -> Path:
    """composer's save_folder (tests/data/composer/ckpts: its ep0-ba2-rank0.pt and the latest-rank0.pt link)."""
    d = base / "ckpts"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "composer" / "ckpts", d, symlinks=True)
    return d


def _rm(*paths: Path) -> None:
    for p in paths:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def hf_trainer_plain(base: Path) -> Path:
    """HF Trainer without DeepSpeed/FSDP: the weights beside trainer_state.json, no tag folder. (Its
    training_args.bin goes too: it names DeepSpeed, and a DeepSpeed save without its tag is incomplete.)"""
    d = trees.tree("hf-ds-zero2", base) / "checkpoint-2"
    _rm(d / "global_step2", d / "latest", d / "zero_to_fp32.py", d / "zero_to_torch.py", d / "training_args.bin")
    return d


def accelerate_fsdp(base: Path) -> Path:
    """Accelerate save_state with FSDP: the same DCP folders as the HF Trainer's, beside Accelerate's own
    random_states_<rank>.pkl instead of the Trainer's rng_state_<rank>.pth and trainer_state.json."""
    d = trees.tree("hf-fsdp1", base) / "checkpoint-2"
    _rm(d / "trainer_state.json", d / "rng_state_0.pth", d / "rng_state_1.pth")
    for rank in (0, 1):
        trees.write_file("accelerate-save-state", "random_states_0.pkl", d / f"random_states_{rank}.pkl")
    return d


def fsdp_named_dcps_only(base: Path) -> Path:
    """DCP folders named as Accelerate names them, and no file only Accelerate writes: the names alone are
    no evidence of who wrote them, so the framework is plain torch DCP (not "Accelerate")."""
    d = trees.tree("hf-fsdp1", base) / "checkpoint-2"
    _rm(d / "trainer_state.json", d / "rng_state_0.pth", d / "rng_state_1.pth", d / "scheduler.pt")
    return d


def accelerate_deepspeed(base: Path) -> Path:
    """Accelerate save_state with DeepSpeed: the engine's tag folder beside Accelerate's random_states_0.pkl."""
    d = trees.tree("ds-zero2-bf16", base)
    trees.write_file("accelerate-save-state", "random_states_0.pkl", d / "random_states_0.pkl")
    return d


def lightning_file(base: Path) -> Path:
    return trees.write_file("plain-pt", "model.pt", base / "epoch=0-step=2.ckpt")


def safetensors_file(base: Path) -> Path:
    return trees.write_file("accelerate-save-state", "model.safetensors", base / "model.safetensors")


def two_checkpoint_run(base: Path) -> Path:
    return trees.run_folder("hf-fsdp1", "checkpoint-2", (2, 4), base)


def not_a_checkpoint(base: Path) -> Path:
    (base / "notes").mkdir()
    (base / "notes" / "README.txt").write_text("loss went down\n")
    return base / "notes"


FSDP_SUMMARY = "model in `pytorch_model_fsdp_0/` (537.7 kB, 115K params, fp32), optimizer in `optimizer_0/`"

CASES = [
    Layout(
        "hf-trainer-fsdp",
        variant("hf-fsdp1", "checkpoint-2"),
        "hf-trainer-fsdp",
        "HF Trainer + FSDP (sharded)",
        {"model": "pytorch_model_fsdp_0", "optimizer": "optimizer_0"},
        ("HF Trainer + FSDP (sharded), 2 ranks, step 2: " + FSDP_SUMMARY,),
        frozenset({("dcp-components", ".")}),
    ),
    Layout(
        "hf-trainer-deepspeed",
        variant("hf-ds-zero2", "checkpoint-2"),
        "hf-trainer-deepspeed",
        "HF Trainer + DeepSpeed",
        {"model": "global_step2", "optimizer": "global_step2"},
        (
            "HF Trainer + DeepSpeed ZeRO-2 (bf16), 2 ranks, step 2: model and optimizer in `global_step2/` "
            "(1.6 MB, 115K params, fp32)",
        ),
        frozenset({("universal-info-missing", "global_step2")}),
    ),
    Layout(
        "hf-trainer",
        hf_trainer_plain,
        "hf-trainer",
        "HF Trainer",
        {"model": "model.safetensors"},
        ("HF Trainer, step 2: model in `model.safetensors` (232.2 kB, 115K params, bf16)",),
    ),
    Layout(
        "accelerate",
        variant("accelerate-save-state"),
        "accelerate",
        "Accelerate",
        {"model": "model.safetensors", "optimizer": "optimizer.bin"},
        ("Accelerate: model in `model.safetensors` (266.9 kB, 66K params, fp32)", "optimizer in `optimizer.bin`"),
    ),
    Layout(
        "accelerate-fsdp",
        accelerate_fsdp,
        "accelerate-fsdp",
        "Accelerate + FSDP (sharded)",
        {"model": "pytorch_model_fsdp_0", "optimizer": "optimizer_0"},
        ("Accelerate + FSDP (sharded), 2 ranks", FSDP_SUMMARY),
        frozenset({("dcp-components", ".")}),
    ),
    Layout(
        "dcp-folders-named-like-accelerate",
        fsdp_named_dcps_only,
        "dcp",
        "torch.distributed.checkpoint",
        {"model": "pytorch_model_fsdp_0", "optimizer": "optimizer_0"},
        ("torch.distributed.checkpoint, 2 ranks, step 2: " + FSDP_SUMMARY,),
        frozenset({("dcp-components", ".")}),
    ),
    Layout(
        "accelerate-deepspeed",
        accelerate_deepspeed,
        "accelerate-deepspeed",
        "Accelerate + DeepSpeed",
        {"model": "global_step2", "optimizer": "global_step2"},
        ("Accelerate + DeepSpeed ZeRO-2 (bf16), 2 ranks, step 2",),
        frozenset({("universal-info-missing", "global_step2")}),
    ),
    Layout(
        "fsdp-full",
        variant("fsdp-full"),
        "fsdp-full",
        "FSDP (full state dict)",
        {"model": "pytorch_model_fsdp.bin"},
        ("model in `pytorch_model_fsdp.bin` (272.7 kB, 66K params, fp32)",),
    ),
    Layout(
        "fsdp-local",
        variant("fsdp-local"),
        "fsdp-local",
        "FSDP (local state dict)",
        {"model": "pytorch_model_fsdp_rank0.bin"},
        ("FSDP (local state dict): model in `pytorch_model_fsdp_rank0.bin`",),
    ),
    Layout(
        "deepspeed-zero2",
        variant("ds-zero2-bf16"),
        "deepspeed",
        "DeepSpeed",
        {"model": "global_step2", "optimizer": "global_step2"},
        (
            "DeepSpeed ZeRO-2 (bf16), 2 ranks, step 2: model and optimizer in `global_step2/` (942.2 kB, 66K params, fp32)",
        ),
        frozenset({("universal-info-missing", "global_step2")}),
    ),
    Layout(
        "deepspeed-zero3",
        variant("ds-zero3-bf16"),
        "deepspeed",
        "DeepSpeed",
        {"model": "global_step2", "optimizer": "global_step2"},
        ("DeepSpeed ZeRO-3 (bf16), 2 ranks, step 2",),
        frozenset({("resume-world-size", "global_step2")}),
    ),
    Layout(
        "deepspeed-zero2-3ranks",
        variant("ds-zero2-3ranks"),
        "deepspeed",
        "DeepSpeed",
        {"model": "global_step2", "optimizer": "global_step2"},
        ("DeepSpeed ZeRO-2 (bf16), 3 ranks, step 2",),
        frozenset({("universal-info-missing", "global_step2")}),
    ),
    Layout(
        "lightning-deepspeed",
        variant("lightning-ds-zero2", "checkpoints/epoch=0-step=2.ckpt"),
        "lightning-deepspeed",
        "Lightning + DeepSpeed",
        {"model": "checkpoint", "optimizer": "checkpoint"},
        ("Lightning + DeepSpeed ZeRO-2 (bf16), 2 ranks, step 2: model and optimizer in `checkpoint/`",),
        frozenset({("universal-info-missing", "checkpoint")}),
    ),
    Layout(
        "lightning-fsdp",
        variant("lightning-fsdp", "checkpoints/epoch=0-step=2.ckpt"),
        "lightning-fsdp",
        "Lightning + FSDP (sharded)",
        {"model": "."},
        ("Lightning + FSDP (sharded), 2 ranks, step 2: model in this folder (1.0 MB, 199K params, fp32)",),
    ),
    Layout(
        "lightning",
        lightning_file,
        "lightning",
        "Lightning",
        {"model+optimizer": "."},
        ("Lightning, step 2", "270.5 kB, 66K params, fp32"),
    ),
    Layout(
        "dcp-fsdp1",
        variant("fsdp1-dcp"),
        "dcp",
        "torch.distributed.checkpoint",
        {"model": "."},
        ("torch.distributed.checkpoint, 2 ranks: model in this folder (325.1 kB, 66K params, fp32)",),
    ),
    Layout(
        "dcp-fsdp2-model-and-optimizer",
        variant("fsdp2-dcp"),
        "dcp",
        "torch.distributed.checkpoint",
        {"model": ".", "optimizer": "."},
        ("2 ranks: model and optimizer in this folder",),
    ),
    Layout(
        "dcp-rank-local-metadata",
        variant("dcp-ranklocal"),
        "dcp",
        "torch.distributed.checkpoint",
        {"model": "."},
        ("torch.distributed.checkpoint, 2 ranks: model in this folder",),
    ),
    Layout(
        "torchtitan",
        variant("torchtitan", "checkpoint/step-1"),
        "torchtitan",
        "torchtitan",
        {"model": ".", "optimizer": "."},
        ("torchtitan, 2 ranks, step 1: model and optimizer in this folder", "fp32"),
        frozenset({("to-hf", ".")}),  # a Llama: --to hf, given --config (it saved no job config)
    ),
    Layout(  # inspected alone, torchtitan's model-only last-step export holds no torchtitan entry (inspected in
        # its run, beside a step holding train_state/dataloader/lr_scheduler, it is torchtitan's: test_tensor_listing)
        "torchtitan-model-only",
        variant("torchtitan", "checkpoint/step-2"),
        "dcp",
        "torch.distributed.checkpoint",
        {"model": "."},
        ("torch.distributed.checkpoint, 2 ranks, step 2: model in this folder", "bf16"),
        frozenset({("to-hf", ".")}),
    ),
    Layout(  # committed: written by composer 0.32.1 on torch 2.7.0 (ckpt_tui/samples/composer_run.py)
        "composer",
        composer_save,
        "composer",
        "composer",
        {"model+optimizer": "ep0-ba2-rank0.pt"},
        ("composer: model and optimizer in `ep0-ba2-rank0.pt`", "676 params", "fp32"),
    ),
    Layout(
        "universal",
        variant("universal-zero2"),
        "universal",
        "DeepSpeed universal checkpoint",
        {"model": "global_step2_universal", "optimizer": "global_step2_universal"},
        ("DeepSpeed universal checkpoint: model and optimizer in `global_step2_universal/`",),
    ),
    Layout(
        "hf-model-sharded",
        variant("hf-model-sharded"),
        "hf-model",
        "Hugging Face model",
        {"model": "model.safetensors.index.json"},
        ("Hugging Face model: model in `model.safetensors.index.json`", "115K params, fp32"),
    ),
    Layout(
        "hf-model-bin",
        variant("hf-model-bin"),
        "hf-model",
        "Hugging Face model",
        {"model": "pytorch_model.bin"},
        ("Hugging Face model: model in `pytorch_model.bin` (468.8 kB, 115K params, fp32)",),
    ),
    Layout(
        "megatron-legacy",
        variant("megatron-legacy"),
        "megatron-legacy",
        "Megatron (legacy)",
        {"model+optimizer": "iter_0000010/mp_rank_00/model_optim_rng.pt"},
        ("Megatron (legacy), step 10: model and optimizer in `iter_0000010/mp_rank_00/model_optim_rng.pt`",),
    ),
    Layout(
        "verl-fsdp",
        variant("verl-fsdp2", "checkpoints/global_step_1/actor"),
        "verl-fsdp",
        "verl (FSDP)",
        {"model": ".", "optimizer": "."},
        ("verl (FSDP), FSDP2 (DTensor) rank files, 2 ranks: model and optimizer in this folder",),
    ),
    Layout(
        "verl-fsdp1",
        variant("verl-fsdp1", "checkpoints/global_step_1/actor"),
        "verl-fsdp",
        "verl (FSDP)",
        {"model": ".", "optimizer": "."},
        ("verl (FSDP), FSDP1 (ShardedTensor) rank files, 2 ranks: model and optimizer in this folder",),
    ),
    Layout(
        "verl-run",
        variant("verl-fsdp2", "checkpoints"),
        "run-folder",
        None,
        {},
        (
            "run folder with 1 checkpoint; newest `global_step_1/`: verl (FSDP), FSDP2 (DTensor) rank files, 2 ranks, "
            "step 1",
        ),
        checkpoints=[("global_step_1", 1, "verl-fsdp", True)],
    ),
    Layout(
        "megatron-dist",
        variant("megatron-dist", "checkpoints"),
        "megatron-dist",
        "Megatron-Core (torch_dist)",
        {"model": "iter_0000010"},
        ("Megatron-Core (torch_dist), TP=2, 2 ranks, step 10: model in `iter_0000010/`", "bf16/fp32"),
    ),
    Layout(
        "run-folder",
        variant("hf-ds-zero2"),
        "run-folder",
        None,
        {},
        ("run folder with 1 checkpoint; newest `checkpoint-2/`: HF Trainer + DeepSpeed ZeRO-2 (bf16)",),
        frozenset({("universal-info-missing", "checkpoint-2/global_step2")}),
        [("checkpoint-2", 2, "hf-trainer-deepspeed", True)],
    ),
    Layout(
        "run-folder-newest-first",
        two_checkpoint_run,
        "run-folder",
        None,
        {},
        ("run folder with 2 checkpoints; newest `checkpoint-4/`: HF Trainer + FSDP (sharded), 2 ranks, step 4",),
        frozenset({("dcp-components", "checkpoint-2"), ("dcp-components", "checkpoint-4")}),
        [("checkpoint-4", 4, "hf-trainer-fsdp", True), ("checkpoint-2", 2, "hf-trainer-fsdp", True)],
    ),
    Layout(
        "run-folder-lightning",
        variant("lightning-ds-zero2"),
        "run-folder",
        None,
        {},
        ("newest `checkpoints/epoch=0-step=2.ckpt/`: Lightning + DeepSpeed ZeRO-2",),
        frozenset({("universal-info-missing", "checkpoints/epoch=0-step=2.ckpt/checkpoint")}),
        [("checkpoints/epoch=0-step=2.ckpt", 2, "lightning-deepspeed", True)],
    ),
    Layout(
        "torch-file-folder",
        variant("plain-pt"),
        "torch-file",
        "torch.save",
        {"model": "model.pt"},
        ("torch.save: model in `model.pt` (270.5 kB, 66K params, fp32)",),
    ),
    Layout(
        "torch-file",
        variant("plain-pt", "model.pt"),
        "torch-file",
        "torch.save",
        {"model": "."},
        ("torch.save: model in", "(270.5 kB, 66K params, fp32)"),
    ),
    Layout(
        "safetensors-file",
        safetensors_file,
        "safetensors-file",
        "safetensors",
        {"model": "."},
        ("safetensors: model in", "(266.9 kB, 66K params, fp32)"),
    ),
    Layout(
        "unknown", not_a_checkpoint, "unknown", None, {}, ("not a checkpoint",), frozenset({("not-a-checkpoint", ".")})
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layout(case: Layout, tmp_path):
    rep = inspect(case.build(tmp_path), **case.options)
    inv = rep.inventory
    assert (inv.layout, inv.framework) == (case.layout, case.framework), inv.summary
    assert inv.components == case.components
    for fragment in case.summary:
        assert fragment in inv.summary
    assert {(f.code, f.path) for f in rep.findings} == case.findings, rep.findings
    assert undeclared(rep) == []
    for role, rel in case.components.items():  # each component names a node that plays that role
        node = inv.node(rel)
        assert node is not None and role in node.role.split("+") + [node.role], (role, rel, node and node.role)
    if case.checkpoints is not None:
        got = [(c["path"], c["step"], c["layout"], c["complete"]) for c in inv.checkpoints]
        assert got == case.checkpoints


def test_every_documented_layout_has_a_row():
    from ckpt_tui.core.layout import LAYOUTS  # what docs/reference/layouts.md is generated from

    assert sorted(LAYOUTS) == sorted({c.layout for c in CASES})
