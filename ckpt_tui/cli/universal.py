"""`ckpt-tui universal`: convert a DeepSpeed ZeRO checkpoint to a universal checkpoint.

Exit codes as every command: 0 ok · 1 failed · 2 bad path or usage · 130 interrupted; messages on
stderr.
"""

from __future__ import annotations

import sys

import click

from ..core.errors import EXIT_OK
from .options import json_option, path_argument, path_option, trust_pickles_option
from .output import conversion_plan, echo, emit_json, local_only, run_core


@click.command("universal", short_help="Convert DeepSpeed ZeRO to a universal checkpoint.")
@path_argument("src")
@path_option(
    "--out",
    "out",
    default=None,
    help="Output folder (default: <tag>_universal beside the tag folder). Must not exist or be empty.",
)
@click.option(
    "--tag",
    default=None,
    help="DeepSpeed tag folder to convert instead of the one `latest` names "
    "(needed when `latest` names no tag folder).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be done and write nothing.")
@click.option(
    "--export-frozen/--no-export-frozen",
    default=True,
    show_default=True,
    help="Write frozen parameters and buffers (not restored by load_universal) to "
    "frozen_params.safetensors next to the output. With the universal folder already there "
    "and complete, --export-frozen writes only that file.",
)
@click.option(
    "--target-stage",
    type=click.IntRange(0, 3),
    default=None,
    help="The ZeRO stage you will resume with: warns when DeepSpeed cannot load across stages.",
)
@trust_pickles_option(
    "Convert even if a pickle names code outside ckpt-tui's allowlist (DeepSpeed's converter "
    "unpickles without restriction). Only for checkpoints you trust."
)
@json_option("Print the plan or the result as one JSON document.")
def universal_cmd(src, out, tag, dry_run, export_frozen, target_stage, trust_pickles, as_json):
    """Convert the DeepSpeed ZeRO checkpoint SRC to a universal checkpoint
    (loadable at any world size).

    SRC: a checkpoint folder (checkpoint-2000/: the tag `latest` names, or
    --tag), a DeepSpeed tag folder (global_step2000/), a Lightning *.ckpt/
    folder, or a run folder (its newest complete checkpoint). Runs DeepSpeed's own
    ds_to_universal in a subprocess (logged to a file), supplies a missing
    universal_checkpoint_info in memory, verifies every parameter against the
    source's fp32 masters bit-exact, moves the result into place and writes
    latest_universal. The source is never modified.

    \b
    Examples:
      ckpt-tui universal checkpoint-2000
      ckpt-tui universal checkpoint-2000 --target-stage 2
      ckpt-tui universal checkpoint-2000 --dry-run
    """
    local_only(src, "universal")
    from ..core.convert.universal import UniversalError, convert_to_universal, universal_plan

    plan = conversion_plan(
        lambda: universal_plan(
            src, out, trust_pickles=trust_pickles, target_stage=target_stage, export_frozen=export_frozen, tag=tag
        ),
        UniversalError,
        dry_run=dry_run,
        as_json=as_json,
    )
    res = run_core(
        lambda **kw: convert_to_universal(plan, **kw),
        as_json=as_json,
        unit="files",
        label="converting",
        cleanup="the converter was stopped and the partial output removed, the source is untouched",
    )
    if as_json:
        emit_json({"result": res.to_json()})
        sys.exit(EXIT_OK)
    v = res.verification
    if res.frozen_only:
        echo(f"{plan.shown(res.out)} is already a complete universal checkpoint: not converted again")
    else:
        echo(
            f"Wrote {plan.shown(res.out)} ({res.files} files) in {res.seconds:.1f} s — verified ✓ "
            f"({v.checked} parameters; fp32 bit-exact vs the source masters)"
        )
    if res.frozen_file:
        echo(f"Frozen parameters/buffers written to {plan.shown(res.frozen_file)}")
    for w in res.verification.notes:
        echo(f"  note: {w}")
    echo("")
    echo(res.instructions)
    sys.exit(EXIT_OK)
