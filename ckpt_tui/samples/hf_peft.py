"""transformers.Trainer + PEFT LoRA checkpoints on CPU (transformers 5.24, peft 0.21), and two full fine-tuning
runs whose ``optimizer.pt`` the Trainer indexes in its own order (decay group, then no-decay group).

python -m torch.distributed.run --standalone --nproc_per_node 1 -m ckpt_tui.samples.hf_peft OUTDIR [variants]
python -m torch.distributed.run --standalone --nproc_per_node 2 -m ckpt_tui.samples.hf_peft OUTDIR [variants]

Each variant folder is laid out as a user's run is:
  base-model/         the base, written with save_pretrained first (PEFT variants only)
  run/checkpoint-2/   the Trainer's output_dir "run" after 2 steps; the base was loaded back with
                      from_pretrained("base-model") from inside the variant folder, so adapter_config.json
                      records base_model_name_or_path "base-model" (relative, as a user's would be)
  oracle/             what the live run held, recorded by rank 0 after trainer.train():
    optimizer_names.json          {"groups": [{"weight_decay", "params": [names]}], "source": ...}: the index -> name
                                  map of the Trainer's optimizer (names as model.named_parameters() gives them)
    adapter_state.safetensors     peft.get_peft_model_state_dict(model) of the trained model (PEFT variants)
    adapter_state_fp32.safetensors  DeepSpeed variants: the fp32 masters (safe_get_full_fp32_param) under the
                                  same names: what the tag holds, where adapter_state is the bf16 model

What was found on CPU with these pins (torch 2.13.0+cpu, transformers 5.24.0, peft 0.21.0, deepspeed 0.19.8,
accelerate 1.15.0), and what each variant therefore holds:
- One process under torchrun --nproc_per_node 1: with torchrun's variables set, Accelerate wraps the model in a
  1-rank DDP; main() drops them first, so the run is the one `python train.py` makes (rng_state.pth, no _0).
- lora_B starts at zero; learning_rate 1e-2 for two steps moves every B (the generator asserts it per module).
- The Trainer's two groups (weight_decay 0.01 / 0.0, each in named_parameters() order) hold only trainable
  parameters; for LoRA on q/v alone the no-decay group is empty (kept, as an empty group, in optimizer.pt).
- DeepSpeed with an "optimizer" block in its config (hf_ds_config): the Trainer hands DeepSpeed one flat list
  of the trainable parameters, so its optimizer has ONE group, weight_decay 0.01 for all (biases and norms
  included), not the Trainer's decay / no-decay split. optimizer_names.json records it from bit16_groups
  (ZeRO-2) / fp16_groups (ZeRO-3); the optimizer itself steps one flat fp32 partition per group.
- DeepSpeed: the tag (global_step2/) is saved with exclude_frozen_parameters: only the 8 LoRA tensors, named
  `...lora_A.default.weight`; both ZeRO-2 and ZeRO-3 (really partitioned: stage3_param_persistence_threshold 0)
  also write adapter_config.json and a correct, gathered bf16 adapter_model.safetensors (equal to
  oracle/adapter_state); DeepSpeed 0.19.8 writes zero_to_torch.py beside zero_to_fp32.py; no scheduler.pt.
- FSDP (patched onto CPU as in hf_trainer.py; the Trainer's use_orig_params defaults to true; under FSDP1,
  PEFT's auto-wrap policy makes each lora_A / lora_B an FSDP unit of its own): no adapter_config.json, no
  adapter_model.safetensors, no config.json. FSDP2's pytorch_model_fsdp_0/ holds the adapter under PEFT's names with the `model.` prefix
  (`model.base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`); FSDP1's pytorch_model_fsdp_0/
  holds NO tensor entries (issue 24). optimizer_0/ of both: `optimizer.state.<name with .default>.*` and both
  groups (the no-decay one empty).
- FSDP1 oracle: torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True) segfaults
  rank 0 here; summon_full_params works, and PEFT, which picks an adapter's entries by its modules' names
  (changed by FSDP1's `_fsdp_wrapped_module.`), names the values on a fresh unwrapped copy.
- PEFT 0.21 with lora_bias=True warns that every lora_B.bias "has invalid shape ... ZeRO-3 / FSDP shards were
  not gathered": a false alarm (a bias is 1-D); the saved biases are whole.
- GPT2Config's default bos/eos (50256) lie outside a 256-token vocabulary; TINY_GPT2 sets them to 255.
- Two generations write the same bytes, but for adapter_config.json: PEFT keeps target_modules as a set, so
  the list's order follows Python's per-process string hashing (compare it as a set).
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ckpt_tui.samples._common import TINY_LLAMA, log, run_variants, seed_all
from ckpt_tui.samples.hf_trainer import TokenData, cpu_fsdp_trainer_cls, hf_ds_config, init_deepspeed, reset_accelerate

STEPS = 2
LR = 1e-2
WEIGHT_DECAY = 0.01
# GPT2Config's bos/eos (50256) lie outside a 256-token vocabulary: transformers warns; keep them inside it
TINY_GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, bos_token_id=255, eos_token_id=255)


@dataclass(frozen=True)
class Spec:
    arch: str  # "llama" | "gpt2"
    kind: str  # "single" | "ddp" | "ds" | "fsdp"
    world: int = 1
    stage: int = 0  # ZeRO stage or FSDP version
    lora: dict[str, Any] | None = None  # LoraConfig kwargs; None: full fine-tuning
    arch_kwargs: dict[str, Any] = field(default_factory=dict)
    base_bf16: bool = False  # the base saved (and loaded) in bfloat16
    bf16: bool = False  # TrainingArguments(bf16=...)
    save_only_model: bool = False  # TrainingArguments(save_only_model=...): no optimizer, scheduler or RNG saved
    resize_vocab: int = 0  # the run added tokens: base.resize_token_embeddings(n) before wrapping it


_QV = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])

VARIANTS: dict[str, Spec] = {
    # one process
    "peft-llama": Spec("llama", "single", lora=_QV),
    "peft-llama-bias-bf16": Spec(
        "llama",
        "single",
        lora=dict(
            r=4,
            lora_alpha=8,
            target_modules="all-linear",
            rank_pattern={"down_proj": 2},
            alpha_pattern={"down_proj": 3, "o_proj": 2},
        ),
        arch_kwargs=dict(attention_bias=True),
        base_bf16=True,
        bf16=True,
    ),
    "peft-gpt2-rslora": Spec(
        "gpt2",
        "single",
        lora=dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], use_rslora=True, lora_bias=True),
    ),
    # a run that added tokens: the embedding and the head resized past the base's 256 and saved whole
    "peft-llama-resized": Spec(
        "llama",
        "single",
        lora=dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens", "lm_head"]),
        resize_vocab=264,
    ),
    "full-gpt2-optim": Spec("gpt2", "single"),
    "full-llama-bias-optim": Spec("llama", "single", arch_kwargs=dict(attention_bias=True)),
    # two ranks
    "peft-ddp-mts": Spec(
        "llama",
        "ddp",
        world=2,
        lora=dict(
            r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], modules_to_save=["lm_head"]
        ),
    ),
    # full fine-tuning under 2-rank DDP with save_only_model (issue 24: what a resume from it does)
    "full-ddp-model-only": Spec("llama", "ddp", world=2, save_only_model=True),
    "peft-ds-zero2": Spec("llama", "ds", world=2, stage=2, lora=_QV, bf16=True),
    "peft-ds-zero3": Spec("llama", "ds", world=2, stage=3, lora=_QV, bf16=True),
    "peft-fsdp2": Spec("llama", "fsdp", world=2, stage=2, lora=_QV, bf16=True),
    "peft-fsdp1": Spec("llama", "fsdp", world=2, stage=1, lora=_QV, bf16=True),
}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _build(spec: Spec):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    if spec.arch == "gpt2":
        config = GPT2Config(**TINY_GPT2, **spec.arch_kwargs)
    else:
        config = LlamaConfig(**TINY_LLAMA, **spec.arch_kwargs)
    dtype = torch.bfloat16 if spec.base_bf16 else torch.float32
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _args(spec: Spec):
    from transformers import TrainingArguments

    common: dict[str, Any] = dict(
        output_dir="run",
        per_device_train_batch_size=2,
        max_steps=STEPS,
        save_steps=STEPS,
        save_strategy="steps",
        logging_steps=1,
        learning_rate=LR,
        weight_decay=WEIGHT_DECAY,
        bf16=spec.bf16,
        save_only_model=spec.save_only_model,
        use_cpu=True,
        report_to=[],
        seed=1234,
        data_seed=1234,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if spec.kind == "ds":
        cfg = hf_ds_config(spec.stage)
        if spec.stage == 3:
            # partition even a tiny model (the default keeps every tensor under 100K elements whole)
            cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return TrainingArguments(deepspeed=cfg, **common)
    if spec.kind == "fsdp":
        return TrainingArguments(
            fsdp="full_shard",
            fsdp_config={
                "version": spec.stage,
                "state_dict_type": "SHARDED_STATE_DICT",
                "sync_module_states": False,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            },
            **common,
        )
    return TrainingArguments(**common)


def _clean(name: str) -> str:
    """A parameter name without the wrappers' segments (FSDP1 keeps them in a submodule's names)."""
    for seg in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(seg, "")
    return name


def _optimizer_names(trainer, model) -> dict[str, Any]:
    id2name = {id(p): _clean(n) for n, p in model.named_parameters()}
    opt = trainer.optimizer
    inner = getattr(opt, "optimizer", opt)  # accelerate's wrapper -> the torch (or DeepSpeed) optimizer
    ds_groups = getattr(inner, "bit16_groups", None) or getattr(inner, "fp16_groups", None)
    if ds_groups is not None:
        # DeepSpeed's optimizer steps one flat fp32 partition per group; the model's parameters of each group
        # are kept in bit16_groups (ZeRO-1/2) or fp16_groups (ZeRO-3), in the Trainer's order
        groups = [
            {"weight_decay": float(g["weight_decay"]), "params": [id2name[id(p)] for p in params]}
            for g, params in zip(inner.optimizer.param_groups, ds_groups, strict=True)
        ]
        source = (
            f"deepspeed {type(inner).__name__}.{'bit16_groups' if hasattr(inner, 'bit16_groups') else 'fp16_groups'}"
        )
    else:
        groups = [
            {"weight_decay": float(g["weight_decay"]), "params": [id2name[id(p)] for p in g["params"]]}
            for g in opt.param_groups
        ]
        source = "trainer.optimizer.param_groups"
    return {"groups": groups, "source": source}


def _adapter_state(trainer, model, spec: Spec) -> dict[str, dict[str, torch.Tensor]]:
    """The trained adapter as PEFT names it: {"adapter_state": ..., maybe "adapter_state_fp32": ...}.
    Collective under ZeRO-3 and FSDP: every rank calls it; the tensors are whole on rank 0."""
    from peft import get_peft_model_state_dict

    def detach(sd):
        return {k: v.detach().clone().contiguous().cpu() for k, v in sd.items()}

    out: dict[str, dict[str, torch.Tensor]] = {}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if spec.kind == "ds":
        import deepspeed
        from deepspeed.utils import safe_get_full_fp32_param

        with deepspeed.zero.GatheredParameters([p for _, p in trainable], enabled=spec.stage == 3):
            out["adapter_state"] = detach(get_peft_model_state_dict(model))
        fp32 = {_clean(n): safe_get_full_fp32_param(p) for n, p in trainable}
        out["adapter_state_fp32"] = detach(get_peft_model_state_dict(model, state_dict=fp32))
    elif spec.kind == "fsdp" and spec.stage == 2:
        # fully_shard made every parameter a DTensor: full_tensor() gathers it (collective)
        full = {_clean(n): p.full_tensor() for n, p in trainable}
        out["adapter_state"] = detach(get_peft_model_state_dict(model, state_dict=full))
    elif spec.kind == "fsdp":
        # FSDP1 (use_orig_params): the parameters are views into the flat shards until summoned whole.
        # (torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True) segfaults
        # rank 0 here, on gloo with PEFT's frozen base)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(trainer.model_wrapped, writeback=False):
            # named anew inside: the summoned parameters are other tensors than the sharded views
            full = {_clean(n): p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        if _rank() == 0:
            # PEFT picks an adapter's entries by its modules' names, which FSDP1's wrappers changed: name them
            # on a fresh, unwrapped copy of the same model holding the trained values
            fresh = _peft_model(spec)
            res = fresh.load_state_dict(full, strict=False)
            assert not res.unexpected_keys and not set(full) & set(res.missing_keys), res
            out["adapter_state"] = detach(get_peft_model_state_dict(fresh))
    else:
        out["adapter_state"] = detach(get_peft_model_state_dict(model))
    return out


def _check_moved(name: str, state: dict[str, torch.Tensor]) -> None:
    """PEFT starts every lora_B at zero: a B still all zero would make a missing merge pass unnoticed."""
    bs = [k for k in state if "lora_B" in k and k.endswith(".weight")]
    assert bs, f"{name}: no lora_B in {sorted(state)}"
    still = [k for k in bs if not state[k].count_nonzero()]
    assert not still, f"{name}: lora_B still zero after training: {still}"


def _peft_model(spec: Spec):
    """The base from ``base-model`` (relative: the cwd is the variant folder), wrapped as the spec says."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    assert spec.lora is not None
    dtype = torch.bfloat16 if spec.base_bf16 else torch.float32
    base = AutoModelForCausalLM.from_pretrained("base-model", dtype=dtype)
    if spec.resize_vocab:  # as a run that added tokens does (the new rows drawn by transformers' init)
        base.resize_token_embeddings(spec.resize_vocab)
    seed_all()  # LoRA's A is drawn at random
    return get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **spec.lora))


def run_variant(name: str, spec: Spec) -> None:
    from transformers import Trainer

    world = dist.get_world_size() if dist.is_initialized() else 1
    assert world == spec.world, f"{name} runs on {spec.world} ranks, launched on {world}"
    seed_all()
    if spec.lora is not None:
        if _rank() == 0:
            _build(spec).save_pretrained("base-model")
        _barrier()
        model = _peft_model(spec)
    else:
        model = _build(spec)
    args = _args(spec)
    trainer_cls = cpu_fsdp_trainer_cls() if spec.kind == "fsdp" else Trainer
    trainer = trainer_cls(model=model, args=args, train_dataset=TokenData())
    trainer.train()

    names = _optimizer_names(trainer, model)
    states = _adapter_state(trainer, model, spec) if spec.lora is not None else {}
    if _rank() == 0:
        from safetensors.torch import save_file

        oracle = Path("oracle")
        oracle.mkdir(exist_ok=True)
        (oracle / "optimizer_names.json").write_text(json.dumps(names, indent=1) + "\n")
        for fname, state in states.items():
            _check_moved(name, state)
            save_file(state, oracle / f"{fname}.safetensors")
    if spec.kind == "ds":
        trainer.deepspeed.destroy()
    del trainer, model
    gc.collect()
    reset_accelerate()
    if spec.kind == "ds":
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()


_TORCHRUN_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def main() -> None:
    def make(name: str, out: Path) -> None:
        env, cwd = dict(os.environ), os.getcwd()
        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        os.chdir(out)  # from_pretrained("base-model") by the relative path, as a user's run does
        try:
            run_variant(name, VARIANTS[name])
        finally:
            os.chdir(cwd)
            # TrainingArguments exports ACCELERATE_USE_DEEPSPEED / ACCELERATE_USE_FSDP ...; undo for the next variant
            os.environ.clear()
            os.environ.update(env)
        log(f"{name} done")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        # one process as `python train.py` runs it: without torchrun's variables Accelerate sets up no
        # distributed state (with them it wraps the model in a 1-rank DDP)
        for k in [k for k in os.environ if k.startswith("TORCHELASTIC_") or k in _TORCHRUN_VARS]:
            del os.environ[k]
    run_variants(VARIANTS, make, setup=init_deepspeed if world > 1 else None)


if __name__ == "__main__":
    main()
