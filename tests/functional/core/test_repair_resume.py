"""After the in-place `universal-info` repair, the HF Trainer still resumes the checkpoint (2 ranks,
as saved), on CPU with the real Trainer and DeepSpeed."""

from ckpt_tui.core.repair import repairs_for
from ckpt_tui.core.report import inspect
from tests.util import torchrun

HF_RESUME = r"""
import json, os, sys, torch
from ckpt_tui.samples._common import TINY_LLAMA, finish, init_dist
from ckpt_tui.samples.hf_trainer import TokenData, hf_ds_config
init_dist(deepspeed=True)
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
ck = sys.argv[1]
args = TrainingArguments(output_dir=sys.argv[2], deepspeed=hf_ds_config(2), per_device_train_batch_size=2,
                         max_steps=3, save_strategy="no", logging_steps=1, learning_rate=1e-3, bf16=True,
                         use_cpu=True, report_to=[], seed=99, disable_tqdm=True, dataloader_num_workers=0)
torch.manual_seed(99)
model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA))
tr = Trainer(model=model, args=args, train_dataset=TokenData())
tr.train(resume_from_checkpoint=ck)
if int(os.environ.get("RANK", "0")) == 0:  # one line: two ranks would interleave
    # one write() of one line: a pipe shared by two ranks never splits it (print may, when it buffers)
    sys.stdout.flush()
    os.write(1, ("RESULT " + json.dumps({"global_step": tr.state.global_step,
                                          "engine_steps": tr.deepspeed.global_steps}) + "\n").encode())
finish()  # leave without the interpreter's teardown (see _common.finish)
"""


def test_hf_trainer_resumes_after_the_in_place_fix(real_ckpt_copy, tmp_path):

    ck = real_ckpt_copy("hf-ds-zero2") / "checkpoint-2"
    [rep] = [r for r in repairs_for(inspect(ck)) if r.id == "universal-info"]
    assert rep.apply().ok
    assert "universal-info-missing" not in {f.code for f in inspect(ck).findings}
    script = tmp_path / "resume.py"
    script.write_text(HF_RESUME)
    results = torchrun(script, ck, tmp_path / "run", cwd=tmp_path)
    assert results == [{"global_step": 3, "engine_steps": 3}]


LIGHTNING_RESUME = r"""
import json, os, sys, torch
import lightning as L
from ckpt_tui.samples._common import finish, init_dist, seed_all
from ckpt_tui.samples import lightning_ckpt as lc
init_dist(deepspeed=True)
seed_all()
ds_cls, _ = lc._strategies()
strategy = ds_cls(config={"steps_per_print": 10**9,
                          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
                          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
                  process_group_backend="gloo")
trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", "1")), strategy=strategy,
                    precision="bf16-mixed", max_epochs=2, limit_train_batches=lc.STEPS, default_root_dir=sys.argv[2],
                    logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
trainer.fit(lc.module_cls()(), torch.utils.data.DataLoader(lc._Data(), batch_size=2), ckpt_path=sys.argv[1])
if int(os.environ.get("RANK", "0")) == 0:  # one line: two ranks would interleave
    sys.stdout.flush()
    os.write(1, ("RESULT " + json.dumps({"global_step": trainer.global_step,
                                          "epoch": trainer.current_epoch}) + "\n").encode())
finish()  # leave without the interpreter's teardown (see _common.finish)
"""


def test_lightning_resumes_after_the_in_place_fix(real_ckpt_copy, tmp_path):
    """Lightning's own file (hyper-parameters, loops, callbacks pickled inside) keeps working after the
    pickle-stream edit: fit(ckpt_path=...) resumes at step 2 and trains epoch 1."""

    ck = real_ckpt_copy("lightning-ds-zero2") / "checkpoints" / "epoch=0-step=2.ckpt"
    [rep] = [r for r in repairs_for(inspect(ck)) if r.id == "universal-info"]
    assert rep.apply().ok
    script = tmp_path / "resume.py"
    script.write_text(LIGHTNING_RESUME)
    results = torchrun(script, ck, tmp_path / "run", cwd=tmp_path)
    assert [x["global_step"] for x in results] == [4], results


def test_lightning_resumes_from_universal_2_to_1(real_ckpt_copy, tmp_path):
    """The universal guide's Lightning steps (docs/universal-and-fix.md), proven: a ZeRO-2 run saved by 2 ranks resumes on 1 rank from its
    universal conversion with load_universal and fit(ckpt_path=<the .ckpt folder>)."""
    from ckpt_tui.core.convert.universal import convert_to_universal, universal_plan

    ck = real_ckpt_copy("lightning-ds-zero2") / "checkpoints" / "epoch=0-step=2.ckpt"
    res = convert_to_universal(universal_plan(ck))
    assert f"ckpt_path={str(ck)!r}" in res.instructions
    script = tmp_path / "resume.py"
    script.write_text(
        LIGHTNING_RESUME.replace(
            '"zero_optimization": {"stage": 2}',
            '"zero_optimization": {"stage": 2}, "checkpoint": {"load_universal": True}',
        )
    )
    results = torchrun(script, ck, tmp_path / "run", nproc=1, cwd=tmp_path)
    assert [x["global_step"] for x in results] == [4], results


HF_SAVE_WITH_INFO = r"""
import sys, torch
from ckpt_tui.samples._common import TINY_LLAMA, finish, init_dist, seed_all
from ckpt_tui.samples.hf_trainer import TokenData, hf_ds_config
init_dist(deepspeed=True)
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments
seed_all()
args = TrainingArguments(output_dir=sys.argv[1], deepspeed=hf_ds_config(2), per_device_train_batch_size=2, max_steps=2,
                         save_steps=2, save_strategy="steps", bf16=True, use_cpu=True, report_to=[],
                         disable_tqdm=True, dataloader_num_workers=0)
model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA))
model.universal_checkpoint_info = {"universal_checkpoint_version": 0.4}   # the universal guide's one line
Trainer(model=model, args=args, train_dataset=TokenData()).train()
finish()  # leave without the interpreter's teardown (see _common.finish)
"""

LIGHTNING_SAVE_WITH_INFO = r"""
import os, sys, torch
import lightning as L
from ckpt_tui.samples._common import finish, init_dist, seed_all
from ckpt_tui.samples import lightning_ckpt as lc
init_dist(deepspeed=True)
seed_all()
ds_cls, _ = lc._strategies()
base = lc.module_cls()

class WithInfo(base):
    def on_fit_start(self):   # the universal guide's one line
        self.trainer.strategy.model.module.universal_checkpoint_info = {"universal_checkpoint_version": 0.4}

strategy = ds_cls(config={"steps_per_print": 10**9,
                          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
                          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
                  process_group_backend="gloo")
out = sys.argv[1]
trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", "1")), strategy=strategy,
                    precision="bf16-mixed", max_epochs=1, limit_train_batches=lc.STEPS, default_root_dir=out,
                    logger=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "checkpoints"))])
trainer.fit(WithInfo(), torch.utils.data.DataLoader(lc._Data(), batch_size=2))
finish()  # leave without the interpreter's teardown (see _common.finish)
"""


def test_next_time_advice_makes_deepspeed_write_the_key(tmp_path):
    """The universal guide's one line (docs/universal-and-fix.md) for HF Trainer and for Lightning: the saved checkpoint then has
    universal_checkpoint_info, so ds_to_universal accepts it and the finding does not appear."""

    for name, code, ck in (
        ("hf", HF_SAVE_WITH_INFO, "checkpoint-2"),
        ("lightning", LIGHTNING_SAVE_WITH_INFO, "checkpoints/epoch=0-step=2.ckpt"),
    ):
        script = tmp_path / f"save_{name}.py"
        script.write_text(code)
        out = tmp_path / name
        torchrun(script, out, cwd=tmp_path)
        rep = inspect(out / ck)
        tags = [n for n in rep.inventory.nodes() if n.format == "deepspeed-zero"]
        assert tags and all(t.facts["universal_checkpoint_info"] is True for t in tags), name
        assert "universal-info-missing" not in {f.code for f in rep.findings}, name
