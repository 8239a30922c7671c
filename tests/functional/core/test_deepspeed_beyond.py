"""DeepSpeed beyond ZeRO-1/2/3, written by DeepSpeed itself on CPU (`samples/ds_beyond.py`): ZeRO stage 0
with bf16 (FP16_UnfusedOptimizer) and fp32 (the plain torch optimizer), BF16_Optimizer (ZeRO-1 + bf16 + fp32
gradient accumulation) and a 2-stage PipelineModule. DeepSpeed's zero_to_fp32 rejects all four.

Recognised and named, model and optimizer shown, no false missing-rank finding (stage 0 writes no
*_optim_states.pt), a real one where a pipeline file is gone; model and optimizer exports bit-exact against
the oracle: a fresh DeepSpeed engine's ``load_checkpoint`` of the same checkpoint and its fp32 masters and Adam
state (dumped by the generator to ``<variant>/oracle/``, outside the checkpoint) -- without --trust-pickles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export
from ckpt_tui.core.formats.torch_save import torchfile
from ckpt_tui.core.report import inspect

VARIANTS = {  # variant -> (layout words, optimizer class, data-parallel ranks, fp32 masters apart from the weights)
    "ds-zero0-bf16": ("ZeRO stage 0", "FP16_UnfusedOptimizer", 2, True),
    "ds-zero0-fp32": ("ZeRO stage 0", "torch optimizer (no DeepSpeed wrapper)", 2, False),
    "ds-bf16-optimizer": ("BF16_Optimizer (ZeRO-1)", "BF16_Optimizer", 2, True),
    "ds-pipeline": ("pipeline parallel, 2 stages", "torch optimizer (no DeepSpeed wrapper)", 1, False),
}
IDS = list(VARIANTS)


def oracle(real_ckpt, variant: str) -> list[dict]:
    """What the loaded engine held, per rank that wrote it (the pipeline: one file per stage)."""
    d = real_ckpt(variant) / "oracle"
    return [torch.load(p, weights_only=True) for p in sorted(d.glob("rank*.pt"))]


def assert_bit_exact(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k], w), k


@pytest.mark.parametrize("variant", IDS)
def test_inspect_names_the_layout_without_false_findings(real_ckpt, variant):
    words, opt_class, dp, _ = VARIANTS[variant]
    rep = inspect(real_ckpt(variant) / "checkpoint")
    inv = rep.inventory
    assert inv.layout == "deepspeed"
    assert inv.summary.startswith(f"DeepSpeed {words}"), inv.summary
    assert "model and optimizer in `global_step2/`" in inv.summary
    assert inv.framework == "deepspeed" or "DeepSpeed" in str(inv.framework)
    tag = next(n for n in inv.nodes() if n.format == "deepspeed-zero")
    f = tag.facts
    assert tag.role == "model+optimizer"
    assert f["optimizer_class"] == opt_class and f["dp_world_size"] == dp
    assert f.get("param_count", 0) > 60_000 and f.get("tensor_bytes", 0) > 0 and "float32" in f["dtypes"]
    assert "missing_files" not in f
    codes = {x.code for x in rep.findings}
    # stage 0 and pipelines write no *_optim_states.pt; no ds_to_universal advice it would fail on
    assert not codes & {"shard-missing", "world-size-mismatch", "universal-info-missing", "unsafe-pickle"}, rep.findings
    if variant == "ds-pipeline":
        assert f["pipeline_stages"] == 2 and f["layer_files"] == 5 and f["world_size"] == 2
        roles = {n.name: n.role for n in tag.children}  # the stages' files hold their optimizers, no weights
        assert roles["layer_00-model_states.pt"] == "model" and roles["mp_rank_01_model_states.pt"] == "optimizer"
    if variant.startswith("ds-zero0"):
        assert tag.child("mp_rank_00_model_states.pt").role == "model+optimizer"
    if variant == "ds-bf16-optimizer":
        roles = {n.name: n.role for n in tag.children}
        assert roles["bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"] == "optimizer"


@pytest.mark.parametrize("variant", IDS)
def test_the_restricted_unpickler_reads_every_file(real_ckpt, variant):
    files = sorted((real_ckpt(variant) / "checkpoint" / "global_step2").glob("*.pt"))
    assert files
    for p in files:
        tf = torchfile.read(p)
        assert not tf.unsafe and tf.obj is not None, (p.name, tf.unsafe)


@pytest.mark.parametrize("variant", IDS)
def test_model_export_is_the_engines_fp32_masters(real_ckpt, tmp_path, variant):
    res = export(real_ckpt(variant) / "checkpoint", tmp_path / "out")  # trust_pickles defaults to False
    assert res.verified
    got = load_file(tmp_path / "out" / "model.safetensors")
    want: dict = {}
    for o in oracle(real_ckpt, variant):
        want.update(o["module"])  # buffers, and the fp32 weights where they are the masters
        want.update(o["masters"])  # FP16_UnfusedOptimizer / BF16_Optimizer: the fp32 master of each parameter
    assert_bit_exact(got, want)
    if variant == "ds-pipeline":  # PipelineModule's own names: <layer index>.<parameter>
        assert "0.weight" in got and "2.fc1.weight" in got and "4.weight" in got
    # `ckpt-tui verify` against the source: zero_to_fp32 rejects these, so its reference is torch.load of the
    # files (BF16_Optimizer: zero_to_fp32's own ZeRO-1/2 reconstruction, past its zero_stage check)
    from ckpt_tui.core.verify import verify

    v = verify(tmp_path / "out", real_ckpt(variant) / "checkpoint")
    assert v.ok and v.compared == len(want) and not v.mismatches and not v.missing_in_output, v
    assert "zero_to_fp32" not in v.reference or variant == "ds-bf16-optimizer"


@pytest.mark.parametrize("variant", IDS)
def test_optimizer_export_is_the_engines_state(real_ckpt, tmp_path, variant):
    _, opt_class, _, masters = VARIANTS[variant]
    res = export(real_ckpt(variant) / "checkpoint", tmp_path / "out", component="optimizer")
    assert res.verified
    out = tmp_path / "out"
    got = load_file(out / "optimizer.safetensors")
    cfg = json.loads((out / "optimizer_config.json").read_text())
    want: dict = {}
    steps = set()
    for o in oracle(real_ckpt, variant):
        want.update(o["optim"])
        if masters:
            want.update({f"{n}.master": t for n, t in o["masters"].items()})
        steps.add(o["step"])
    assert_bit_exact(got, want)
    assert cfg["optimizer_class"] == opt_class
    assert cfg["states"] == ["exp_avg", "exp_avg_sq"] + (["master"] if masters else [])
    (step,) = steps
    assert cfg["step"] == step  # FP16_UnfusedOptimizer counts one more: it steps once with zero grads at start
    names = sorted(n for g in cfg["param_groups"] for n in g["params"])
    assert names == sorted({k.rsplit(".", 1)[0] for k in got})
    from ckpt_tui.core.verify import verify

    v = verify(out, real_ckpt(variant) / "checkpoint")
    assert v.ok and v.compared == len(want) and not v.problems, v


def test_zero_to_fp32_rejects_them(real_ckpt):
    """Why ckpt-tui reads these itself: DeepSpeed's own converter refuses each."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for variant in IDS:
        with pytest.raises(BaseException):
            get_fp32_state_dict_from_zero_checkpoint(str(real_ckpt(variant) / "checkpoint"))


@pytest.mark.parametrize(
    "gone",
    [
        "mp_rank_00_model_states.pt",
        "mp_rank_01_model_states.pt",
        "layer_02-model_states.pt",
        "layer_04-model_states.pt",
    ],
)
def test_a_missing_pipeline_file_is_reported(real_ckpt_copy, gone):
    copy = real_ckpt_copy("ds-pipeline") / "checkpoint"
    (copy / "global_step2" / gone).unlink()
    rep = inspect(copy)
    miss = [x for x in rep.findings if x.code == "shard-missing"]
    assert len(miss) == 1 and miss[0].severity == "error"
    want = gone if gone != "layer_04-model_states.pt" else "layer_04-model_states.pt (or later"
    assert want in miss[0].message and "pipeline of" in miss[0].message or gone == "mp_rank_00_model_states.pt"
    assert want in miss[0].message, miss[0].message
    assert miss[0].message.count("model_states.pt") == 1  # only the file that is gone
    with pytest.raises(Exception):
        export(copy, copy.parent / "out")


def test_stage0_findings_never_ask_for_optim_states(real_ckpt_copy):
    """A stage-0 tag whose model states are gone: the missing file named is the model states, never the
    *_optim_states.pt files stage 0 does not write."""
    copy = real_ckpt_copy("ds-zero0-bf16") / "checkpoint"
    ms = copy / "global_step2" / "mp_rank_00_model_states.pt"
    ms.write_bytes(ms.read_bytes()[: ms.stat().st_size // 2])  # truncated by an interrupted save
    rep = inspect(copy)
    assert not any("optim_states" in x.message for x in rep.findings)
    assert any(x.severity == "error" for x in rep.findings)


def test_stage0_module_weights_on_request(real_ckpt, tmp_path):
    """--from-module-states: the bf16 weights the engine computed with (stage 0 records no param_shapes)."""
    res = export(real_ckpt("ds-zero0-bf16") / "checkpoint", tmp_path / "out", from_module_states=True)
    assert res.verified and any("NOT the fp32 master weights" in n for n in res.notes)
    (o,) = oracle(real_ckpt, "ds-zero0-bf16")
    assert_bit_exact(load_file(tmp_path / "out" / "model.safetensors"), o["module"])
    assert o["module"]["embed_tokens.weight"].dtype == torch.bfloat16


def test_universal_conversion_is_refused_with_the_reason(real_ckpt, tmp_path):
    """ds_to_universal fails on all four: `ckpt-tui universal` says so before running it."""
    from ckpt_tui.core.convert.universal.plan import UniversalError, universal_plan

    for variant, why in (
        ("ds-zero0-bf16", "stage 0"),
        ("ds-bf16-optimizer", "BF16_Optimizer"),
        ("ds-pipeline", "pipeline"),
    ):
        with pytest.raises(UniversalError, match=why):
            universal_plan(real_ckpt(variant) / "checkpoint", tmp_path / variant)


def test_printed_load_code_loads_each_export(real_ckpt, tmp_path):
    """`ckpt-tui export` from the folder holding the checkpoint, its "Load it with" code run as printed: every
    tensor loads into the model (the pipeline's: its layers in one nn.Sequential, whose names they are)."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.snippets import run_load_snippets, snippet_after

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    cases = []
    for variant in IDS:
        shutil.copytree(real_ckpt(variant) / "checkpoint", tmp_path / variant)
        r = subprocess.run(
            ["ckpt-tui", "export", variant, "--out", f"{variant}-out"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        cases.append((snippet_after(r.stdout), tmp_path, variant))
    run_load_snippets(cases)


def test_a_zero2_tag_without_its_optim_files_is_not_taken_for_stage_0(real_ckpt_copy):
    """Stage 0 is recognised by what DeepSpeed saved (the optimizer inside the model states, ds_config stage 0),
    never by the absence of *_optim_states.pt: a ZeRO-2 tag that lost them still reports them missing."""
    from ckpt_tui.core.formats.deepspeed.source import tag_source

    tag = real_ckpt_copy("ds-zero2-bf16") / "global_step2"
    for f in tag.glob("*_optim_states.pt"):
        f.unlink()
    with pytest.raises(ValueError, match="no \\*_optim_states.pt"):
        tag_source(tag)
    rep = inspect(tag.parent)
    miss = [x for x in rep.findings if x.code == "shard-missing"]
    assert miss and "optim_states.pt" in miss[0].message and "ZeRO-2" in rep.inventory.summary
