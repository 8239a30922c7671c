"""DeepSpeed mixture of experts, written by DeepSpeed itself on CPU (`samples/ds_moe.py`): the real
``deepspeed.moe.layer.MoE`` (4 experts, top-1) on 2 ranks, expert-parallel 2 and 1, ZeRO-2 and ZeRO-1.
``layer_0_expert_{E}_mp_rank_00_model_states.pt`` beside ``mp_rank_00_model_states.pt``; the expert param group is
partitioned over the expert-data-parallel ranks only, and each rank names its LOCAL experts. zero_to_fp32 fails on
all of them, ds_to_universal on the expert-parallel ones.

Recognised with every expert counted and listed under its global name, no false finding; model and optimizer
exports bit-exact against the oracle -- a fresh DeepSpeed engine's ``load_checkpoint`` and its
``safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state`` of every parameter (each rank's experts, renamed
to global ids; dumped by the generator to ``<variant>/oracle/``, outside the checkpoint); a missing expert file is
named; `universal` and `fix` offer nothing that cannot run on MoE."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export
from ckpt_tui.core.formats.torch_save import torchfile
from ckpt_tui.core.report import inspect
from ckpt_tui.core.tensors import list_tensors
from ckpt_tui.core.verify import verify

VARIANTS = {  # variant -> (ZeRO stage, expert-parallel size, bf16)
    "ds-moe-ep2-zero2-bf16": (2, 2, True),
    "ds-moe-ep1-zero2-fp32": (2, 1, False),
    "ds-moe-ep2-zero1-bf16": (1, 2, True),
}
IDS = list(VARIANTS)
EXPERTS = [f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(4)]
PREFIX = "moe.deepspeed_moe.experts.deepspeed_experts."


def oracle(real_ckpt, variant: str) -> dict:
    """What the loaded engines held, every rank's together (each rank: the experts of its expert-parallel rank)."""
    d = real_ckpt(variant) / "oracle"
    docs = [torch.load(d / f"rank{r}.pt", weights_only=True) for r in range(2)]
    out: dict = {"masters": {}, "optim": {}, "module": {}, "steps": {o["step"] for o in docs}}
    for o in docs:
        for k in ("masters", "optim", "module"):
            out[k].update(o[k])
    return out


def assert_bit_exact(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k], w), k


def the_tag(rep):
    return next(n for n in rep.inventory.nodes() if n.format == "deepspeed-zero")


def test_the_oracle_holds_every_expert_under_its_global_name(real_ckpt):
    """The generator's renaming is what DeepSpeed's own expert files say: each expert file holds the module
    weights of its global expert, as the loaded engine had them (bf16/fp32 module weights)."""
    for variant in IDS:
        o = oracle(real_ckpt, variant)
        assert {k.split(".")[4] for k in o["masters"] if k.startswith(PREFIX)} == {"0", "1", "2", "3"}
        tag = real_ckpt(variant) / "checkpoint" / "global_step2"
        for e, name in enumerate(EXPERTS):
            sd = torch.load(tag / name, weights_only=True)
            assert sd and all(k.startswith(f"{PREFIX}{e}.") for k in sd), sd.keys()
            for k, t in sd.items():
                assert torch.equal(t, o["module"][k]), k


@pytest.mark.parametrize("variant", IDS)
def test_inspect_counts_every_expert_without_false_findings(real_ckpt, variant):
    stage, ep, bf16 = VARIANTS[variant]
    o = oracle(real_ckpt, variant)
    rep = inspect(real_ckpt(variant) / "checkpoint")
    inv = rep.inventory
    assert inv.layout == "deepspeed"
    words = f"4 experts, expert-parallel {ep}"
    assert inv.summary.startswith(f"DeepSpeed ZeRO-{stage} MoE ({'bf16, ' if bf16 else ''}{words}), 2 ranks"), (
        inv.summary
    )
    tag = the_tag(rep)
    f = tag.facts
    assert tag.role == "model+optimizer" and f["zero_stage"] == stage
    assert f["moe"] and f["num_experts"] == [4] and f["expert_parallel_size"] == ep and f["expert_files"] == 4
    assert f["world_size"] == 2 and f["partition_count"] == 2 and "partition_mismatch" not in f
    # the model the export writes: every parameter's fp32 master, every expert, and the buffer
    assert f["param_count"] == sum(t.numel() for t in o["module"].values())
    assert f["tensor_count"] == len(o["module"]) == 28
    assert f["params_trainable"] == sum(t.numel() for t in o["masters"].values())
    assert "missing_files" not in f
    for name in EXPERTS:
        c = tag.child(name)
        assert c.role == "model" and c.format == "deepspeed-model-states" and "error" not in c.facts
    codes = {(x.code, x.severity) for x in rep.findings}
    assert codes == {("universal-info-missing", "info")}, rep.findings
    (info,) = rep.findings
    # no way to another world size it cannot take: no `ckpt-tui universal`, no fix; the export it can
    assert info.fix is None and "ckpt-tui universal " not in info.message and "--only" not in info.message
    assert info.command is not None and info.command.startswith("ckpt-tui export ")
    assert "mixture-of-experts" in info.message and "exactly 2 data-parallel rank(s)" in info.message


@pytest.mark.parametrize("variant", IDS)
def test_tensors_list_every_expert_under_its_global_name(real_ckpt, variant):
    o = oracle(real_ckpt, variant)
    rep = inspect(real_ckpt(variant) / "checkpoint")
    listed = {t.name: (tuple(t.shape), t.dtype) for t in list_tensors(the_tag(rep), rep.inventory.parsed)}
    want = {k: (tuple(v.shape), "float32") for k, v in o["module"].items()}
    assert listed == want
    assert sum(math.prod(s) for s, _ in listed.values()) == the_tag(rep).facts["param_count"]


@pytest.mark.parametrize("variant", IDS)
def test_the_restricted_unpickler_reads_every_file(real_ckpt, variant):
    files = sorted((real_ckpt(variant) / "checkpoint" / "global_step2").glob("*.pt"))
    assert len(files) == 7
    for p in files:
        tf = torchfile.read(p)
        assert not tf.unsafe and tf.obj is not None, (p.name, tf.unsafe)


@pytest.mark.parametrize("variant", IDS)
def test_model_export_is_the_engines_fp32_masters(real_ckpt, tmp_path, variant):
    res = export(real_ckpt(variant) / "checkpoint", tmp_path / "out")  # trust_pickles defaults to False
    assert res.verified
    assert any("mixture of experts" in n for n in res.notes), res.notes
    got = load_file(tmp_path / "out" / "model.safetensors")
    o = oracle(real_ckpt, variant)
    want = dict(o["module"])  # the buffer, and every name
    want.update(o["masters"])  # each parameter's fp32 master (safe_get_full_fp32_param)
    assert_bit_exact(got, want)
    v = verify(tmp_path / "out", real_ckpt(variant) / "checkpoint")
    assert v.ok and v.compared == len(want) and not v.mismatches and not v.missing_in_output, v
    assert "zero_to_fp32" in v.reference and "expert-parallel" in v.reference


@pytest.mark.parametrize("variant", IDS)
def test_optimizer_export_is_the_engines_state(real_ckpt, tmp_path, variant):
    _, ep, bf16 = VARIANTS[variant]
    res = export(real_ckpt(variant) / "checkpoint", tmp_path / "out", component="optimizer")
    assert res.verified
    out = tmp_path / "out"
    got = load_file(out / "optimizer.safetensors")
    cfg = json.loads((out / "optimizer_config.json").read_text())
    o = oracle(real_ckpt, variant)
    want = dict(o["optim"])  # safe_get_full_optimizer_state(p, "exp_avg" / "exp_avg_sq")
    if bf16:
        want.update({f"{n}.master": t for n, t in o["masters"].items()})
    assert_bit_exact(got, want)
    assert cfg["states"] == ["exp_avg", "exp_avg_sq"] + (["master"] if bf16 else [])
    (step,) = o["steps"]
    assert cfg["step"] == step == 2
    groups = {g["name"]: g for g in cfg["param_groups"]}
    assert set(groups) == {"dense", f"ep_size_{ep}"} and groups[f"ep_size_{ep}"]["moe"] is True
    assert sorted(groups[f"ep_size_{ep}"]["params"]) == sorted(n for n in o["masters"] if n.startswith(PREFIX))
    names = sorted(n for g in cfg["param_groups"] for n in g["params"])
    assert names == sorted(o["masters"])
    v = verify(out, real_ckpt(variant) / "checkpoint")
    assert v.ok and v.compared == len(want) and not v.problems, v


def test_the_export_loads_into_the_model_on_one_process(real_ckpt, tmp_path):
    """The names are the module's: the model built with expert-parallel 1 (one process holds every expert, its
    local ids the global ones) takes an expert-parallel 2 export with load_state_dict(strict=True)."""
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from ckpt_tui.samples.ds_moe import TinyMoE

    export(real_ckpt("ds-moe-ep2-zero2-bf16") / "checkpoint", tmp_path / "out")
    sd = load_file(tmp_path / "out" / "model.safetensors")
    model = TinyMoE(ep_size=1)
    model.load_state_dict(sd, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_module_weights_on_request_hold_every_expert(real_ckpt, tmp_path):
    """--from-module-states: the module weights the engine computed with, each expert's from its own file."""
    res = export(real_ckpt("ds-moe-ep2-zero2-bf16") / "checkpoint", tmp_path / "out", from_module_states=True)
    assert res.verified
    o = oracle(real_ckpt, "ds-moe-ep2-zero2-bf16")
    assert_bit_exact(load_file(tmp_path / "out" / "model.safetensors"), o["module"])
    assert o["module"][f"{PREFIX}3.fc1.weight"].dtype == torch.bfloat16


def test_a_missing_expert_file_is_named_and_export_refused(real_ckpt_copy):
    from tests.util import ckpt_tui

    copy = real_ckpt_copy("ds-moe-ep2-zero2-bf16")
    (copy / "checkpoint" / "global_step2" / EXPERTS[2]).unlink()
    rep = inspect(copy / "checkpoint")
    miss = [x for x in rep.findings if x.code == "shard-missing"]
    assert len(miss) == 1 and miss[0].severity == "error" and miss[0].command is None
    assert f"{EXPERTS[2]} (expert 2 of MoE layer 0)" in miss[0].message, miss[0].message
    assert miss[0].message.count("model_states.pt") == 1  # only the file that is gone
    assert the_tag(rep).facts["missing_files"] == [EXPERTS[2]]
    assert not any(x.code in ("world-size-mismatch", "universal-info-missing") for x in rep.findings), rep.findings
    r = ckpt_tui("export", "checkpoint", "--out", "out", cwd=copy)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and EXPERTS[2] in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # the refusal and its one finding
    assert not (copy / "out").exists()


def test_a_truncated_expert_file_is_found(real_ckpt_copy, tmp_path):
    """The expert files are zip-checked like every rank file: one cut short is an error, and export refuses."""
    copy = real_ckpt_copy("ds-moe-ep2-zero2-bf16") / "checkpoint"
    f = copy / "global_step2" / EXPERTS[1]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    rep = inspect(copy)
    bad = [x for x in rep.findings if x.severity == "error"]
    assert [(x.code, x.path.rsplit("/", 1)[-1]) for x in bad] == [("file-truncated", EXPERTS[1])], rep.findings
    with pytest.raises(Exception, match="file-truncated"):
        export(copy, tmp_path / "out")


@pytest.mark.parametrize("variant", ["ds-moe-ep2-zero2-bf16", "ds-moe-ep1-zero2-fp32"])
def test_universal_is_refused_with_the_reason(real_ckpt, tmp_path, variant):
    from ckpt_tui.core.convert.universal.plan import UniversalError, universal_plan

    with pytest.raises(UniversalError, match="MoE checkpoints .* ds_to_universal fails on expert-parallel ones"):
        universal_plan(real_ckpt(variant) / "checkpoint", tmp_path / "uni")


def test_fix_offers_nothing(real_ckpt):
    from ckpt_tui.core.repair.repairs import repairs_for
    from tests.util import ckpt_tui

    for variant in IDS:
        assert repairs_for(inspect(real_ckpt(variant) / "checkpoint")) == [], variant
    ck = real_ckpt("ds-moe-ep2-zero2-bf16")
    r = ckpt_tui("fix", "checkpoint", "--dry-run", cwd=ck)
    assert r.returncode == 0 and "nothing to repair" in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert "model_states" not in r.stdout + r.stderr


@pytest.mark.parametrize("data_before", [False, True])
@pytest.mark.parametrize(("world", "ep"), [(2, 1), (2, 2), (4, 2), (8, 2), (8, 4), (16, 8)])
def test_expert_ranks_are_deepspeeds_groups(world, ep, data_before):
    """Which ranks hold which expert-parallel rank's experts, and in which partition order: the groups DeepSpeed's
    own rule builds (utils/groups.py, model and pipeline parallel 1), for both topologies."""
    from deepspeed.utils.groups import _get_expert_parallel_ranks

    from ckpt_tui.core.formats.deepspeed.moe import edp_ranks, ep_rank

    ep_groups, edp_groups = _get_expert_parallel_ranks(world, 1, ep, 1, data_before)
    for r in range(world):
        (group,) = [g for g in ep_groups if r in g]
        assert ep_rank(r, ep, world, data_before) == group.index(r)
    assert sorted(edp_ranks(e, ep, world, data_before) for e in range(ep)) == sorted(edp_groups)
    for e in range(ep):
        assert all(ep_rank(r, ep, world, data_before) == e for r in edp_ranks(e, ep, world, data_before))


def test_zero_to_fp32_rejects_them(real_ckpt):
    """Why ckpt-tui reads these itself: DeepSpeed's own converter fails on each (it takes the expert files for
    model-states files)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for variant in IDS:
        with pytest.raises(BaseException):
            get_fp32_state_dict_from_zero_checkpoint(str(real_ckpt(variant) / "checkpoint"))
