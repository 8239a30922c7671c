"""Saves that went wrong the common ways (issue 24), written by the real HF Trainer, DeepSpeed, PEFT and torch
on CPU (transformers 5.24, peft 0.21, deepspeed 0.19.8, torch 2.13), in one process.

python -m ckpt_tui.samples.hf_broken OUTDIR [variants]
python -m ckpt_tui.samples.hf_broken --resume CHECKPOINT OUTDIR [--deepspeed]  # HF's own resume (tests' oracle)

Variants (each a folder as a user's run leaves it):
  hf-killed-save       run/checkpoint-2 whole; run/checkpoint-4 of a Trainer that SIGKILLed itself on entering
                       _save_rng_state: model.safetensors, training_args.bin, optimizer.pt, scheduler.pt written,
                       no rng_state.pth and no trainer_state.json (the Trainer writes that last)
  hf-rotation-killed   save_total_limit=1: run/checkpoint-2 whole; run/checkpoint-1 is what a rotation killed in
                       the middle of shutil.rmtree leaves (its files deleted one by one in sorted order, the kill
                       right after model.safetensors: its weights gone, trainer_state.json still there)
  hf-model-only        save_only_model=True, one process: run/checkpoint-2 without optimizer.pt, scheduler.pt, RNG
  hf-ds-model-only     save_only_model=True under DeepSpeed ZeRO-2 (one rank): no global_step2/ tag at all
  dcp-optim-nograd     checkpoint-2/: dcp.save of get_state_dict(model, optimizer) where one trainable parameter
                       (`unused.weight`) never received a gradient, so AdamW holds no state for it
  zero3-ungathered     a raw deepspeed.initialize ZeRO-3 run (stage3_param_persistence_threshold 0) saved without
                       gathering: checkpoint-2/model.safetensors (save_pretrained on rank 0: every tensor shape
                       [0]) beside the engine's own tag checkpoint-2/global_step2/, and state_dict.pt
                       (torch.save(model.state_dict())), as empty; oracle/model.safetensors: the weights gathered
  zero3-peft-ungathered  the same with a PEFT LoRA model: base-model/, ungathered/checkpoint-2/ (adapter_config.json,
                       adapter_model.safetensors with lora tensors of shape [0], the tag saved with
                       exclude_frozen_parameters as the Trainer does) and no-tensors/checkpoint-2/ (the call older
                       transformers made under ZeRO-3, save_pretrained(out, state_dict={}): a 40-byte adapter file
                       with no tensors at all, beside the same tag); oracle/adapter_state.safetensors: the
                       adapter gathered (get_peft_model_state_dict inside GatheredParameters)

The two killed runs run in a child process (the kill must end a process); a SIGKILL at a fixed point is
deterministic. The ungathered saves and the DeepSpeed save_only_model run last: they start a 1-rank process group.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ckpt_tui.samples._common import TINY_LLAMA, batch, init_deepspeed, log, parse_args, seed_all
from ckpt_tui.samples.hf_trainer import TokenData, hf_ds_config, reset_accelerate

VARIANTS = (
    "hf-killed-save",
    "hf-rotation-killed",
    "hf-model-only",
    "dcp-optim-nograd",
    "hf-ds-model-only",
    "zero3-ungathered",
    "zero3-peft-ungathered",
)
_CHILD = ("hf-killed-save", "hf-rotation-killed")
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def _model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    seed_all()
    return AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA))


def _args(out: str, **kw: Any):
    from transformers import TrainingArguments

    common: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=2,
        max_steps=2,
        save_steps=2,
        save_strategy="steps",
        logging_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        seed=1234,
        data_seed=1234,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    common.update(kw)
    return TrainingArguments(**common)


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def child(name: str, out: Path) -> None:
    """One of the killed runs, in this process: it ends by SIGKILL."""
    from transformers import Trainer

    os.chdir(out)
    if name == "hf-killed-save":

        class KilledWhileSaving(Trainer):
            def _save_rng_state(self, output_dir):  # after weights, optimizer, scheduler; before trainer_state
                if self.state.global_step == 4:
                    _die()
                super()._save_rng_state(output_dir)

        trainer = KilledWhileSaving(model=_model(), args=_args("run", max_steps=4), train_dataset=TokenData())
    else:
        rmtree = shutil.rmtree

        def killed_rmtree(path, *a, **k):
            # rmtree unlinks a folder's files one by one; this one in sorted order, killed after the weights
            for name in sorted(os.listdir(path)):
                os.unlink(os.path.join(path, name))
                if name == "model.safetensors":
                    _die()
            rmtree(path, *a, **k)

        shutil.rmtree = killed_rmtree  # type: ignore[assignment]  # the Trainer's rotate_checkpoints calls shutil.rmtree(checkpoint)
        trainer = Trainer(
            model=_model(), args=_args("run", save_steps=1, save_total_limit=1), train_dataset=TokenData()
        )
    trainer.train()
    raise SystemExit(f"{name}: the run was not killed")


def _killed(name: str, out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS and not k.startswith("TORCHELASTIC_")}
    r = subprocess.run(
        [sys.executable, "-m", "ckpt_tui.samples.hf_broken", "--child", name, str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == -signal.SIGKILL, f"{name}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def _trainer_run(out: Path, **kw: Any) -> None:
    from transformers import Trainer

    env = dict(os.environ)
    cwd = os.getcwd()
    os.chdir(out)
    try:
        trainer = Trainer(model=_model(), args=_args("run", **kw), train_dataset=TokenData())
        trainer.train()
        if getattr(trainer, "deepspeed", None) is not None:
            trainer.deepspeed.destroy()
        del trainer
        gc.collect()
        reset_accelerate()
        if "deepspeed" in kw:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)


def nograd_model() -> torch.nn.Module:
    """dcp-optim-nograd's model: TinyLM and ``unused``, a trainable Linear the forward never calls (tests build it)."""
    from torch import nn

    from ckpt_tui.samples._common import TinyLM

    seed_all()
    model = TinyLM()
    model.unused = nn.Linear(8, 8, bias=False)  # trainable, in the optimizer, never in the forward
    return model


def _dcp_nograd(out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ckpt_tui.samples._common import lm_loss

    model = nograd_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        ids = batch(step, 0)
        lm_loss(model(ids), ids).backward()
        opt.step()
        opt.zero_grad()
    assert "unused.weight" not in {n for n, p in model.named_parameters() if p in opt.state}
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(out / "checkpoint-2"))


def _zero3_engine(model, trainable):
    import deepspeed

    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=cfg)
    for step in range(2):
        ids = batch(step, 0)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    return engine


def _oracle(path: Path, model, state) -> None:
    """What the live run held, gathered (the oracle the exports are compared with, bit-exact: fp32 throughout)."""
    import deepspeed
    from safetensors.torch import save_file

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        sd = {k: v.detach().clone().contiguous() for k, v in state().items()}
    path.parent.mkdir(exist_ok=True)
    save_file(sd, path)


def _zero3_ungathered(out: Path) -> None:
    from safetensors import safe_open

    model = _model()
    engine = _zero3_engine(model, [p for p in model.parameters()])
    ck = out / "checkpoint-2"
    model.save_pretrained(ck)  # rank 0, nothing gathered: each partitioned parameter is an empty tensor here
    torch.save(model.state_dict(), out / "state_dict.pt")
    engine.save_checkpoint(str(ck))
    with safe_open(ck / "model.safetensors", "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    assert shapes and all(0 in s for s in shapes.values()), shapes
    _oracle(out / "oracle" / "model.safetensors", model, lambda: model.state_dict())
    engine.destroy()


def _zero3_peft(out: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    cwd = os.getcwd()
    os.chdir(out)
    try:
        _model().save_pretrained("base-model")
        base = AutoModelForCausalLM.from_pretrained("base-model")
        seed_all()
        model = get_peft_model(
            base, LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        )
        engine = _zero3_engine(model, [p for p in model.parameters() if p.requires_grad])
        for sub, sd in (("ungathered", None), ("no-tensors", {})):
            ck = Path(sub) / "checkpoint-2"
            model.save_pretrained(str(ck), state_dict=sd)
            engine.save_checkpoint(str(ck), exclude_frozen_parameters=True)
        with safe_open("ungathered/checkpoint-2/adapter_model.safetensors", "pt") as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
        assert shapes and all(0 in s for s in shapes.values()), shapes
        assert os.path.getsize("no-tensors/checkpoint-2/adapter_model.safetensors") < 100
        from peft import get_peft_model_state_dict

        _oracle(Path("oracle") / "adapter_state.safetensors", model, lambda: get_peft_model_state_dict(model))
        engine.destroy()
    finally:
        os.chdir(cwd)


def make(name: str, out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if name in _CHILD:
        _killed(name, out)
    elif name == "hf-model-only":
        _trainer_run(out, save_only_model=True)
    elif name == "hf-ds-model-only":
        _trainer_run(out, save_only_model=True, deepspeed=hf_ds_config(2))
    elif name == "dcp-optim-nograd":
        _dcp_nograd(out)
    elif name == "zero3-ungathered":
        _zero3_ungathered(out)
    else:
        _zero3_peft(out)


def resume(checkpoint: str, out: str, deepspeed: bool = False) -> int:
    """HF's own ``Trainer.train(resume_from_checkpoint=checkpoint)`` for two more steps, as a user runs it: 0 and
    the step it reached, or 1 and the exception (a test's oracle for a finding's advice)."""
    from transformers import Trainer

    # "True": resume_from_checkpoint=True, which takes the highest-numbered checkpoint-N in OUTDIR
    target: str | bool = True if checkpoint == "True" else checkpoint
    steps = 2 + int(checkpoint.rstrip("/").rsplit("-", 1)[-1]) if checkpoint[-1].isdigit() else 6
    kw: dict[str, Any] = dict(max_steps=steps, save_steps=steps)
    if deepspeed:
        init_deepspeed()
        kw["deepspeed"] = hf_ds_config(2)
    from transformers import TrainerCallback

    class From(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            print(f"RESUMING from step {state.global_step}", flush=True)  # the checkpoint's, once loaded

    trainer = Trainer(model=_model(), args=_args(out, **kw), train_dataset=TokenData(), callbacks=[From()])
    try:
        trainer.train(resume_from_checkpoint=target)
    except Exception as e:  # the oracle reports what HF raised
        print(f"RESUME-FAILED {type(e).__name__}: {e}")
        return 1
    print(f"RESUMED to step {trainer.state.global_step}")
    return 0


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], Path(sys.argv[3]))
        return
    if sys.argv[1:2] == ["--resume"]:  # --resume CHECKPOINT OUT [--deepspeed]
        rc = resume(sys.argv[2], sys.argv[3], deepspeed=sys.argv[4:5] == ["--deepspeed"])
        import torch.distributed as dist

        if dist.is_initialized():  # under torchrun: every rank done before the group goes, else gloo's
            dist.barrier()  # destructor on a rank whose peer already left aborts it (SIGABRT, exit 1)
            dist.destroy_process_group()
        raise SystemExit(rc)
    outdir, variants = parse_args(list(VARIANTS))
    for k in [k for k in os.environ if k.startswith("TORCHELASTIC_") or k in _TORCHRUN_VARS]:
        del os.environ[k]  # one process as `python train.py` runs it (the DeepSpeed variants start a 1-rank group)
    for name in variants:
        log(f"{name} ...")
        if name in ("hf-ds-model-only", "zero3-ungathered", "zero3-peft-ungathered"):
            import torch.distributed as dist

            if not dist.is_initialized():
                init_deepspeed()
        make(name, outdir / name)
    from ckpt_tui.samples._common import finish

    finish()


if __name__ == "__main__":
    main()
