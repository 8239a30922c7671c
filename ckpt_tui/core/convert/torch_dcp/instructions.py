"""How to resume from the converted folder: the code (run on every rank of an FSDP2 or DDP run, any
world size, once ``model`` is built and wrapped) and what else to know. The test
``tests/functional/core/test_convert_torch_dcp.py`` runs exactly :func:`load_code`'s text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Protocol


class ConvertedPlan(Protocol):
    """What the instructions read of a ``TorchDcpPlan``."""

    @property
    def out(self) -> Path: ...
    @property
    def hyper(self) -> Mapping[str, Any]: ...
    @property
    def optimizer_class(self) -> str: ...
    @property
    def global_step(self) -> Optional[int]: ...
    @property
    def carried(self) -> Sequence[Path]: ...
    @property
    def not_carried(self) -> Sequence[str]: ...
    def shown(self, p: Path) -> str: ...


def _literal(v: object) -> str:
    return repr(tuple(v)) if isinstance(v, (list, tuple)) else repr(v)


def load_code(plan: ConvertedPlan) -> str:
    """Python that builds the optimizer and loads model, optimizer and step from ``plan.out``
    (``model``: the user's model, already wrapped with ``fully_shard`` or DDP)."""
    args = ", ".join(f"{k}={_literal(v)}" for k, v in plan.hyper.items())
    return (
        "import torch\n"
        "import torch.distributed.checkpoint as dcp\n"
        "from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict\n"
        "\n"
        f"optimizer = torch.optim.{plan.optimizer_class}([p for p in model.parameters() if p.requires_grad], {args})\n"
        "model_sd, optim_sd = get_state_dict(model, optimizer)\n"
        'state = {"model": model_sd, "optimizer": optim_sd, "step": 0}\n'
        f"dcp.load(state, checkpoint_id={plan.shown(plan.out)!r})\n"
        'set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])\n'
        f'step = state["step"]  # {plan.global_step}: the DeepSpeed run\'s global step\n'
    )


def instructions(plan: ConvertedPlan) -> str:
    sh = plan.shown
    lines = [
        f"torch.distributed.checkpoint: {sh(plan.out)}  (model + {plan.optimizer_class} state + step "
        f"{plan.global_step}; loads at any world size)",
        "",
        "Resume under torch FSDP2 (or DDP): on every rank, after building the same model and wrapping it "
        "(fully_shard(...) per block and on the root, or DDP), run:",
        "",
        load_code(plan).rstrip("\n"),
        "",
        "then train on as usual (the optimizer's hyper-parameters are restored from the checkpoint).",
    ]
    if plan.carried:
        lines += [
            "",
            f"Copied as they were into {sh(plan.out)}: "
            + ", ".join(f.name for f in plan.carried)
            + (
                " (scheduler.pt is the state of the run's torch LR scheduler: build the same scheduler over "
                "this optimizer and load it with its load_state_dict)"
                if any(f.name == "scheduler.pt" for f in plan.carried)
                else ""
            ),
        ]
    if plan.not_carried:
        lines += ["", "Not carried over:"] + [f"  - {x}" for x in plan.not_carried]
    return "\n".join(lines)
