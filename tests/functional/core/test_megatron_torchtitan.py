"""Megatron-Core ``torch_dist`` and torchtitan checkpoints written by the frameworks themselves
(samples/megatron_dist.py: ``dist_checkpointing.save`` of a TP=2 GPTModel; samples/torchtitan_ckpt.py:
``CheckpointManager.save``), inspected without --trust-pickles and exported bit-exact against their oracles:
megatron-core's own ``dist_checkpointing.load`` on one rank (``oracle/``, made in the framework's venv) and
torch's ``dcp_to_torch_save`` for torchtitan (torch alone reads it: no framework needed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.formats.dcp import reader as dcpfmt
from ckpt_tui.core.formats.unpickle import Record, safe_loads
from ckpt_tui.core.report import inspect


def codes(rep) -> set[str]:
    return {f.code for f in rep.findings}


def node(rep, path: str):
    return rep.inventory.root.find(path)


# ---------------------------------------------------------------- Megatron-Core torch_dist


def test_megatron_metadata_and_common_state_read_as_data(real_ckpt):
    """.metadata holds every rank's save plan (SavePlan/WriteItem/TensorWriteData), common.pt the args: all inert data
    to the restricted unpickler, nothing outside the allowlist."""
    it = real_ckpt("megatron-dist") / "checkpoints/iter_0000010"
    up = safe_loads((it / ".metadata").read_bytes())
    assert up.unsafe == set()
    plans = up.obj.__dict__["all_local_plans"]
    assert len(plans) == 2 and all(isinstance(p, Record) for p in plans)  # one per rank
    items = plans[0].__dict__["items"]
    assert items and type(items[0]).__name__ == "WriteItem"
    with zipfile.ZipFile(it / "common.pt") as zf:
        pkl = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        common = safe_loads(zf.read(pkl), persistent=True)
    assert common.unsafe == set() and common.obj["iteration"] == 10
    assert common.obj["args"].__dict__["tensor_model_parallel_size"] == 2


# megatron-core 0.16 (common.pt beside .metadata) and 0.19 (no common.pt: the common state is a DCP entry), each with
# TP=2, PP=2 on 2 ranks and TP=2 x PP=2 on 4: variant -> (tensor parallel, pipeline parallel, ranks)
PARALLEL = {
    "megatron-dist": (2, 1, 2),
    "megatron-dist-019": (2, 1, 2),
    "megatron-pp2": (1, 2, 2),
    "megatron-tp2pp2": (2, 2, 4),
    "megatron-pp2-016": (1, 2, 2),
    "megatron-tp2pp2-016": (2, 2, 4),
}
MEGATRON = list(PARALLEL)
V016 = {"megatron-dist", "megatron-pp2-016", "megatron-tp2pp2-016"}  # the rest by 0.19


@pytest.mark.parametrize("variant", MEGATRON)
def test_megatron_inspect(real_ckpt, variant):
    rep = inspect(real_ckpt(variant) / "checkpoints")
    inv = rep.inventory
    assert inv.layout == "megatron-dist" and inv.framework == "Megatron-Core (torch_dist)"
    assert inv.components == {"model": "iter_0000010"}
    tp, pp, ranks = PARALLEL[variant]
    sizes = f"TP={tp}" + (f", PP={pp}" if pp > 1 else "")
    assert inv.summary.startswith(
        f"Megatron-Core (torch_dist), {sizes}, {ranks} ranks, step 10: model in `iter_0000010/`"
    )
    assert "unsafe-pickle" not in codes(rep)  # Megatron-LM's args: a torch dtype and an enum, read as data
    assert not [f for f in rep.findings if f.severity in ("error", "warning")], rep.findings
    facts = node(rep, "iter_0000010").facts
    assert facts["tensor_parallel"] == tp and facts["stacked_layers"] == 2 and facts["world_size"] == ranks
    assert facts.get("pipeline_parallel", 1) == pp
    assert "unsafe_globals" not in facts
    info = [f for f in rep.findings if f.code == "megatron-common-state"]
    if variant in V016:
        assert node(rep, "iter_0000010/common.pt").role == "metadata"  # the shared state (args, iteration), no weights
        assert not info and "common_state" not in facts  # any megatron-core loads a 0.16 save
    else:  # no false megatron-files-missing: 0.19's loader takes the common_state/ entry (dist_checkpointing.load
        # of this very folder is the oracle of the export test below)
        assert node(rep, "iter_0000010/common.pt") is None and facts["common_state"] is True
        # but megatron-core <= 0.18 cannot load it (it reads common.pt only): an info, with what does load it
        assert [(f.severity, f.path, f.fix) for f in info] == [("info", "iter_0000010", "export")]
        assert "0.18 and older cannot load it" in info[0].message and "0.19 or later" in info[0].message
        assert f"`{info[0].command}`" in info[0].message and info[0].command.startswith("ckpt-tui export ")


@pytest.mark.parametrize("variant", MEGATRON)
def test_megatron_sizes_without_megatron_lm_args(real_ckpt, variant, monkeypatch):
    """A plain megatron-core (or NeMo) save has no Megatron-LM args in its common state: TP from the chunk offsets
    along the split weight dimension, right for TP-only, PP-only and TP x PP; PP unknown, never guessed (every layer is
    its own chunk whichever stage holds it). The args are taken away at the function that reads them."""
    from ckpt_tui.core.formats.dcp import format as dcp_format

    monkeypatch.setattr(dcp_format, "_megatron_args", lambda node, common_key: ({}, []))
    rep = inspect(real_ckpt(variant) / "checkpoints")
    tp, _, ranks = PARALLEL[variant]
    facts = node(rep, "iter_0000010").facts
    assert facts["tensor_parallel"] == tp and facts["pipeline_parallel"] is None
    assert rep.inventory.summary.startswith(f"Megatron-Core (torch_dist), TP={tp}, PP unknown, {ranks} ranks, step 10")
    assert not [f for f in rep.findings if f.severity in ("error", "warning")], rep.findings
    it = real_ckpt(variant) / "checkpoints/iter_0000010"
    assert dcpfmt.megatron_tensor_parallel(dcpfmt.read(it)) == tp  # the reader alone, on the real .metadata


def test_a_0_16_save_without_common_pt_is_still_refused(real_ckpt, tmp_path):
    """Where the common state is neither common.pt nor a DCP entry (a 0.16 save that lost its common.pt), megatron
    cannot load it: the error stays."""
    d = tmp_path / "checkpoints"
    shutil.copytree(real_ckpt("megatron-dist") / "checkpoints", d)
    os.remove(d / "iter_0000010/common.pt")
    assert "megatron-files-missing" in codes(inspect(d))


def _megatron_oracle(root):
    """megatron's own load (TP=1, one rank) with, for each of the model's names, the checkpoint key and layer."""
    ref = torch.load(root / "oracle/model.pt", weights_only=True)
    keys = json.loads((root / "oracle/keys.json").read_text())
    return ref, keys


@pytest.mark.parametrize("variant", MEGATRON)
@pytest.mark.parametrize("sub", ["checkpoints", "checkpoints/iter_0000010"])
def test_megatron_export_equals_dist_checkpointing_load(real_ckpt, tmp_path, sub, variant):
    """Stacked layer tensors (decoder.layers.X with a leading layer dim) and TP shards come out whole, one tensor per
    layer named decoder.layers.{i}.X — each bit-exact against what dist_checkpointing.load gave megatron's model."""
    root = real_ckpt(variant)
    res = export(root / sub, tmp_path / "out")
    assert res.verified
    assert any("12 tensors stacked over the layers" in n for n in res.notes), res.notes
    ours = load_file(tmp_path / "out" / "model.safetensors")
    ref, keys = _megatron_oracle(root)
    assert len(ours) == len(ref) == 29
    seen = set()
    for name, (key, layer) in keys.items():
        m = re.match(r"^(decoder\.layers\.)(.+)$", key)
        ours_name = key if layer is None else f"{m.group(1)}{layer}.{m.group(2)}"
        t = ours[ours_name]
        assert t.dtype == ref[name].dtype and torch.equal(t, ref[name]), name
        seen.add(ours_name)
    assert seen == set(ours)
    # the names are the checkpoint's: megatron's local layer spec loads input_layernorm from the TE-spec key
    assert keys["decoder.layers.1.input_layernorm.weight"] == [
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
        1,
    ]
    assert "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight" in ours
    # `ckpt-tui verify OUT --against SRC`: torch's own DCP loader, the stacks sliced the same way
    from ckpt_tui.core.verify import verify

    v = verify(tmp_path / "out", root / sub)
    assert v.ok and v.compared == 29 and not v.mismatches and not v.missing_in_output and not v.not_in_reference


def test_megatron_missing_rank_file(real_ckpt, tmp_path):
    d = tmp_path / "checkpoints"
    shutil.copytree(real_ckpt("megatron-dist") / "checkpoints", d)
    os.remove(d / "iter_0000010/__1_1.distcp")  # one of rank 1's two files
    rep = inspect(d)
    miss = [f for f in rep.findings if f.code == "shard-missing"]
    assert miss and "__1_1.distcp" in miss[0].message and miss[0].path == "iter_0000010"


@pytest.mark.parametrize("variant", ["megatron-dist-019", "megatron-tp2pp2"])
def test_megatron_019_missing_tp_rank_file(real_ckpt, tmp_path, variant):
    """megatron-core 0.19 writes one file per rank: without rank 1's (tensor-parallel rank 1 of the first stage) half
    of every split weight is gone: shard-missing, export refused, and the info offers no export."""
    d = tmp_path / "checkpoints"
    shutil.copytree(real_ckpt(variant) / "checkpoints", d)
    os.remove(d / "iter_0000010/__1_0.distcp")
    rep = inspect(d)
    miss = [f for f in rep.findings if f.code == "shard-missing"]
    assert [(f.severity, f.path) for f in miss] == [("error", "iter_0000010")] and "__1_0.distcp" in miss[0].message
    assert "megatron-files-missing" not in codes(rep)  # metadata.json and the common_state/ entry are there
    info = [f for f in rep.findings if f.code == "megatron-common-state"]
    assert info and info[0].command is None and info[0].fix is None
    with pytest.raises(ExportError, match="shard-missing"):
        export(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_megatron_files_of_another_world_size(real_ckpt, tmp_path):
    d = tmp_path / "iter_0000010"
    shutil.copytree(real_ckpt("megatron-dist") / "checkpoints/iter_0000010", d)
    shutil.copy(d / "__1_0.distcp", d / "__2_0.distcp")  # a rank 2 of an earlier, larger save
    rep = inspect(d)
    assert "world-size-mismatch" in codes(rep)


# ---------------------------------------------------------------- torchtitan CheckpointManager


def test_torchtitan_run_full_and_model_only(real_ckpt):
    run = real_ckpt("torchtitan") / "checkpoint"
    rep = inspect(run)
    inv = rep.inventory
    assert inv.layout == "run-folder"
    assert [(c["path"], c["step"], c["layout"]) for c in inv.checkpoints] == [
        ("step-2", 2, "torchtitan"),
        ("step-1", 1, "torchtitan"),
    ]
    assert "unsafe-pickle" not in codes(rep)
    # each checkpoint of the run names its framework (the details pane's framework row)
    assert {inv.node(c).framework for c in ("step-1", "step-2")} == {"torchtitan"}
    meg = inspect(real_ckpt("megatron-dist")).inventory  # the run folder above megatron's checkpoints/
    assert meg.node("checkpoints/iter_0000010").framework == "Megatron-Core (torch_dist)"
    full = inspect(run / "step-1")
    assert full.inventory.framework == "torchtitan"
    assert full.inventory.components == {"model": ".", "optimizer": "."}
    assert full.inventory.summary.startswith("torchtitan, 2 ranks, step 1: model and optimizer in this folder")
    conts = set(full.inventory.root.facts["containers"])
    # the model's keys flattened at the top level (one container each) beside the Stateful components
    assert {"optimizer", "lr_scheduler", "dataloader", "train_state", "tok_embeddings.weight"} <= conts
    last = inspect(run / "step-2")
    assert last.inventory.components == {"model": "."}
    assert last.inventory.root.facts["dtypes"] == ["bfloat16"]  # export_dtype of the last, model-only save


@pytest.mark.parametrize("step,dtype", [("step-1", torch.float32), ("step-2", torch.bfloat16)])
def test_torchtitan_export_equals_dcp_to_torch_save(real_ckpt, tmp_path, step, dtype):
    """The Llama3 model's FQNs (torchtitan's model state dict: fused wqkv saved as wq/wk/wv), dtype as stored."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = real_ckpt("torchtitan") / "checkpoint" / step
    res = export(src, tmp_path / "out")
    assert res.verified
    dcp_to_torch_save(src, tmp_path / "ref.pt")
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)
    model = {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)}  # the top-level keys: the model's
    ours = load_file(tmp_path / "out" / "model.safetensors")
    assert set(ours) == set(model) and "layers.0.attention.qkv_linear.wq.weight" in ours
    for k, v in model.items():
        assert ours[k].dtype == v.dtype == dtype and torch.equal(ours[k], v), k


def test_torchtitan_missing_rank_file(real_ckpt, tmp_path):
    d = tmp_path / "step-1"
    shutil.copytree(real_ckpt("torchtitan") / "checkpoint/step-1", d)
    os.remove(d / "__1_0.distcp")
    rep = inspect(d)
    assert "shard-missing" in codes(rep)
    assert dcpfmt.read(d).unsafe == set()


# ---------------------------------------------------------------- the TUI shows them


@pytest.mark.parametrize(
    "variant,sub,expect,child",
    [
        ("megatron-dist", "checkpoints", "Megatron-Core (torch_dist), TP=2, 2 ranks, step 10", "iter_0000010/"),
        ("torchtitan", "checkpoint", "torchtitan, 2 ranks, step 2", "step-1/"),
    ],
)
async def test_tui_shows_framework_and_layout(real_ckpt, variant, sub, expect, child):
    from ckpt_tui.ui.app import make_app
    from tests.functional.ui.test_app import wait_for

    app = make_app(real_ckpt(variant) / sub)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        summary = str(app.query_one("#summary").render())
        assert expect in " ".join(summary.split()), summary
        labels = {str(n.label) for n in app.query_one("#tree").root.children}
        assert any(child in label for label in labels), labels
        assert "unsafe-pickle" not in {f.code for f in app.report.findings}


def test_torchtitan_optimizer_export_equals_dcp_to_torch_save(real_ckpt, tmp_path):
    """--component optimizer on the full save (main's DCP optimizer source): torchtitan flattens its optimizer state
    to ``optimizer.state.<fqn>.<state>`` (the fused ``wqkv`` parameter's fqn: the model's wq/wk/wv split is a
    state-dict hook of the model only), every exp_avg/exp_avg_sq bit-exact against torch's own dcp_to_torch_save."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = real_ckpt("torchtitan") / "checkpoint/step-1"
    export(src, tmp_path / "out", component="optimizer")
    ours = load_file(tmp_path / "out" / "optimizer.safetensors")
    dcp_to_torch_save(src, tmp_path / "ref.pt")
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)["optimizer"]
    states = {
        k.removeprefix("state."): v
        for k, v in ref.items()
        if k.startswith("state.") and k.endswith((".exp_avg", ".exp_avg_sq"))
    }
    assert states and set(states) == set(ours)
    for k, v in states.items():
        assert ours[k].dtype == v.dtype and torch.equal(ours[k], v), k
    config = json.loads((tmp_path / "out" / "optimizer_config.json").read_text())
    assert config["step"] == 1 and "layers.0.attention.qkv_linear.wqkv.weight" in config["param_groups"][0]["params"]


def test_megatron_rank0_files_missing(real_ckpt, tmp_path):
    """Without common.pt megatron's dist_checkpointing.load fails (FileNotFoundError), without metadata.json it says
    "is not a distributed checkpoint" (both seen in megatron-core 0.16's venv)."""
    d = tmp_path / "checkpoints"
    shutil.copytree(real_ckpt("megatron-dist") / "checkpoints", d)
    os.remove(d / "iter_0000010/common.pt")
    rep = inspect(d)
    f = [f for f in rep.findings if f.code == "megatron-files-missing"]
    assert f and f[0].severity == "error" and f[0].path == "iter_0000010" and "without common.pt" in f[0].message
    with pytest.raises(ExportError, match="megatron-files-missing"):  # an error finding: no export of it
        export(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", ["megatron-dist-019", "megatron-tp2pp2"])
def test_an_interrupted_0_19_save_copied_alone(real_ckpt, tmp_path, variant):
    """megatron-core 0.19 writes metadata.json last: an iter_N/ without it and with no tracker beside it is an
    interrupted save, megatron's by its common_state/ entry. The error says so (never asks for common.pt, which 0.19
    does not write), and export is refused as for 0.16."""
    d = tmp_path / "iter_0000010"
    shutil.copytree(real_ckpt(variant) / "checkpoints/iter_0000010", d)
    os.remove(d / "metadata.json")
    rep = inspect(d)
    assert rep.inventory.framework == "Megatron-Core (torch_dist)"
    f = [f for f in rep.findings if f.code == "megatron-files-missing"]
    assert [(x.severity, x.path) for x in f] == [("error", ".")], rep.findings
    assert "without metadata.json" in f[0].message and "writes it last" in f[0].message
    assert "did not finish" in f[0].message and "common.pt" not in f[0].message
    assert "megatron-common-state" not in codes(rep)
    with pytest.raises(ExportError, match="megatron-files-missing"):
        export(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # in its run (the tracker beside it) the same message: 0.19 is not asked for common.pt either
    run = tmp_path / "run"
    shutil.copytree(real_ckpt(variant) / "checkpoints", run)
    os.remove(run / "iter_0000010/metadata.json")
    f = [f for f in inspect(run).findings if f.code == "megatron-files-missing"]
    assert f and "writes it last" in f[0].message and "common.pt" not in f[0].message


def test_a_0_19_common_state_naming_code_is_unsafe_pickle_and_never_runs(real_ckpt, tmp_path):
    """megatron's own loader unpickles 0.19's common_state/ entry: one whose pickle names code is an unsafe-pickle
    error here (read through the allowlist, nothing run), not a silently unread entry."""
    import io
    import pickle
    import subprocess

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    d = tmp_path / "checkpoints"
    shutil.copytree(real_ckpt("megatron-dist-019") / "checkpoints", d)
    it = d / "iter_0000010"
    meta = pickle.loads((it / ".metadata").read_bytes())  # our own fixture, torch's classes
    index = next(i for i in meta.storage_data if i.fqn.startswith("common_state/"))
    st = meta.storage_data[index]
    blob = io.BytesIO()
    torch.save([{"iteration": 10, "args": Evil()}], blob)
    shard = it / st.relative_path
    st.offset, st.length = shard.stat().st_size, len(blob.getvalue())
    with open(shard, "ab") as f:
        f.write(blob.getvalue())
    (it / ".metadata").write_bytes(pickle.dumps(meta))
    rep = inspect(d)
    hits = [f for f in rep.findings if f.code == "unsafe-pickle"]
    assert hits and any(".call" in f.message for f in hits), rep.findings
    assert not marker.exists()
