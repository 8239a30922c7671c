"""Real sample checkpoints, written by the real frameworks on CPU.

Each *group* is one generator module run as its own launch
(``python -m torch.distributed.run --standalone --nproc_per_node N -m ckpt_tui.samples.<module> OUTDIR [variants]``)
that writes one sub-folder per *variant* under OUTDIR. This module only launches them: it imports no torch.

    generate("ds_engine", Path("out"))            # all variants of a group
    generate("torch_dcp", Path("out"), ["fsdp2-dcp"])
    build_demo(Path("somewhere/demo"))            # the `ckpt-tui demo` run (torch + deepspeed only)
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core.userdirs import cache_home

__all__ = [
    "GROUPS",
    "VARIANTS",
    "EXPECTED",
    "SKIPPED",
    "Group",
    "GenerationError",
    "generate",
    "build_demo",
    "demo_is_built",
    "demo_stamp",
    "source_hash",
    "group_hash",
    "STEP_PREFIX",
    "launch_env",
    "big_torch_checkpoint",
]


@dataclass(frozen=True)
class Group:
    module: str  # ckpt_tui.samples.<module>
    nproc: int
    variants: tuple[str, ...]
    # variants made after the launch by a converter, from another variant of the same group: name -> source
    derived: dict[str, str] = field(default_factory=dict)
    # a producer that cannot live beside the test pins runs in its own cached venv: a key of venvs.VENVS
    venv: str | None = None


GROUPS: dict[str, Group] = {
    "ds_engine": Group(
        "ds_engine",
        2,
        (
            "ds-zero1-bf16",
            "ds-zero2-bf16",
            "ds-zero3-bf16",
            "ds-zero2-fp32",
            "ds-zero2-tied",
            "ds-zero1-frozen",
            "ds-zero2-frozen",
            "ds-zero3-frozen",
            "universal",
            "universal-zero2",
        ),
        derived={"universal": "ds-zero3-bf16", "universal-zero2": "ds-zero2-bf16"},
    ),
    "ds_engine_3ranks": Group("ds_engine", 3, ("ds-zero2-3ranks", "ds-zero3-3ranks")),
    "ds_beyond": Group("ds_beyond", 2, ("ds-zero0-bf16", "ds-zero0-fp32", "ds-bf16-optimizer", "ds-pipeline")),
    "ds_resume": Group("ds_resume", 2, ("ds-resume-zero2", "ds-resume-zero3")),
    # DeepSpeed mixture of experts (deepspeed.moe.layer.MoE, 4 experts): expert-parallel 2 and 1, ZeRO-2 and 1
    "ds_moe": Group("ds_moe", 2, ("ds-moe-ep2-zero2-bf16", "ds-moe-ep1-zero2-fp32", "ds-moe-ep2-zero1-bf16")),
    "hf_trainer": Group(
        "hf_trainer",
        2,
        ("hf-ds-zero1", "hf-ds-zero2", "hf-ds-zero3", "hf-ds-zero2-tied-frozen", "hf-fsdp1", "hf-fsdp2"),
    ),
    # HF Trainer + PEFT LoRA (one module, two launches): one process, then 2 ranks (DDP, DeepSpeed, FSDP)
    "hf_peft": Group(
        "hf_peft",
        1,
        (
            "peft-llama",
            "peft-llama-bias-bf16",
            "peft-gpt2-rslora",
            "peft-llama-resized",
            "full-gpt2-optim",
            "full-llama-bias-optim",
        ),
    ),
    "hf_peft_dist": Group(
        "hf_peft",
        2,
        ("peft-ddp-mts", "full-ddp-model-only", "peft-ds-zero2", "peft-ds-zero3", "peft-fsdp2", "peft-fsdp1"),
    ),
    "lightning": Group("lightning_ckpt", 2, ("lightning-ds-zero2", "lightning-ds-zero3", "lightning-fsdp")),
    "torch_dcp": Group(
        "torch_dcp",
        2,
        (
            "fsdp1-dcp",
            "fsdp2-dcp",
            "fsdp-full",
            "fsdp-local",
            "dcp-ranklocal",
            "dcp-safetensors",
            "dcp-fs-safetensors",
            "dcp-mixed",
            "fsdp2-rank0-slice",
            "fsdp2-zstd",
            "hf-storage-distributed",
            "hf-storage-single",
        ),
    ),
    # written by the frameworks themselves, in a cached venv of their own (samples/venvs.py)
    "megatron_dist": Group("megatron_dist", 2, ("megatron-dist",), venv="megatron-torchtitan"),
    # the same save by megatron-core 0.19, which writes no common.pt: its common state is a DCP entry
    "megatron_dist_019": Group("megatron_dist", 2, ("megatron-dist-019", "megatron-pp2"), venv="megatron-019"),
    "megatron_dist_4": Group("megatron_dist", 4, ("megatron-tp2pp2",), venv="megatron-019"),
    # pipeline-parallel 2 (2 ranks) and TP=2 x PP=2 (4 ranks) by megatron-core 0.16: common.pt beside the DCP
    "megatron_dist_016_pp": Group("megatron_dist", 2, ("megatron-pp2-016",), venv="megatron-torchtitan"),
    "megatron_dist_016_4": Group("megatron_dist", 4, ("megatron-tp2pp2-016",), venv="megatron-torchtitan"),
    # a tiny Llama-family GPTModel (RMSNorm, SwiGLU, rope, GQA) saved at TP=1, TP=2 and PP=2 (and tied, and with
    # Qwen2's q/k/v biases or biases on every linear layer), with megatron's own fp32 logits on a fixed batch as the
    # oracle of `export --to hf`: by 0.19, and by 0.16
    "megatron_hf": Group(
        "megatron_hf",
        2,
        (
            "megatron-hf-tp1",
            "megatron-hf-tp2",
            "megatron-hf-tied",
            "megatron-hf-pp2",
            "megatron-hf-qkvbias",
            "megatron-hf-bias",
        ),
        venv="megatron-019",
    ),
    "megatron_hf_016": Group(
        "megatron_hf",
        2,
        ("megatron-hf-tp2-016", "megatron-hf-tp1-016", "megatron-hf-pp2-016"),
        venv="megatron-torchtitan",
    ),
    "torchtitan": Group("torchtitan_ckpt", 2, ("torchtitan",), venv="megatron-torchtitan"),
    # a tiny GQA Llama3 with distinct norm weights and a saved job config, with torchtitan's own to_hf tensors and
    # logits as the oracle of `export --to hf`
    "torchtitan_hf": Group("torchtitan_hf", 2, ("torchtitan-hf",), venv="megatron-torchtitan"),
    "single": Group(
        "single",
        1,
        (
            "accelerate-save-state",
            "hf-model-sharded",
            "hf-model-bin",
            "megatron-legacy",
            "plain-pt",
            "plain-pt-optim",
            "plain-pt-optim-groups",
            "lightning-file-optim",
        ),
    ),
    # saves that went wrong the common ways (killed, rotated, model-only, ungathered ZeRO-3), one process
    "hf_broken": Group(
        "hf_broken",
        1,
        (
            "hf-killed-save",
            "hf-rotation-killed",
            "hf-model-only",
            "dcp-optim-nograd",
            "hf-ds-model-only",
            "zero3-ungathered",
            "zero3-peft-ungathered",
        ),
    ),
    "demo": Group("demo", 2, ("demo",)),
    "verl": Group("verl_fsdp", 2, ("verl-fsdp2", "verl-fsdp1"), venv="verl"),
}

# variant -> group
VARIANTS: dict[str, str] = {v: g for g, grp in GROUPS.items() for v in grp.variants}

# Variants asked for but not produced for real on CPU with the pinned versions: name -> reason.
SKIPPED: dict[str, str] = {}


def _ds(tag: str, world: int, zero3: bool, bf16: bool = True) -> list[str]:
    p = "bf16_" if bf16 else ""
    files = ["latest", "zero_to_fp32.py"]
    files += [f"{tag}/{p}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
    if zero3:
        files += [f"{tag}/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)]
    else:
        files += [f"{tag}/mp_rank_00_model_states.pt"]
    return files


def _dcp(prefix: str = "", world: int = 2) -> list[str]:
    return [f"{prefix}.metadata"] + [f"{prefix}__{r}_0.distcp" for r in range(world)]


def _hf_ds(zero3: bool) -> list[str]:
    c = "checkpoint-2/"
    files = [c + f for f in _ds("global_step2", 2, zero3)]
    files += [
        c + f for f in ("rng_state_0.pth", "rng_state_1.pth", "trainer_state.json", "training_args.bin", "config.json")
    ]
    if not zero3:
        files.append(c + "model.safetensors")
    return files


def _hf_fsdp() -> list[str]:
    c = "checkpoint-2/"
    return (
        _dcp(c + "pytorch_model_fsdp_0/")
        + _dcp(c + "optimizer_0/")
        + [c + f for f in ("rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json")]
    )


def _ds_beyond(files: list[str], oracle_ranks: int = 1) -> list[str]:
    """``checkpoint/`` as DeepSpeed wrote it, and beside it ``oracle/``: what its engine loaded back."""
    return (
        ["checkpoint/latest"]
        + [f"checkpoint/global_step2/{f}" for f in files]
        + [f"oracle/rank{r}.pt" for r in range(oracle_ranks)]
    )


def _ds_moe(bf16: bool, experts: int = 4) -> list[str]:
    """A ds_moe.py save: ``checkpoint/`` with each expert's file beside the usual ZeRO-1/2 files, and
    ``oracle/rank{r}.pt`` (each rank: the experts of its expert-parallel rank, under global names)."""
    zero = [f for f in _ds("global_step2", 2, False, bf16) if f.startswith("global_step2/")]
    moe = [f"global_step2/layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(experts)]
    return _ds_beyond([f.split("/", 1)[1] for f in zero + moe], oracle_ranks=2)


_RUN = "run/checkpoint-2/"
_BASE = ["base-model/config.json", "base-model/model.safetensors"]
_TRAINER = ["trainer_state.json", "training_args.bin", "optimizer.pt", "scheduler.pt"]


def _megatron(ranks: int, common_pt: bool = False) -> list[str]:
    """A megatron_dist.py save: ``checkpoints/iter_0000010/`` (every rank's .distcp: megatron's writer may split a
    rank's data over several files, __{rank}_{i}.distcp), the tracker beside it, and oracle/ (megatron's own load)."""
    files = [".metadata", *(f"__{r}_*.distcp" for r in range(ranks)), "metadata.json"]
    files += ["common.pt"] if common_pt else []
    return [f"checkpoints/iter_0000010/{f}" for f in files] + [
        "checkpoints/latest_checkpointed_iteration.txt",
        "oracle/model.pt",
        "oracle/keys.json",
    ]


def _megatron_hf(ranks: int, common_pt: bool = False) -> list[str]:
    """A megatron_hf.py save: as :func:`_megatron`'s, its oracle megatron's logits on a fixed batch."""
    return [f for f in _megatron(ranks, common_pt) if not f.startswith("oracle/")] + ["oracle/logits.pt"]


def _hf_peft(kind: str) -> list[str]:
    """A Trainer run of samples/hf_peft.py: ``base-model/``, ``run/checkpoint-2/`` and ``oracle/``.
    ``kind``: "single" / "ddp" (adapter folder + optimizer.pt), "ds2" / "ds3" (adapter folder + tag),
    "fsdp" (DCP folders only: no adapter_config.json), "full" (no PEFT: model.safetensors + optimizer.pt)."""
    rng = ["rng_state.pth"] if kind in ("single", "full") else ["rng_state_0.pth", "rng_state_1.pth"]
    oracle = ["oracle/optimizer_names.json"]
    if kind == "full":
        return [_RUN + f for f in _TRAINER + rng + ["config.json", "model.safetensors"]] + oracle
    oracle.append("oracle/adapter_state.safetensors")
    adapter = ["adapter_config.json", "adapter_model.safetensors"]
    if kind in ("single", "ddp"):
        files = _TRAINER + rng + adapter
    elif kind in ("ds2", "ds3"):
        files = ["trainer_state.json", "training_args.bin"] + rng + adapter + _ds("global_step2", 2, kind == "ds3")
        oracle.append("oracle/adapter_state_fp32.safetensors")
    else:
        files = ["trainer_state.json", "scheduler.pt"] + rng + _dcp("pytorch_model_fsdp_0/") + _dcp("optimizer_0/")
    return _BASE + [_RUN + f for f in files] + oracle


_LIT = "checkpoints/epoch=0-step=2.ckpt/"


def _verl(merged: bool) -> list[str]:
    a = "checkpoints/global_step_1/actor/"
    files = [a + f"{kind}_world_size_2_rank_{r}.pt" for kind in ("model", "optim", "extra_state") for r in range(2)]
    files += [
        a + "fsdp_config.json",
        a + "huggingface/config.json",
        a + "huggingface/tokenizer.json",
        "oracle/model_full.pt",
        "oracle/optim_full.pt",
    ]
    if merged:
        files += ["oracle/merged/model.safetensors", "oracle/merged/config.json"]
    return files


# variant -> paths (relative to the variant folder) that must exist after generation.
EXPECTED: dict[str, list[str]] = {
    "ds-zero1-bf16": _ds("global_step2", 2, False),
    "ds-zero2-bf16": _ds("global_step2", 2, False),
    "ds-zero3-bf16": _ds("global_step2", 2, True),
    "ds-zero2-fp32": _ds("global_step2", 2, False, bf16=False),
    "ds-zero2-tied": _ds("global_step2", 2, False),
    "ds-zero1-frozen": _ds("global_step2", 2, False),
    "ds-zero2-frozen": _ds("global_step2", 2, False),
    "ds-zero3-frozen": _ds("global_step2", 2, True),
    "ds-zero2-3ranks": _ds("global_step2", 3, False),
    "ds-zero3-3ranks": _ds("global_step2", 3, True),
    "ds-zero0-bf16": _ds_beyond(["mp_rank_00_model_states.pt"]),
    "ds-zero0-fp32": _ds_beyond(["mp_rank_00_model_states.pt"]),
    "ds-bf16-optimizer": _ds_beyond(
        [
            "mp_rank_00_model_states.pt",
            "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ]
    ),
    "ds-pipeline": _ds_beyond(
        [f"layer_0{i}-model_states.pt" for i in range(5)]
        + ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"],
        oracle_ranks=2,
    ),
    "ds-resume-zero2": [f"checkpoint/{f}" for f in _ds("global_step2", 2, False, bf16=False)] + ["reference.pt"],
    "ds-resume-zero3": [f"checkpoint/{f}" for f in _ds("global_step2", 2, True, bf16=False)] + ["reference.pt"],
    "universal": [
        "latest_universal",
        "global_step2_universal/zero/optimizer_state.pt",
        "global_step2_universal/zero/lm_head.weight/fp32.pt",
        "global_step2_universal/zero/lm_head.weight/exp_avg.pt",
        "global_step2_universal/zero_pp_rank_0_mp_rank_00_model_states.pt",
    ],
    "universal-zero2": [
        "latest_universal",
        "global_step2_universal/zero/optimizer_state.pt",
        "global_step2_universal/zero/lm_head.weight/fp32.pt",
        "global_step2_universal/mp_rank_00_model_states.pt",
    ],
    "hf-ds-zero1": _hf_ds(False),
    "hf-ds-zero2": _hf_ds(False),
    "hf-ds-zero3": _hf_ds(True),
    "hf-ds-zero2-tied-frozen": _hf_ds(False),
    "hf-fsdp1": _hf_fsdp(),
    "hf-fsdp2": _hf_fsdp(),
    "peft-llama": _hf_peft("single"),
    "peft-llama-bias-bf16": _hf_peft("single"),
    "peft-gpt2-rslora": _hf_peft("single"),
    "peft-llama-resized": _hf_peft("single"),
    "full-gpt2-optim": _hf_peft("full"),
    "full-llama-bias-optim": _hf_peft("full"),
    "peft-ddp-mts": _hf_peft("ddp"),
    "full-ddp-model-only": [_RUN + f for f in ("model.safetensors", "trainer_state.json", "training_args.bin")],
    "peft-ds-zero2": _hf_peft("ds2"),
    "peft-ds-zero3": _hf_peft("ds3"),
    "peft-fsdp2": _hf_peft("fsdp"),
    "peft-fsdp1": _hf_peft("fsdp"),
    "ds-moe-ep2-zero2-bf16": _ds_moe(True),
    "ds-moe-ep1-zero2-fp32": _ds_moe(False),
    "ds-moe-ep2-zero1-bf16": _ds_moe(True),
    "lightning-ds-zero2": [
        _LIT + f
        for f in [
            "latest",
            "zero_to_fp32.py",
            "checkpoint/mp_rank_00_model_states.pt",
            "checkpoint/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "checkpoint/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ]
    ],
    "lightning-ds-zero3": [
        _LIT + f
        for f in [
            "latest",
            "zero_to_fp32.py",
            "checkpoint/zero_pp_rank_0_mp_rank_00_model_states.pt",
            "checkpoint/zero_pp_rank_1_mp_rank_00_model_states.pt",
            "checkpoint/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "checkpoint/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ]
    ],
    "lightning-fsdp": _dcp(_LIT) + [_LIT + "meta.pt"],
    "fsdp1-dcp": _dcp(),
    "fsdp2-dcp": _dcp(),
    "fsdp2-zstd": _dcp(),
    "hf-storage-distributed": [
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors",
    ],
    "hf-storage-single": ["model-00001-of-00001.safetensors", "model.safetensors.index.json"],
    "fsdp-full": ["pytorch_model_fsdp.bin"],
    "fsdp-local": ["pytorch_model_fsdp_rank0.bin", "pytorch_model_fsdp_rank1.bin"],
    "dcp-ranklocal": ["__0.metadata", "__1.metadata", "__0_0.distcp", "__1_0.distcp"],
    "dcp-safetensors": [
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
        "sharded/shard-00001-model-00001-of-00001.safetensors",
        "sharded/shard-00002-model-00001-of-00001.safetensors",
    ],
    "dcp-fs-safetensors": _dcp(),
    "torchtitan": _dcp("checkpoint/step-1/") + _dcp("checkpoint/step-2/"),
    "torchtitan-hf": _dcp("checkpoint/step-1/")
    + _dcp("checkpoint/step-2/")
    + ["job_config.json"]
    + [f"oracle/{k}-step-{s}.{e}" for s in (1, 2) for k, e in (("to_hf", "safetensors"), ("logits", "pt"))],
    # megatron's writer splits each rank's data over two files (__{rank}_0/1.distcp); oracle/ is its own load
    "megatron-dist": _megatron(2, common_pt=True),
    "megatron-dist-019": _megatron(2),  # megatron-core 0.19 writes no common.pt (a common_state/ DCP entry)
    "megatron-pp2": _megatron(2),
    "megatron-tp2pp2": _megatron(4),
    "megatron-pp2-016": _megatron(2, common_pt=True),
    "megatron-tp2pp2-016": _megatron(4, common_pt=True),
    "megatron-hf-tp1": _megatron_hf(1),  # TP=1 on 2 ranks: two data-parallel replicas, one writes
    "megatron-hf-tp2": _megatron_hf(2),
    "megatron-hf-tied": _megatron_hf(2),
    "megatron-hf-pp2": _megatron_hf(2),
    "megatron-hf-qkvbias": _megatron_hf(2),
    "megatron-hf-bias": _megatron_hf(2),
    "megatron-hf-tp2-016": _megatron_hf(2, common_pt=True),
    "megatron-hf-tp1-016": _megatron_hf(1, common_pt=True),
    "megatron-hf-pp2-016": _megatron_hf(2, common_pt=True),
    "dcp-mixed": _dcp("model/") + _dcp("optimizer/") + _dcp("combined/"),
    "fsdp2-rank0-slice": _dcp("checkpoint-2/pytorch_model_fsdp_0/") + ["checkpoint-2/model.safetensors"],
    "accelerate-save-state": ["model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"],
    "hf-model-sharded": ["config.json", "model.safetensors.index.json", "model-00001-of-*.safetensors"],
    "hf-model-bin": ["config.json", "pytorch_model.bin"],
    "megatron-legacy": ["iter_0000010/mp_rank_00/model_optim_rng.pt", "latest_checkpointed_iteration.txt"],
    "plain-pt": ["model.pt"],
    "plain-pt-optim": ["checkpoint.pt"],
    "plain-pt-optim-groups": ["checkpoint.pt"],
    "lightning-file-optim": ["last.ckpt"],
    "hf-killed-save": [_RUN + f for f in _TRAINER + ["rng_state.pth", "model.safetensors"]]
    + ["run/checkpoint-4/" + f for f in ("model.safetensors", "optimizer.pt", "scheduler.pt", "training_args.bin")],
    "hf-rotation-killed": [_RUN + f for f in _TRAINER + ["rng_state.pth", "model.safetensors"]]
    + ["run/checkpoint-1/" + f for f in _TRAINER + ["rng_state.pth"]],
    "hf-model-only": [_RUN + f for f in ("model.safetensors", "trainer_state.json", "training_args.bin")],
    "hf-ds-model-only": [_RUN + f for f in ("model.safetensors", "trainer_state.json", "training_args.bin")],
    "dcp-optim-nograd": _dcp("checkpoint-2/", world=1),
    "zero3-ungathered": ["state_dict.pt", "checkpoint-2/model.safetensors", "oracle/model.safetensors"]
    + [f"checkpoint-2/{f}" for f in _ds("global_step2", 1, True, bf16=False)],
    "zero3-peft-ungathered": _BASE
    + ["oracle/adapter_state.safetensors"]
    + [
        f"{sub}/checkpoint-2/{f}"
        for sub in ("ungathered", "no-tensors")
        for f in ["adapter_config.json", "adapter_model.safetensors"] + _ds("global_step2", 1, True, bf16=False)
    ],
    "verl-fsdp2": _verl(True),
    "verl-fsdp1": _verl(False),
    "demo": (
        [f"fsdp-trainer-run/checkpoint-20/{f}" for f in _dcp("pytorch_model_fsdp_0/") + _dcp("optimizer_0/")]
        + [
            f"fsdp-trainer-run/checkpoint-20/{f}"
            for f in ("rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json")
        ]
        + [f"deepspeed-zero2/{f}" for f in _ds("global_step3", 2, False)]
    ),
}
assert set(EXPECTED) == set(VARIANTS), set(EXPECTED) ^ set(VARIANTS)


class GenerationError(RuntimeError):
    pass


def _project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def launch_env() -> dict[str, str]:
    """A clean environment for a generator launch (nothing inherited that could change what is written)."""
    keep = ("HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "TERM")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    bindir = str(Path(sys.executable).parent)  # ninja for DeepSpeed's op build lives beside the interpreter
    env["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "/usr/bin:/bin")])
    env["PYTHONPATH"] = str(_project_root())
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONUNBUFFERED="1",
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(cache_home() / "torch_extensions")),
    )
    if "HF_HOME" in os.environ:
        env["HF_HOME"] = os.environ["HF_HOME"]
    return env


def _run(cmd: list[str], cwd: Path, on_line: Callable[[str], None] | None, timeout: float) -> tuple[int, str]:
    tail: deque[str] = deque(maxlen=60)
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,  # own process group: torchrun and its ranks end together
    )

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.daemon = True
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            if on_line is not None:
                on_line(line)
        rc = proc.wait()
    except BaseException:
        kill_group()
        proc.wait()
        raise
    finally:
        watchdog.cancel()
    if rc == -signal.SIGKILL:
        tail.append(f"[killed after {timeout:.0f} s]")
    return rc, "\n".join(tail)


def _missing(outdir: Path, variants: list[str]) -> list[str]:
    missing = []
    for v in variants:
        for pattern in EXPECTED[v]:
            if not any((outdir / v).glob(pattern)):
                missing.append(f"{v}/{pattern}")
    return missing


def generate(
    group: str,
    outdir: Path,
    variants: list[str] | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout: float = 900,
) -> None:
    """Write ``outdir/<variant>/`` for each variant of ``group`` (default: all), launching the generator.

    Succeeds only if every expected file exists; one failed attempt is retried once.
    """
    grp = GROUPS[group]
    wanted = list(grp.variants) if variants is None else list(variants)
    unknown = [v for v in wanted if v not in grp.variants]
    if unknown:
        raise ValueError(f"variants {unknown} are not in group {group!r}: {list(grp.variants)}")
    launched = [v for v in wanted if v not in grp.derived]
    for v in wanted:
        src = grp.derived.get(v)
        if src and src not in launched:
            launched.append(src)
    outdir = Path(outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)

    python = sys.executable
    if grp.venv is not None:
        from .venvs import python_for

        python = str(python_for(grp.venv, on_line=on_line))
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={grp.nproc}",
        "-m",
        f"ckpt_tui.samples.{grp.module}",
        str(outdir),
        *launched,
    ]
    _attempt(lambda: _run(cmd, outdir, on_line, timeout), outdir, launched)

    for v in wanted:
        src = grp.derived.get(v)
        if src:
            _attempt(functools.partial(_to_universal, outdir / src, outdir / v, on_line, timeout), outdir, [v])


def _attempt(run: Callable[[], tuple[int, str]], outdir: Path, variants: list[str]) -> None:
    for attempt in (1, 2):
        for v in variants:
            shutil.rmtree(outdir / v, ignore_errors=True)
        rc, tail = run()
        missing = _missing(outdir, variants)
        if not missing:
            return  # FIXTURES.md: a run may abort at interpreter exit after writing everything
        if attempt == 2:
            raise GenerationError(f"exit code {rc}; missing {missing[:5]}\n--- last output ---\n{tail}")


def _to_universal(src: Path, dst: Path, on_line, timeout: float) -> tuple[int, str]:
    tag = (src / "latest").read_text().strip()
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(src / tag),
        "--output_folder",
        str(dst / f"{tag}_universal"),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    if (src / tag / "mp_rank_00_model_states.pt").exists():  # ZeRO-1/2 lack universal_checkpoint_info
        cmd.append("--inject_missing_state")
    dst.mkdir(parents=True, exist_ok=True)
    return _run(cmd, dst, on_line, timeout)


STEP_PREFIX = "[samples] "  # a generator's progress line (rank 0): ``ckpt-tui demo`` shows these, logs the rest


def demo_stamp(target: Path) -> Path:
    """The file that marks ``target`` as a demo ckpt-tui built (and which generator built it): a hidden
    sibling, so the demo run itself holds only what the frameworks wrote."""
    target = Path(target)
    return target.parent / f".{target.name}.ckpt-tui-demo"


def source_hash() -> str:
    """A hash of the generators' code: what they write changes only when it changes (the demo's stamp and
    the test fixtures' cache key use it)."""
    import hashlib

    h = hashlib.sha256()
    for src in sorted(Path(__file__).parent.glob("*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:16]


def group_hash(group: str) -> str:
    """A hash of what decides a group's output: its generator module and the sample modules it imports,
    its definition, the files it must write, the converter of its derived variants, its venv's pins and, for
    a generator that imports peft, the installed peft (not among tests/fixtures.py's FRAMEWORKS, which key the
    whole cache: a peft upgrade regenerates only the groups that use it)
    The test fixtures cache each group under it, so a new or changed group regenerates only itself."""
    import hashlib
    import inspect
    import re

    grp = GROUPS[group]
    here = Path(__file__).parent
    h = hashlib.sha256(repr(grp).encode())
    todo, seen, uses_peft = [grp.module], set(), False
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        src = (here / f"{mod}.py").read_bytes()
        h.update(mod.encode() + b"\0" + src)
        uses_peft = uses_peft or re.search(rb"^\s*(?:from|import) peft\b", src, re.M) is not None
        todo += [
            m.decode() for m in re.findall(rb"ckpt_tui\.samples\.(\w+)", src) if (here / f"{m.decode()}.py").is_file()
        ]
    for v in grp.variants:
        h.update(repr((v, EXPECTED[v])).encode())
    if grp.derived:
        h.update(inspect.getsource(_to_universal).encode())
    if grp.venv is not None:
        from .venvs import VENVS

        h.update(repr(VENVS[grp.venv]).encode())
    if uses_peft:
        from importlib import metadata

        try:
            h.update(f"peft={metadata.version('peft')}".encode())
        except metadata.PackageNotFoundError:
            h.update(b"peft=missing")
    return h.hexdigest()[:16]


def demo_is_built(target: Path) -> bool:
    """``target`` holds a complete demo run written by this version's generator."""
    stamp = demo_stamp(target)
    try:
        if stamp.read_text().strip() != source_hash():
            return False
    except OSError:
        return False
    return all(any(Path(target).glob(p)) for p in EXPECTED["demo"])


def build_demo(target: Path, on_line: Callable[[str], None] | None = None) -> Path:
    """Build the demo run into ``target`` (``fsdp-trainer-run/``, ``deepspeed-zero2/``): generated in a temp
    folder beside it, stamped, then moved into place, so ``target`` is either the old state or complete.
    A folder that is already there is replaced only if it is an earlier demo (it has the stamp)."""
    target = Path(target)
    stamp = demo_stamp(target)
    if target.exists() and any(target.iterdir()) and not stamp.exists():
        raise FileExistsError(f"{target} exists and is not a ckpt-tui demo; give an empty or new folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        generate("demo", tmp, on_line=on_line)
        # the stamp first: a crash before the move leaves a stamped but incomplete demo, which the next run
        # rebuilds (demo_is_built also checks the files), never a demo folder that --clean would refuse
        stamp.write_text(source_hash() + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp / "demo", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def big_torch_checkpoint(dest: Path, gib: float = 1.0) -> Path:
    """A Llama-shaped HF folder with a ~``gib`` GiB ``pytorch_model.bin`` (torch.save, seeded), for
    benchmarks and screenshots of long jobs; written once and reused."""
    f = dest / "pytorch_model.bin"
    if f.is_file() and f.stat().st_size > gib * 0.9 * 2**30:
        return dest
    import torch

    dest.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    sd, total, i = {}, 0, 0
    while total < gib * 2**30:
        for name, shape in (
            ("self_attn.q_proj", (2048, 2048)),
            ("self_attn.k_proj", (2048, 2048)),
            ("self_attn.v_proj", (2048, 2048)),
            ("self_attn.o_proj", (2048, 2048)),
            ("mlp.up_proj", (5632, 2048)),
            ("mlp.down_proj", (2048, 5632)),
        ):
            t = torch.randn(*shape, generator=g)
            sd[f"model.layers.{i}.{name}.weight"] = t
            total += t.numel() * 4
        i += 1
    torch.save(sd, f)
    (dest / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}\n')
    return dest
