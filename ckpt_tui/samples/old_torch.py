"""torch DCP as older torch writes it (issue 25): FSDP2 and FSDP1, model and optimizer, on 2 gloo ranks, by torch
2.4.1 and 2.7.0 themselves. Committed under tests/data/old-torch/<version>/ with their oracle: PyPI carries only CUDA
builds of those releases (~5 GB installed each, run on the CPU here), more than a cold CI run should download for
folders of a few kB. Re-made on request (CONTRIBUTING.md, "older torch"):

    python3 -m venv /tmp/torch-2.7.0 && /tmp/torch-2.7.0/bin/pip install torch==2.7.0 safetensors
    PYTHONPATH=. /tmp/torch-2.7.0/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        ckpt_tui/samples/old_torch.py tests/data/old-torch/2.7.0
    (and the same with 2.4.1, whose venv also needs "numpy<2")

Each version's folder, as its run leaves it:
  fsdp2/                  ``dcp.save({"model": msd, "optimizer": osd})`` of an FSDP2 (``fully_shard``) model with
                          ``get_state_dict``: one DCP holding both
  fsdp1/pytorch_model_fsdp_0/, fsdp1/optimizer_0/
                          FSDP1 ``SHARDED_STATE_DICT`` saved the way accelerate's save_fsdp_model/_optimizer do
  oracle/<name>.safetensors  that torch's own ``dcp_to_torch_save`` of each DCP, its tensors flattened
                          (``model.0.weight``, ``optimizer.state.0.weight.exp_avg``, …)
  oracle/<name>.json      the non-tensor leaves (the param groups' hyper-parameters), and the torch that wrote it

The model is a two-layer MLP (a few hundred parameters: small enough to commit). torch 2.4.1's FSDP2 cannot run a
forward on CPU (it asks for CUDA streams), so every variant steps AdamW twice on synthetic gradients (fixed per
parameter and step) instead of a forward and backward: the optimizer state is as real as a trained one's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _step(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 2) -> None:
    """AdamW on synthetic gradients: each parameter's full gradient is fixed by its index and the step, and each
    rank sets its own shard of it (FSDP2's DTensor via distribute_tensor, FSDP1's flat parameter whole)."""
    for step in range(steps):
        for i, p in enumerate(model.parameters()):
            g = torch.linspace(-1, 1, p.numel(), dtype=p.dtype).reshape(p.shape) * (0.5 + 0.25 * i + 0.1 * step)
            if hasattr(p, "device_mesh"):  # a DTensor parameter (FSDP2)
                from torch.distributed._tensor import distribute_tensor

                p.grad = distribute_tensor(g, p.device_mesh, p.placements)
            else:
                p.grad = g
        opt.step()
        opt.zero_grad()


def _fully_shard() -> Any:
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6

        return fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4, 2.5

        return fully_shard


def fsdp2(out: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _model()
    shard = _fully_shard()
    for m in model:
        if isinstance(m, nn.Linear):
            shard(m, mesh=mesh)
    shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(out))


def fsdp1(out: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FSDP(_model(), device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):  # accelerate's save_fsdp_model/_optimizer
        dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(str(out / "pytorch_model_fsdp_0")))
        osd = FSDP.optim_state_dict(model, opt)
        dcp.save({"optimizer": osd}, storage_writer=dcp.FileSystemWriter(str(out / "optimizer_0")))


def _flat(d: Any, prefix: str, tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> None:
    if isinstance(d, dict):
        for k, v in d.items():
            _flat(v, f"{prefix}{k}.", tensors, rest)
    elif isinstance(d, (list, tuple)) and not all(isinstance(x, (int, float, str, bool)) for x in d):
        for i, v in enumerate(d):
            _flat(v, f"{prefix}{i}.", tensors, rest)
    elif isinstance(d, torch.Tensor):
        tensors[prefix[:-1]] = d.detach().clone().contiguous()
    else:
        rest[prefix[:-1]] = d if isinstance(d, (int, float, str, bool, type(None))) else list(d)


def oracle(folder: Path, name: str, out: Path) -> None:
    """This torch's own dcp_to_torch_save of ``folder``, flattened into safetensors and JSON."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    tmp = out / f"{name}.pt"
    dcp_to_torch_save(str(folder), str(tmp))
    tensors: dict[str, torch.Tensor] = {}
    rest: dict[str, Any] = {}
    _flat(torch.load(tmp, weights_only=False), "", tensors, rest)  # the file this torch just wrote
    tmp.unlink()
    save_file(tensors, out / f"{name}.safetensors")
    doc = {"torch": torch.__version__, "values": rest}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = Path(sys.argv[1]).resolve()
    fsdp2(out / "fsdp2")
    fsdp1(out / "fsdp1")
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "oracle").mkdir(parents=True, exist_ok=True)
        oracle(out / "fsdp2", "fsdp2", out / "oracle")
        oracle(out / "fsdp1" / "pytorch_model_fsdp_0", "fsdp1-model", out / "oracle")
        oracle(out / "fsdp1" / "optimizer_0", "fsdp1-optimizer", out / "oracle")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
