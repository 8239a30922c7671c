"""Names the frameworks give things on disk and in state dicts, shared by every layer above:
checkpoint folders and the step in their name, FSDP component folders, the keys that wrap a
model's state dict, and the top-level keys that are not the model."""

from __future__ import annotations

import re
from typing import Optional

# checkpoint-N (HF Trainer; tmp-checkpoint-N while it saves), global_stepN (DeepSpeed), step-N (torchtitan),
# iter_N (Megatron), epoch=E-step=N.ckpt / *step=N*.ckpt (Lightning)
CKPT_DIR_RE = re.compile(
    r"^((?:tmp-)?checkpoint-(\d+)|global_step_?(\d+)|step-(\d+)|iter_(\d+)|epoch=\d+-step=(\d+)\.ckpt|.*step=(\d+).*\.ckpt)$"
)
FSDP_MODEL_DIR_RE = re.compile(r"^pytorch_model_fsdp_(\d+)$")  # HF Trainer / Accelerate sharded FSDP
FSDP_OPTIM_DIR_RE = re.compile(r"^optimizer_(\d+)$")
# files only Accelerate's save_state writes (its RNG states, its names for the optimizer, scheduler,
# sampler and registered objects): the evidence for naming Accelerate, never a folder name alone
ACCELERATE_FILE_RE = re.compile(
    r"^(random_states_\d+\.pkl|(optimizer|scheduler|sampler)(_\d+)?\.bin|custom_checkpoint_\d+\.pkl)$"
)
MODEL_FILE_RE = re.compile(
    r"^(model(-\d+-of-\d+)?\.safetensors|model_\d+\.safetensors|pytorch_model(-\d+-of-\d+)?\.bin|model\.safetensors\.index\.json|pytorch_model\.bin\.index\.json|pytorch_model_\d+\.bin|adapter_model\.(safetensors|bin))$"
)

# where a torch file (or a DCP folder) keeps the model's state dict, in order of preference:
# Lightning's state_dict, DeepSpeed's module, Megatron's model, plain model_state_dict
STATE_DICT_WRAPPERS = ("state_dict", "module", "model", "model_state_dict")
# top-level keys of optimizer state, and of the rest of the training state (neither is the model)
OPTIMIZER_KEYS = frozenset({"optimizer", "optim", "optimizers", "optimizer_states"})
TRAINING_STATE_KEYS = frozenset(
    {
        "lr_scheduler",
        "dataloader",
        "train_state",
        "scheduler",
        "rng",
        "rng_state",
        "step",
        "epoch",
        "global_step",
        "extra_state",
        "args",
        "checkpoint_version",
        "iteration",
    }
)
# what `ckpt-tui fix` keeps of a file it rewrites: ``.<name>.ckpt-tui-bak`` beside it (repair/atomic.py)
BACKUP_SUFFIX = ".ckpt-tui-bak"


def backed_up_name(name: str) -> Optional[str]:
    """The name of the file a repair's backup ``name`` keeps (``.x.pt.ckpt-tui-bak`` -> ``x.pt``), or None."""
    if name.startswith(".") and name.endswith(BACKUP_SUFFIX) and len(name) > len(BACKUP_SUFFIX) + 1:
        return name[1 : -len(BACKUP_SUFFIX)]
    return None


# a flat torch optimizer state dict (FSDP2 get_state_dict saved flat)
OPTIMIZER_STATE_KEYS = frozenset({"state", "param_groups"})


HF_CKPT_DIR_RE = re.compile(r"^(?:tmp-)?checkpoint-\d+$")  # what an HF Trainer names a checkpoint (and while saving)


def trainer_written(names: "set[str]") -> bool:
    """Do these file names (one folder's) show the HF Trainer wrote it? ``training_args.bin`` (its ``_save``), or
    ``trainer_state.json``, or a scheduler beside an optimizer (``scheduler.pt`` with ``optimizer.pt``,
    ``optimizer_0/`` or a DeepSpeed tag, and none of Accelerate's own files: FSDP sharded saves write no
    ``training_args.bin``). A user's own
    ``save_pretrained("checkpoint-5")`` has none of them."""
    if "training_args.bin" in names or "trainer_state.json" in names:
        return True
    if any(ACCELERATE_FILE_RE.match(n) for n in names):
        return False  # Accelerate's save_state (its random_states_0.pkl, optimizer.bin ...), not the Trainer
    return "scheduler.pt" in names and any(
        n in ("optimizer.pt", "optimizer_0") or n.startswith("global_step") for n in names
    )


def step_of(name: str) -> Optional[int]:
    """The training step in a checkpoint folder's name (``checkpoint-2000`` -> 2000), or None."""
    m = CKPT_DIR_RE.match(name)
    if not m:
        return None
    for g in m.groups()[1:]:
        if g is not None:
            return int(g)
    return None
