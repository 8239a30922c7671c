"""Plain torch.distributed.checkpoint layouts under gloo (FSDP1, FSDP2, DCP variants).

python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.torch_dcp OUTDIR [variants]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ckpt_tui.samples._common import (
    TinyLM,
    batch,
    lm_loss,
    run_variants,
    seed_all,
)

VARIANTS = [
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
]


# ---------------------------------------------------------------- models
def _train(model, opt, steps: int = 2, sched=None) -> None:
    rank = dist.get_rank()
    for step in range(steps):
        ids = batch(step, rank)
        loss = lm_loss(model(ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()


def fsdp1_model(steps: int = 2, sched: bool = False):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from ckpt_tui.samples._common import Block

    seed_all()
    model = FSDP(TinyLM(), device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = None
    if sched:
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 100))
    _train(model, opt, steps, scheduler)
    return model, opt, scheduler


def fsdp2_model(steps: int = 2):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    seed_all()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = TinyLM()
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt, steps)
    return model, opt


# ---------------------------------------------------------------- accelerate-style FSDP (used by the demo too)
def save_accelerate_fsdp_sharded(model, opt, ckpt_dir: Path) -> None:
    """What accelerate.utils.fsdp_utils.save_fsdp_model/_optimizer write for SHARDED_STATE_DICT."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(ckpt_dir / "pytorch_model_fsdp_0"))
        optim_state = FSDP.optim_state_dict(model, opt)
        dcp.save({"optimizer": optim_state}, storage_writer=dcp.FileSystemWriter(ckpt_dir / "optimizer_0"))


def save_trainer_extras(ckpt_dir: Path, scheduler, global_step: int, world: int) -> None:
    """rng_state_{rank}.pth, scheduler.pt, trainer_state.json as transformers.Trainer writes them."""
    import random

    import numpy as np

    rank = dist.get_rank()
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
        ckpt_dir / f"rng_state_{rank}.pth",
    )
    if rank == 0:
        torch.save(scheduler.state_dict(), ckpt_dir / "scheduler.pt")
        state = {
            "best_global_step": None,
            "best_metric": None,
            "best_model_checkpoint": None,
            "epoch": 1.0,
            "eval_steps": 500,
            "global_step": global_step,
            "is_hyper_param_search": False,
            "is_local_process_zero": True,
            "is_world_process_zero": True,
            "log_history": [
                {"epoch": 0.5, "grad_norm": 1.0, "learning_rate": 1e-3, "loss": 5.5, "step": global_step // 2},
                {"epoch": 1.0, "grad_norm": 1.0, "learning_rate": 5e-4, "loss": 5.4, "step": global_step},
            ],
            "logging_steps": global_step // 2,
            "max_steps": global_step,
            "num_input_tokens_seen": 0,
            "num_train_epochs": 1,
            "save_steps": global_step,
            "stateful_callbacks": {
                "TrainerControl": {
                    "args": {
                        "should_epoch_stop": False,
                        "should_evaluate": False,
                        "should_log": False,
                        "should_save": True,
                        "should_training_stop": True,
                    },
                    "attributes": {},
                }
            },
            "total_flos": 0.0,
            "train_batch_size": 2,
            "trial_name": None,
            "trial_params": None,
        }
        (ckpt_dir / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------- variants
def v_fsdp1_dcp(out: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    model, _, _ = fsdp1_model()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        dcp.save({"model": model.state_dict()}, checkpoint_id=out)


def v_fsdp2_dcp(out: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = fsdp2_model()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=out)


def v_dcp_mixed(out: Path) -> None:
    """One folder holding three DCPs of the same FSDP2 run: the model alone (``model/``), the optimizer
    alone (``optimizer/``) and both in one save (``combined/``, FSDP2's ``dcp.save({"model": ..., "optimizer":
    ...})``), which sorts first: the model-only one must still be taken as the model."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = fsdp2_model()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd}, checkpoint_id=out / "model")
    dcp.save({"optimizer": osd}, checkpoint_id=out / "optimizer")
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=out / "combined")


def v_hf_storage_distributed(out: Path) -> None:
    """torch's ``HuggingFaceStorageWriter(save_distributed=True)`` without consolidation: each rank's
    ``shard-0000R-model-00001-of-00001.safetensors``, its chunks' offsets in DCP_SHARDING_INFO; no index."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model, _ = fsdp2_model()
    dcp.save(get_model_state_dict(model), storage_writer=dcp.HuggingFaceStorageWriter(str(out), save_distributed=True))


def v_hf_storage_single(out: Path) -> None:
    """``HuggingFaceStorageWriter()`` (save_distributed=False) of the full state dict, written by rank 0 alone:
    ``model-00001-of-00001.safetensors`` and its index, every tensor whole (a Hugging Face model folder)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model, _ = fsdp2_model()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        dcp.save(full, storage_writer=dcp.HuggingFaceStorageWriter(str(out)), no_dist=True)
    dist.barrier()


def v_fsdp_full(out: Path) -> None:
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model, _, _ = fsdp1_model()
    # offload_to_cpu=True (what accelerate passes) breaks on a CPU-only run:
    # "setStorage: ... out of bounds for storage of size 0" -- the params already live on CPU.
    cfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        sd = model.state_dict()
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(sd, out / "pytorch_model_fsdp.bin")


def v_fsdp_local(out: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    model, _, _ = fsdp1_model()
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        sd = model.state_dict()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(sd, out / f"pytorch_model_fsdp_rank{dist.get_rank()}.bin")


def v_dcp_ranklocal(out: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model, _ = fsdp2_model()
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=out, use_collectives=False)


def v_dcp_safetensors(out: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model, _ = fsdp2_model()
    writer = dcp.HuggingFaceStorageWriter(str(out), save_distributed=True, enable_consolidation=True)
    dcp.save(get_model_state_dict(model), storage_writer=writer)


def v_dcp_fs_safetensors(out: Path) -> None:
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model, _ = fsdp2_model()
    writer = dcp.FileSystemWriter(out, serialization_format=SerializationFormat.SAFETENSORS)
    dcp.save({"model": get_model_state_dict(model)}, storage_writer=writer)


def v_fsdp2_zstd(out: Path) -> None:
    """FSDP2's model and optimizer in one save, every item compressed by torch's ZStandard extension
    (``FileSystemWriter(out, _extensions=[ZStandard()])``, which needs ``zstandard`` or ``pyzstd``)."""
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = fsdp2_model()
    msd, osd = get_state_dict(model, opt)
    writer = dcp.FileSystemWriter(out, _extensions=[ZStandard()])
    dcp.save({"model": msd, "optimizer": osd}, storage_writer=writer)


def v_fsdp2_rank0_slice(out: Path) -> None:
    """``checkpoint-2/``: the model's DCP (``pytorch_model_fsdp_0/``, as accelerate writes it for FSDP2) and beside
    it the common mistake, rank 0 saving only its own slice of each sharded tensor
    (``save_file({k: v.to_local()})`` into ``model.safetensors``): every dim-0-sharded tensor half its size."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model, _ = fsdp2_model()
    ck = out / "checkpoint-2"
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ck / "pytorch_model_fsdp_0")
    # (a buffer is a plain tensor, whole on every rank)
    local = {
        k: getattr(v, "to_local", lambda: v)().detach().clone().contiguous() for k, v in model.state_dict().items()
    }
    if dist.get_rank() == 0:
        save_file(local, ck / "model.safetensors")


FUNCS = {
    "fsdp1-dcp": v_fsdp1_dcp,
    "fsdp2-dcp": v_fsdp2_dcp,
    "fsdp-full": v_fsdp_full,
    "fsdp-local": v_fsdp_local,
    "dcp-ranklocal": v_dcp_ranklocal,
    "dcp-safetensors": v_dcp_safetensors,
    "dcp-fs-safetensors": v_dcp_fs_safetensors,
    "dcp-mixed": v_dcp_mixed,
    "fsdp2-rank0-slice": v_fsdp2_rank0_slice,
    "fsdp2-zstd": v_fsdp2_zstd,
    "hf-storage-distributed": v_hf_storage_distributed,
    "hf-storage-single": v_hf_storage_single,
}


def main() -> None:
    run_variants(VARIANTS, lambda name, out: FUNCS[name](out))


if __name__ == "__main__":
    main()
