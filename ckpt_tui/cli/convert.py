"""`ckpt-tui convert SRC --to torch-dcp --out DIR`: carry a DeepSpeed run over to torch FSDP2/DDP.

Exit codes as every command: 0 ok · 1 failed · 2 bad path or usage · 130 interrupted; messages on
stderr.
"""

from __future__ import annotations

import sys

import click

from ..core.errors import EXIT_OK
from .options import json_option, path_argument, path_option
from .output import conversion_plan, echo, emit_json, local_only, run_core


@click.command("convert", short_help="Carry a DeepSpeed ZeRO run over to torch FSDP2/DDP (torch DCP).")
@path_argument("src")
@click.option(
    "--to",
    "to",
    type=click.Choice(["torch-dcp"]),
    required=True,
    help="The target format. torch-dcp: a torch.distributed.checkpoint folder that FSDP2 "
    "(fully_shard) and DDP runs load at any world size.",
)
@path_option("--out", "out", required=True, help="Output folder. Must not exist or be empty, and not be inside SRC.")
@click.option(
    "--tag",
    default=None,
    help="DeepSpeed tag folder to convert instead of the one `latest` names "
    "(needed when `latest` names no tag folder).",
)
@click.option(
    "--strip-prefix",
    default=None,
    metavar="PREFIX",
    help="Remove PREFIX from every parameter name (e.g. `model.`), so the names match the model you load into.",
)
@click.option(
    "--keep-prefix",
    is_flag=True,
    help="Keep a Lightning module's attribute prefix (stripped by default, as `export` does).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be done and write nothing.")
@json_option("Print the plan or the result as one JSON document.")
def convert_cmd(src, to, out, tag, strip_prefix, keep_prefix, dry_run, as_json):
    """Convert the DeepSpeed ZeRO-1/2/3 checkpoint SRC to a torch.distributed.checkpoint
    that a torch FSDP2 (fully_shard) or DDP run resumes from, at any world size.

    SRC: a checkpoint folder (checkpoint-2000/: the tag `latest` names, or --tag),
    a DeepSpeed tag folder (global_step2000/), a Lightning *.ckpt/ folder, or a run
    folder (its newest complete checkpoint). Written by HF Trainer, Lightning or a
    raw DeepSpeed engine.

    The output holds {"model", "optimizer", "step"} in the form of torch's
    get_state_dict(model, optimizer): the parameters are the run's fp32 masters,
    the optimizer is torch's AdamW (or Adam) with each parameter's exp_avg,
    exp_avg_sq and step. scheduler.pt and rng_state_*.pth are copied when the
    checkpoint holds them; conversion.json says what did not carry over. Every
    tensor is read back with torch's dcp.load and compared bit-exact with the
    source before the folder gets its name. The source is never modified. At the
    end it prints the code that loads it (run on every rank, after fully_shard).

    \b
    Examples:
      ckpt-tui convert checkpoint-2000 --to torch-dcp --out resume-fsdp2
      ckpt-tui convert checkpoint-2000 --to torch-dcp --out resume-fsdp2 --dry-run
    """
    local_only(src, "convert")
    from ..core.convert.torch_dcp import TorchDcpError, convert_to_torch_dcp, torch_dcp_plan

    plan = conversion_plan(
        lambda: torch_dcp_plan(src, out, tag=tag, strip_prefix=strip_prefix, keep_prefix=keep_prefix),
        TorchDcpError,
        dry_run=dry_run,
        as_json=as_json,
    )
    res = run_core(
        lambda **kw: convert_to_torch_dcp(plan, **kw),
        as_json=as_json,
        cleanup="the partial output was removed, the source is untouched",
    )
    if as_json:
        emit_json({"result": res.to_json()})
        sys.exit(EXIT_OK)
    echo(
        f"Wrote {plan.shown(res.out)} ({res.tensors} tensors, {res.files} files) in {res.seconds:.1f} s — "
        "verified ✓ (read back with torch's dcp.load, bit-exact vs the source)"
    )
    echo("")
    echo(res.instructions)
    sys.exit(EXIT_OK)
