"""Generate large real-framework checkpoints for ``bench/export_bench.py`` (CPU only).

    python bench/make_big.py [--data DIR] [NAME ...]       # driver: builds what is missing

Checkpoints (cached under ``bench/out/data/<NAME>/``, skipped when ``<NAME>/.done`` exists):

- ``fsdp-1g`` / ``fsdp-4g``: 16 / 64 x ``nn.Linear(4096, 4096, bias=False)`` fp32 (1.07 / 4.29 GB),
  2 ranks, FSDP1 ``FullyShardedDataParallel(model, device_id=cpu)`` on gloo, each Linear wrapped
  (``ModuleWrapPolicy``) and built on ``meta`` then materialised one at a time with a per-layer
  seed (so the 4.3 GB model never exists twice per rank), ``SHARDED_STATE_DICT``,
  ``dcp.save({"model": sd}, checkpoint_id=<ckpt>/pytorch_model_fsdp_0)`` (HF Trainer layout).
- ``fsdp-optim-1g`` / ``fsdp-optim-2g``: the same FSDP1 model of 16 / 32 Linears after one ``torch.optim.Adam``
  step, saved as the HF Trainer / Accelerate do: the model in ``pytorch_model_fsdp_0/`` and
  ``FSDP.optim_state_dict`` (SHARDED_STATE_DICT) by ``dcp.save({"optimizer": osd})`` in ``optimizer_0/``
  (exp_avg + exp_avg_sq: 2.1 / 4.3 GB).
- ``ds-zero2`` / ``ds-zero3``: 8 x ``nn.Linear(4096, 4096)`` (134M params), DeepSpeed engine,
  bf16, Adam (torch_adam), 2 ranks, one forward/backward/step, ``engine.save_checkpoint``.
- ``ds-moe``: the same 134M parameters as mixture-of-experts: 2 ``deepspeed.moe.layer.MoE`` layers of 4 experts
  ``nn.Linear(4096, 4096)`` each, expert-parallel 2 (each rank holds 2 experts per layer), top-1 gate, param groups
  by ``split_params_into_different_moe_groups_for_optimizer``, ZeRO-2 bf16, 2 ranks, one step.
- ``megatron-llama-1g``: a Llama-family megatron-core 0.19 ``GPTModel`` (samples/megatron_hf.py's, larger: 4 layers,
  hidden 2048, 16 heads in 4 query groups, ffn 5632 SwiGLU, vocab 32000 untied; 311M parameters fp32, 1.25 GB)
  saved as Megatron-LM saves it (``dist_checkpointing.save`` with its args) at tensor-parallel 2 on 2 ranks, in the
  ``megatron-019`` venv of samples/venvs.py: ``checkpoints/iter_0000010/`` (``export --to hf``'s row).

The driver launches itself under ``python -m torch.distributed.run --standalone
--nproc_per_node 2`` with ``OMP_NUM_THREADS=1`` (and ``DS_ACCELERATOR=cpu`` and a cached
``TORCH_EXTENSIONS_DIR`` for DeepSpeed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "out" / "data"
SEED = 1234
DIM = 4096

# name -> (kind, layers)
CKPTS: dict[str, tuple[str, int]] = {
    "fsdp-1g": ("fsdp", 16),
    "fsdp-4g": ("fsdp", 64),
    "fsdp-optim-1g": ("fsdp-optim", 16),
    "fsdp-optim-2g": ("fsdp-optim", 32),
    "fsdp-zstd-1g": ("fsdp-zstd", 16),  # fsdp-1g's model, every item through torch's ZStandard extension
    "ds-zero2": ("zero2", 8),
    "ds-zero3": ("zero3", 8),
    "ds-moe": ("moe2", 2),  # 2 MoE layers x 4 experts of Linear(4096, 4096): ds-zero2's 134M parameters
    "megatron-llama-1g": ("megatron-llama", 4),  # a Llama-family megatron-core GPTModel, TP=2: 311M params fp32
}
MEGATRON_VENV = "megatron-019"  # samples/venvs.py: megatron-core 0.19.2
MEGATRON_ITER = 10


# ----------------------------------------------------------------------------- worker side


def _model(layers: int, bias: bool, device: str = "cpu"):
    import torch
    from torch import nn

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(DIM, DIM, bias=bias, device=device) for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x

    return Stack()


def _fsdp_worker(out: Path, layers: int, optim: bool = False, zstd: bool = False) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = _model(layers, bias=False, device="meta")
    index = {m: i for i, m in enumerate(model.layers)}
    bound = 1.0 / DIM**0.5

    def init_fn(m: nn.Module) -> None:
        m.to_empty(device="cpu", recurse=False)
        if m in index:
            g = torch.Generator().manual_seed(SEED + index[m])
            with torch.no_grad():
                m.weight.uniform_(-bound, bound, generator=g)

    model = FSDP(
        model,
        device_id=torch.device("cpu"),
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        param_init_fn=init_fn,
    )
    opt = None
    if optim:  # one Adam step, so every parameter has its exp_avg and exp_avg_sq
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(1, DIM, generator=torch.Generator().manual_seed(SEED + dist.get_rank()))
        model(x).pow(2).mean().backward()
        opt.step()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
        osd = FSDP.optim_state_dict(model, opt) if opt is not None else None
    if zstd:
        from torch.distributed.checkpoint._extension import ZStandard

        writer = dcp.FileSystemWriter(str(out / "pytorch_model_fsdp_0"), _extensions=[ZStandard()])
        dcp.save({"model": sd}, storage_writer=writer)
    else:
        dcp.save({"model": sd}, checkpoint_id=str(out / "pytorch_model_fsdp_0"))
    if osd is not None:  # as accelerate's save_fsdp_optimizer writes it
        dcp.save({"optimizer": osd}, checkpoint_id=str(out / "optimizer_0"))
    dist.barrier()
    dist.destroy_process_group()


def _ds_worker(out: Path, layers: int, stage: int) -> None:
    import deepspeed
    import torch

    from ckpt_tui.samples._common import init_dist

    init_dist(deepspeed=True)  # gloo, one thread, and no build of DeepSpeed's unused CPU comm op
    deepspeed.init_distributed(dist_backend="gloo")
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(SEED)
    model = _model(layers, bias=True)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=model.parameters(),
        config={
            "train_batch_size": 2,
            "steps_per_print": 10**9,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": stage},
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        },
    )
    g = torch.Generator().manual_seed(SEED + rank)
    x = torch.randn(1, DIM, generator=g).to(torch.bfloat16)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(str(out))
    engine.destroy()
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _moe_worker(out: Path, layers: int) -> None:
    import deepspeed
    import torch
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from torch import nn

    from ckpt_tui.samples._common import init_dist

    init_dist(deepspeed=True)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(SEED)

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                MoE(DIM, expert=nn.Linear(DIM, DIM), num_experts=4, ep_size=2, k=1) for _ in range(layers)
            )

        def forward(self, x):
            aux = 0.0
            for layer in self.layers:
                x, l_aux, _ = layer(x)
                x = torch.tanh(x)
                aux = aux + l_aux
            return x, aux

    model = Stack()
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in model.parameters()], "name": "params"}
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=groups,
        config={
            "train_batch_size": 2,
            "steps_per_print": 10**9,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 2},
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        },
    )
    g = torch.Generator().manual_seed(SEED + rank)
    x = torch.randn(1, 4, DIM, generator=g).to(torch.bfloat16)
    y, aux = engine(x)
    engine.backward(y.float().pow(2).mean() + aux)
    engine.step()
    engine.save_checkpoint(str(out))
    engine.destroy()
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _megatron_worker(out: Path, layers: int) -> None:
    """samples/megatron_hf.py's Llama-family GPTModel at a size that makes a benchmark (its module constants set
    before it builds), saved at TP=2 as its v_save does, without the logits oracle."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from ckpt_tui.samples import megatron_hf as mh

    mh.LAYERS, mh.HIDDEN, mh.HEADS, mh.GROUPS, mh.FFN, mh.VOCAB = layers, 2048, 16, 4, 5632, 32000
    mh._setup()
    tp = dist.get_world_size()
    model = mh._model(tp, tied=False)
    it_dir = out / "checkpoints" / f"iter_{MEGATRON_ITER:07d}"
    if dist.get_rank() == 0:
        it_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    args = mh._args(tp, tied=False)
    args.iteration = MEGATRON_ITER
    state = {"model": model.sharded_state_dict(), "iteration": MEGATRON_ITER, "checkpoint_version": 3.0, "args": args}
    dist_checkpointing.save(state, str(it_dir))
    dist.barrier()
    if dist.get_rank() == 0:
        (it_dir.parent / "latest_checkpointed_iteration.txt").write_text(str(MEGATRON_ITER))
    mh._end_children()
    dist.destroy_process_group()


def _worker(name: str, out: Path) -> None:
    kind, layers = CKPTS[name]
    if kind == "megatron-llama":
        _megatron_worker(out, layers)
    elif kind.startswith("fsdp"):
        _fsdp_worker(out, layers, optim=kind == "fsdp-optim", zstd=kind == "fsdp-zstd")
    elif kind.startswith("moe"):
        _moe_worker(out, layers)
    else:
        _ds_worker(out, layers, int(kind[-1]))


# ----------------------------------------------------------------------------- driver side


def _complete(name: str, d: Path) -> bool:
    kind, _ = CKPTS[name]
    if kind == "megatron-llama":
        it = d / "checkpoints" / f"iter_{MEGATRON_ITER:07d}"
        return (it / ".metadata").is_file() and (it / "metadata.json").is_file() and len(list(it.glob("*.distcp"))) >= 2
    if kind.startswith("fsdp"):
        dirs = [d / "pytorch_model_fsdp_0"] + ([d / "optimizer_0"] if kind == "fsdp-optim" else [])
        return all((m / ".metadata").is_file() and len(list(m.glob("*.distcp"))) == 2 for m in dirs)
    tag = (d / "latest").read_text().strip() if (d / "latest").is_file() else None
    return bool(tag) and (d / "zero_to_fp32.py").is_file() and len(list((d / tag).glob("*optim_states.pt"))) == 2


def build(name: str, data: Path) -> Path:
    d = data / name
    if (d / ".done").exists():
        return d
    if d.exists():
        shutil.rmtree(d)
    d.parent.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false"
    )
    python = sys.executable
    if CKPTS[name][0] == "megatron-llama":  # megatron-core lives in a cached venv of its own (samples/venvs.py)
        from ckpt_tui.samples.venvs import python_for

        python = str(python_for(MEGATRON_VENV))
        env["PYTHONPATH"] = str(HERE.parent)  # ckpt_tui.samples.megatron_hf
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(Path(__file__).resolve()),
        "--worker",
        name,
        str(d),
    ]
    t = time.perf_counter()
    print(f"[make_big] {name}: {' '.join(cmd[2:])}", flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if not _complete(name, d):
        raise SystemExit(f"[make_big] {name}: incomplete (rc={rc}); see output above")
    (d / ".done").write_text("")
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    print(f"[make_big] {name}: {size / 1e9:.2f} GB in {time.perf_counter() - t:.0f}s (rc={rc})", flush=True)
    return d


def main() -> None:
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    if argv[:1] == ["--worker"]:
        _worker(argv[1], Path(argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("names", nargs="*", help=f"subset of {list(CKPTS)}")
    args = ap.parse_args(argv)
    names = args.names or list(CKPTS)
    unknown = sorted(set(names) - set(CKPTS))
    if unknown:
        raise SystemExit(f"unknown {unknown}; known: {list(CKPTS)}")
    for n in names:
        build(n, args.data)


if __name__ == "__main__":
    main()
