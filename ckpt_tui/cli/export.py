"""`ckpt-tui export` and what checks or compares weights: `verify`, `diff`, `stats`."""

from __future__ import annotations

import sys

import click

from ..core.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from ..core.formats.registry import optimizer_sources
from .options import json_option, path_argument, path_option, trust_pickles_option
from .output import echo, emit_json, fail, run_core


@click.command("export", short_help="Export the model weights to safetensors.")
@path_argument("src")
@path_option("--out", "out", required=True, help="Output folder (created; must be empty unless --overwrite).")
@click.option(
    "--dtype",
    type=click.Choice(["keep", "fp32", "bf16", "fp16"]),
    default="keep",
    show_default=True,
    help="Output dtype of floating-point tensors. keep = as stored (DeepSpeed: the fp32 masters).",
)
@click.option(
    "--max-shard-size",
    default="50GB",
    show_default=True,
    help="Split into model-0000k-of-0000n.safetensors + index above this size (as save_pretrained).",
)
@click.option("--jobs", type=int, default=1, show_default=True, help="Write output shards in N parallel threads.")
@click.option(
    "--tag",
    default=None,
    help="DeepSpeed tag folder to export instead of the one `latest` names (needed when `latest` names no tag folder).",
)
@click.option(
    "--from-module-states",
    is_flag=True,
    help="DeepSpeed ZeRO-1/2: export the module weights of mp_rank_00_model_states.pt (training dtype, "
    "bf16/fp16: NOT the fp32 masters), for when an optimizer-states file is missing or corrupt.",
)
@click.option(
    "--component",
    type=click.Choice(["model", "optimizer"]),
    default="model",
    show_default=True,
    help="The role to export: optimizer writes the Adam state per parameter (optimizer.safetensors: "
    "<name>.exp_avg, .exp_avg_sq, and .master where the run kept fp32 masters apart) and "
    f"optimizer_config.json (step, param groups) of {optimizer_sources()}; other sources: not supported yet.",
)
@click.option(
    "--merge",
    is_flag=True,
    help="A LoRA adapter: write the base model with the adapter merged in (a Hugging Face folder), bit-exact "
    "with PEFT's merge_and_unload(). Without it an adapter is written as PEFT saves it.",
)
@path_option(
    "--base",
    "base",
    default=None,
    help="With --merge: the base model's folder, where adapter_config.json's base_model_name_or_path is not "
    "found (looked for beside you, the checkpoint, its run and the local Hugging Face cache; never downloaded).",
)
@path_option(
    "--adapter-config",
    "adapter_config",
    default=None,
    help="A LoRA adapter saved without its adapter_config.json (FSDP, DeepSpeed): the run's adapter_config.json.",
)
@click.option(
    "--to",
    "to",
    type=click.Choice(["safetensors", "hf"]),
    default="safetensors",
    show_default=True,
    help="hf: a Hugging Face model folder (LlamaForCausalLM; Qwen2ForCausalLM where only q/k/v have biases: "
    "names mapped, fused QKV and gate/up split, config.json from the run's record, else --config; the tokenizer "
    "and generation_config.json copied) of a Megatron-Core torch_dist Llama-family GPT checkpoint or a torchtitan "
    "Llama step-N checkpoint (wq/wk permuted as its Llama3StateDictAdapter does).",
)
@click.option(
    "--true-vocab-size",
    type=int,
    default=None,
    help="With --to hf: keep only the first N rows of the (padded) embedding and output layer.",
)
@path_option(
    "--tokenizer",
    "tokenizer",
    default=None,
    help="With --to hf: the folder whose tokenizer files (tokenizer.json, tokenizer_config.json, ...) are "
    "copied into the output (default: --config's folder, the run's recorded one, beside the checkpoint).",
)
@click.option("--exclude-frozen", is_flag=True, help="Leave out frozen parameters (DeepSpeed).")
@click.option("--strip-prefix", default=None, help="Remove this prefix from tensor names (e.g. 'model.').")
@click.option(
    "--keep-prefix",
    is_flag=True,
    help="Keep the LightningModule attribute prefix ('model.') that a Lightning export strips by default.",
)
@path_option(
    "--config",
    "config",
    default=None,
    help="config.json (or a folder with config/tokenizer files) to copy into the output. With --to hf: the "
    "model's HF config.json (or its folder), checked against the run's own record; its folder's tokenizer and "
    "generation_config.json are copied.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan (files, tensors, bytes) and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output folder (atomically, at the end).")
@click.option("--no-verify", is_flag=True, help="Skip re-reading every tensor and comparing it with the source.")
@trust_pickles_option("Load pickles that name code outside the allowlist.")
@json_option("Print the plan or the result as one JSON document.")
def export_cmd(
    src,
    out,
    dtype,
    max_shard_size,
    jobs,
    tag,
    from_module_states,
    component,
    merge,
    base,
    adapter_config,
    to,
    true_vocab_size,
    tokenizer,
    exclude_frozen,
    strip_prefix,
    keep_prefix,
    config,
    dry_run,
    overwrite,
    no_verify,
    trust_pickles,
    as_json,
):
    """Export the model weights of SRC to safetensors in OUT, ready to load.

    SRC may be the checkpoint folder (checkpoint-2000/: the model component is
    picked and named), a run folder (its newest complete checkpoint), or a
    component: a DCP folder, a DeepSpeed tag folder (fp32 weights rebuilt from
    the ZeRO partitions), a universal checkpoint, a torch file, safetensors.
    A folder holding a model-only DCP and one holding model and optimizer
    exports the model-only one; name the other as SRC to export its model.

    Bytes are streamed by offset with bounded memory; the output is written to
    a temp folder, fsynced and moved into place only when complete and
    verified.

    A LoRA adapter (a PEFT run's adapter_model.safetensors, or its DeepSpeed
    tag or FSDP folder) is written as PEFT saves it: adapter_model.safetensors
    and adapter_config.json, loaded by PeftModel.from_pretrained(base, OUT).
    --merge writes the base model with the adapter merged in, bit-exact with
    PEFT's merge_and_unload(); the base is found where adapter_config.json
    says (or --base PATH), never downloaded.

    --to hf writes a Megatron-Core torch_dist checkpoint (or a torchtitan
    step-N) of a Llama-family model as a Hugging Face folder
    (LlamaForCausalLM; Qwen2ForCausalLM where only q/k/v have biases): q/k/v
    split by query group, gate/up from linear_fc1, config.json from the run's
    record (else --config PATH, an HF config.json; given both, every value
    both give must agree); the tokenizer copied from --tokenizer DIR,
    --config's folder, the run's recorded folder or beside the checkpoint;
    anything else is refused.

    A Lightning checkpoint whose names all start with one LightningModule
    attribute (model.) loses that prefix (--keep-prefix keeps it). The code
    printed at the end loads the output: from_pretrained when it has a
    config.json and HF-style names, else model.load_state_dict.

    \b
    Examples:
      ckpt-tui export checkpoint-2000 --out merged/
      ckpt-tui export checkpoint-2000 --out merged/ --dtype bf16 \\
          --max-shard-size 5GB
      ckpt-tui export checkpoint-2000 --out merged/ --dry-run
      ckpt-tui export checkpoint-500 --out adapter/          # a LoRA adapter
      ckpt-tui export checkpoint-500 --merge --out merged/   # merged in
      ckpt-tui export checkpoints/ --to hf --out hf/          # Megatron -> HF
    """

    from ..core.export.api import plan_export
    from ..core.export.plan import parse_size
    from ..core.export.write import ExportError, execute
    from ..core.scan import ScanError

    try:
        parse_size(max_shard_size)
    except ValueError as e:
        fail(str(e), EXIT_USAGE)
    if keep_prefix and strip_prefix:
        fail("--keep-prefix and --strip-prefix contradict each other; give one", EXIT_USAGE)
    from ..core.export.distributed import launch_env

    try:
        launch = launch_env()  # under torchrun/srun: this process is one rank of a split export
    except ExportError as e:
        fail(str(e), EXIT_USAGE)
    if launch is not None and not dry_run:
        _export_rank(
            launch,
            src,
            out,
            jobs,
            overwrite,
            no_verify,
            as_json,
            dict(
                dtype=dtype,
                max_shard_size=max_shard_size,
                exclude_frozen=exclude_frozen,
                strip_prefix=strip_prefix,
                keep_prefix=keep_prefix,
                config=config,
                tag=tag,
                trust_pickles=trust_pickles,
                from_module_states=from_module_states,
                component=component,
                merge=merge,
                base=base,
                adapter_config=adapter_config,
                to=None if to == "safetensors" else to,
                true_vocab_size=true_vocab_size,
                tokenizer=tokenizer,
            ),
        )
    quiet = launch is not None and launch.rank != 0  # a dry run under a launcher: rank 0 prints it
    try:
        plan, said = plan_export(
            src,
            out,
            dtype=dtype,
            max_shard_size=max_shard_size,
            exclude_frozen=exclude_frozen,
            strip_prefix=strip_prefix,
            keep_prefix=keep_prefix,
            config=config,
            tag=tag,
            trust_pickles=trust_pickles,
            from_module_states=from_module_states,
            component=component,
            merge=merge,
            base=base,
            adapter_config=adapter_config,
            to=None if to == "safetensors" else to,
            true_vocab_size=true_vocab_size,
            tokenizer=tokenizer,
        )
    except ScanError as e:
        fail(str(e), EXIT_USAGE)
    except (ExportError, FileNotFoundError, ValueError) as e:
        fail(str(e), EXIT_FINDINGS)
    if quiet:
        sys.exit(EXIT_OK)
    for line in said:
        echo(f"ckpt-tui: {line}", err=True)
    if dry_run:
        if as_json:
            emit_json({"plan": plan.to_plan().to_json()})
        else:
            echo(plan.to_plan().describe())
        sys.exit(EXIT_OK)
    res = run_core(
        lambda **kw: execute(plan, jobs=jobs, overwrite=overwrite, verify=not no_verify, **kw),
        as_json=as_json,
        cleanup="the partial output was removed, the source is untouched",
    )
    _report(res, said, out, as_json)


def _report(res, said, out, as_json) -> None:
    from ..core.present import naturalsize, param_count
    from ..core.types import shell_path

    res.notes = said + res.notes
    if as_json:
        emit_json({"result": res.to_json()})
        sys.exit(EXIT_OK)
    ver = {
        True: "verified ✓ (every tensor re-read and compared bit-exact)",
        False: "verification FAILED",
        None: "not verified (--no-verify)",
    }[res.verified]
    # an optimizer export's tensors are per-parameter states: their elements are not the model's parameters
    unit = "values" if res.files and all(f.startswith("optimizer") for f in res.files) else "params"
    echo(
        f"Wrote {len(res.files)} file(s), {naturalsize(res.bytes)}, {res.tensors} tensors, "
        f"{param_count(res.params)} {unit} to {shell_path(out)} in {res.seconds:.1f} s — {ver}"
    )
    for n in res.notes:
        if not n.startswith(("the model is", "exporting the newest", "exporting the optimizer state of", "taking the")):
            echo(f"  note: {n}")
    echo("Load it with:")
    for line in res.load_code.splitlines():
        echo(f"  {line}" if line else "")
    sys.exit(EXIT_OK)


def _export_rank(launch, src, out, jobs, overwrite, no_verify, as_json, options) -> None:
    """One rank of an export split over a launcher's processes (core/export/distributed.py). Every rank
    plans the same export; rank 0 prints what a single process prints, the other ranks only errors."""
    import os
    import signal

    from ..core.export.api import plan_export
    from ..core.export.distributed import DEAD_AFTER, connect_from_env, execute_distributed
    from ..core.export.write import ExportError
    from ..core.scan import ScanError

    def on_term(signum, frame):  # the launcher stops the other ranks with SIGTERM: clean up, then exit
        raise KeyboardInterrupt

    try:  # seconds without a peer's heartbeat before it counts as dead
        dead_after = float(os.environ.get("CKPT_TUI_DIST_TIMEOUT", DEAD_AFTER))
    except ValueError:
        fail("CKPT_TUI_DIST_TIMEOUT must be a number of seconds", EXIT_USAGE)

    signal.signal(signal.SIGTERM, on_term)
    rank = launch.rank
    try:
        group = connect_from_env(launch)
    except ExportError as e:
        fail(str(e), EXIT_FINDINGS)
    try:
        plan, said = plan_export(src, out, **options)
    except (ScanError, ExportError, FileNotFoundError, ValueError) as e:
        try:
            group.publish("abort", f"rank {rank}: {e}")
        except Exception:
            pass
        fail(f"rank {rank}: {e}", EXIT_USAGE if isinstance(e, ScanError) else EXIT_FINDINGS)

    def run(**kw):
        try:
            return execute_distributed(
                plan, group, jobs=jobs, overwrite=overwrite, verify=not no_verify, dead_after=dead_after, **kw
            )
        except ExportError as e:
            raise ExportError(f"rank {rank}: {e}") from None

    res = run_core(run, as_json=as_json or rank != 0, cleanup="the partial output was removed, the source is untouched")
    if rank == 0:
        _report(res, said, out, as_json)
    sys.exit(EXIT_OK)


@click.command("verify", short_help="Check an export against its source, bit-exact.")
@path_argument("out")
@path_option("--against", "against", required=True, help="The checkpoint OUT was exported from.")
@click.option("--strip-prefix", default=None, help="The --strip-prefix the export used.")
@click.option("--keep-prefix", is_flag=True, help="The export used --keep-prefix.")
@trust_pickles_option("Hand files with non-allowlisted pickles to the reference loaders.")
@json_option()
def verify_cmd(out, against, strip_prefix, keep_prefix, trust_pickles, as_json):
    """Compare every tensor of an export with its source, bit-exact, read by an independent
    reference path (torch DCP loader, DeepSpeed zero_to_fp32, torch.load).

    The reference loaders unpickle freely, so they only get a checkpoint ckpt-tui screened.
    A Lightning source's names lose their one LightningModule attribute prefix, as in export.
    """
    from ..core.verify import verify

    if keep_prefix and strip_prefix:
        fail("--keep-prefix and --strip-prefix contradict each other; give one", EXIT_USAGE)
    res = run_core(
        lambda **kw: verify(
            out, against, trust_pickles=trust_pickles, strip_prefix=strip_prefix, keep_prefix=keep_prefix, **kw
        ),
        as_json=as_json,
        unit="files",
        label="verifying",
    )
    if as_json:
        emit_json({"result": res.to_json()})
    else:
        mark = "✓" if res.ok else "✖"
        echo(
            f"{mark} {res.compared} tensors compared with {res.reference}: "
            f"{len(res.mismatches)} mismatched, {len(res.missing_in_output)} missing from the export"
        )
        if res.note:
            echo(f"  note: {res.note}")
        for n in res.mismatches[:20]:
            echo(f"  mismatch: {n}")
        for n in res.missing_in_output[:20]:
            echo(f"  missing: {n}")
        if res.not_in_reference:
            echo(
                f"  {len(res.not_in_reference)} exported tensor(s) the reference does not produce "
                f"(e.g. {res.not_in_reference[0]}): not checked"
            )
    sys.exit(EXIT_OK if res.ok else EXIT_FINDINGS)


@click.command("diff", short_help="Compare the weights of two checkpoints.")
@path_argument("a")
@path_argument("b")
@trust_pickles_option()
@json_option()
def diff_cmd(a, b, trust_pickles, as_json):
    """Compare the model weights of A and B (two steps, or an export and its source): tensors only
    in A, only in B, shape/dtype changes, max |a-b| per tensor. Exit 0 if identical, 1 if not."""
    from ..core.analysis import diff

    res = run_core(lambda **kw: diff(a, b, trust_pickles=trust_pickles, **kw), as_json=as_json, label="comparing")
    if as_json:
        emit_json({"result": res.to_json()})
    else:
        for n in res.only_a:
            echo(f"- only in A: {n}")
        for n in res.only_b:
            echo(f"+ only in B: {n}")
        for c in res.changed:
            echo(f"~ {c['name']}: {c['a']['dtype']}{c['a']['shape']} -> {c['b']['dtype']}{c['b']['shape']}")
        diffs = sorted(
            ((v, k) for k, v in res.max_abs.items() if v != 0), reverse=True, key=lambda x: (x[0] == x[0], x[0])
        )
        for v, k in diffs[:30]:
            echo(f"≠ {k}: max |a-b| = {v:.6g}")
        same = sum(1 for v in res.max_abs.values() if v == 0)
        echo(
            f"{same} identical, {len(diffs)} differ, {len(res.only_a)} only in A, {len(res.only_b)} only in B, "
            f"{len(res.changed)} shape/dtype changes"
        )
    sys.exit(EXIT_OK if res.identical else EXIT_FINDINGS)


@click.command("stats", short_help="Per-tensor min/max/mean/std and NaN/Inf counts.")
@path_argument()
@trust_pickles_option()
@json_option()
def stats_cmd(path, trust_pickles, as_json):
    """Per-tensor min/max/mean/std and NaN/Inf counts of the model weights, streamed with bounded
    memory — find a diverged run without loading the model. Exit 1 if any NaN/Inf."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ..core.analysis import stats
    from ..core.safetext import visible

    rows = run_core(lambda **kw: stats(path, trust_pickles=trust_pickles, **kw), as_json=as_json, label="reading")
    bad = [r for r in rows if r.nan or r.inf]
    if as_json:
        emit_json({"tensors": [r.to_json() for r in rows]}, indent=1)
    else:
        table = Table(box=None, pad_edge=False)
        for col in ("name", "dtype", "min", "max", "mean", "std", "nan", "inf"):
            table.add_column(col, justify="left" if col in ("name", "dtype") else "right")
        fmt = lambda v: "" if v is None else f"{v:.4g}"
        for r in rows:
            style = "red" if (r.nan or r.inf) else None
            table.add_row(
                Text(visible(r.name)),
                Text(visible(r.dtype)),
                fmt(r.min),
                fmt(r.max),
                fmt(r.mean),
                fmt(r.std),
                str(r.nan),
                str(r.inf),
                style=style,
            )
        Console(soft_wrap=False).print(table)
        echo(f"{len(rows)} tensors; {len(bad)} with NaN or Inf" + (f" (first: {bad[0].name})" if bad else ""))
    sys.exit(EXIT_FINDINGS if bad else EXIT_OK)
