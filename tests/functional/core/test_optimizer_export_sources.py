"""`ckpt-tui export --component optimizer` of torch DCP optimizer folders (HF Trainer/Accelerate FSDP
`optimizer_0/`, FSDP2 `get_state_dict` saves) and of torch files (Lightning `.ckpt`, plain torch.save,
Accelerate `optimizer.bin`), bit-exact against torch's own readers: `dcp_to_torch_save` of the DCP,
`torch.load(weights_only=True)` of the file. Names as the model export of the same checkpoint has them;
index-keyed state named only where the model's parameters line up with it, else `param_<i>`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export, export_needs, optimizer_exportable, plan_export
from ckpt_tui.core.report import inspect
from ckpt_tui.core.verify import verify
from tests.util import ckpt_tui, load_optimizer_export

ROOT = Path(__file__).resolve().parents[3]


def check_against(sd: dict, cfg: dict, ref_opt: dict, names_of) -> None:
    """Every exported tensor equals torch's, every tensor torch has is exported, under
    ``names_of(key of ref_opt["state"])``; the step and each group's hyper-parameters as saved."""
    want = {}
    for key, st in ref_opt["state"].items():
        for leaf, t in st.items():
            if leaf != "step" and isinstance(t, torch.Tensor):
                want[f"{names_of(key)}.{leaf}"] = t
    assert sorted(sd) == sorted(want) and len(sd) >= 20
    for k, t in want.items():
        assert sd[k].dtype == t.dtype and torch.equal(sd[k], t), k
    assert any(v.abs().sum() > 0 for k, v in sd.items() if k.endswith(".exp_avg_sq"))  # trained
    steps = {float(st["step"]) for st in ref_opt["state"].values()}
    assert steps == {cfg["step"]} and cfg["step"] in (1, 2, 20)  # the demo trains 20 steps; torchtitan saves at 1
    assert len(cfg["param_groups"]) == len(ref_opt["param_groups"])
    for got, ref in zip(cfg["param_groups"], ref_opt["param_groups"]):
        for k in ("lr", "eps", "weight_decay"):
            assert got[k] == ref[k]
        assert got["betas"] == list(ref["betas"]) and got["step"] == cfg["step"]
        assert got["params"] == [names_of(p) for p in ref["params"]]


# (fixture, what SRC is inside it, the optimizer DCP folder inside SRC)
DCP_CASES = [
    ("hf-fsdp1", ".", "checkpoint-2/optimizer_0"),
    ("hf-fsdp2", ".", "checkpoint-2/optimizer_0"),
    ("dcp-mixed", ".", "optimizer"),
    ("dcp-mixed", "combined", "."),
    ("fsdp2-dcp", ".", "."),
    ("fsdp2-zstd", ".", "."),  # zstd-compressed items, hyper-parameters among them
    ("demo", "fsdp-trainer-run", "checkpoint-20/optimizer_0"),
    ("torchtitan", "checkpoint/step-1", "."),  # a flattened optimizer state dict: state.<fqn>.exp_avg as one key
    ("lightning-fsdp", ".", "checkpoints/epoch=0-step=2.ckpt"),
]  # one DCP holds model and optimizer_0


def unflatten(opt: dict) -> dict:
    """torchtitan's flattened optimizer state dict (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``) in
    the usual form: parameters whose hyper-parameters are equal share a group."""
    if "state" in opt:
        return opt
    state, hyper = {}, {}
    for k, v in opt.items():
        what, rest = k.split(".", 1)
        fqn, leaf = rest.rsplit(".", 1)
        (state if what == "state" else hyper).setdefault(fqn, {})[leaf] = v
    groups: dict[str, dict] = {}
    for fqn, h in hyper.items():
        groups.setdefault(repr(sorted(h.items())), h | {"params": []})["params"].append(fqn)
    return {"state": state, "param_groups": list(groups.values())}


@pytest.mark.parametrize("fixture,src,dcp", DCP_CASES, ids=[f"{c[0]}/{c[1]}" for c in DCP_CASES])
def test_dcp_matches_dcp_to_torch_save(real_ckpt, tmp_path, fixture, src, dcp):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = real_ckpt(fixture) / src
    res = export(src, tmp_path / "out", component="optimizer")
    assert res.verified and res.files == ["optimizer.safetensors"]
    assert sorted(os.listdir(tmp_path / "out")) == ["optimizer.safetensors", "optimizer_config.json"]
    sd = load_optimizer_export(tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "optimizer_config.json").read_text())
    assert cfg["source"] == "torch-dcp" and cfg["states"] == ["exp_avg", "exp_avg_sq"]
    assert not any(k.endswith(".master") for k in sd)  # FSDP trains the fp32 parameters themselves

    dcp_to_torch_save(src / dcp, tmp_path / "ref.pt")
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)  # torchtitan keeps BytesIO state beside: trusted fixture
    top = [k for k in ("optimizer", "optim", "optimizer_0") if k in ref]
    strip = "model." if fixture == "lightning-fsdp" else ""  # the LightningModule's attribute, as for the model
    check_against(sd, cfg, unflatten(ref[top[0]] if top else ref), lambda fqn: fqn[len(strip) :])

    # names as the model export of the same checkpoint has them
    export(src, tmp_path / "model")
    names = set(load_file(tmp_path / "model" / "model.safetensors"))
    params = {k.rsplit(".", 1)[0] for k in sd}
    if fixture == "torchtitan":  # its fused wqkv parameter: the model's state dict splits it into wq/wk/wv, the
        # optimizer state (keyed by the parameter) keeps it whole, as torchtitan saved it
        fused = {p for p in params if p.endswith(".qkv_linear.wqkv.weight")}
        assert len(fused) == 2
        params = (params - fused) | {p.replace(".wqkv.", f".{w}.") for p in fused for w in ("wq", "wk", "wv")}
        assert params == names  # every model parameter has optimizer state (its own or its fused parameter's)
        assert cfg["frozen_params"] == []  # wq/wk/wv have their state under wqkv: not frozen
        assert any("fused parameters" in n for n in plan_export(src, tmp_path / "p", component="optimizer")[0].notes)
    assert params <= names and sorted(names - params) == sorted(cfg["frozen_params"])


# (fixture, file, the optimizer state in torch.load's object, names by index: "model" or "param")
FILE_CASES = [
    ("plain-pt-optim", "checkpoint.pt", lambda o: o["optimizer"], "model"),
    ("lightning-file-optim", "last.ckpt", lambda o: o["optimizer_states"][0], "model"),
    ("plain-pt-optim-groups", "checkpoint.pt", lambda o: o["optimizer"], "param"),
    ("accelerate-save-state", "optimizer.bin", lambda o: o, "param"),
]


@pytest.mark.parametrize("fixture,file,pick,named", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_torch_file_matches_torch_load(real_ckpt, tmp_path, fixture, file, pick, named):
    from ckpt_tui.samples._common import TinyLM

    src = real_ckpt(fixture)
    res = export(src, tmp_path / "out", component="optimizer")
    assert res.verified
    sd = load_optimizer_export(tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "optimizer_config.json").read_text())
    assert cfg["source"] == "torch-file"
    ref = pick(torch.load(src / file, weights_only=True))
    if named == "model":
        # the optimizer was built over model.parameters(): index i is the i-th named parameter
        order = [n for n, _ in TinyLM().named_parameters()]
        check_against(sd, cfg, ref, lambda i: order[i])
        assert cfg["frozen_params"] == ["position_scale"]  # the buffer
        assert any("line up in order and shape" in n for n in res.notes)
    else:
        check_against(sd, cfg, ref, lambda i: f"param_{i}")
        said = [n for n in res.notes if "could not be named" in n]
        assert len(said) == 1 and "param_<i>.exp_avg" in said[0]
    if fixture == "lightning-file-optim":  # the LightningModule's `model.` is stripped, as the model export does
        export(src, tmp_path / "model")
        assert {k.rsplit(".", 1)[0] for k in sd} <= set(load_file(tmp_path / "model" / "model.safetensors"))
        assert any("stripped the LightningModule attribute prefix `model.`" in n for n in res.notes)


def test_sharded_output_and_needs(real_ckpt, tmp_path):
    src = real_ckpt("hf-fsdp2")
    plan, _ = plan_export(src, tmp_path / "many", component="optimizer", max_shard_size="40KB")
    res = export(src, tmp_path / "many", component="optimizer", max_shard_size="40KB")
    assert res.verified and len(res.files) > 3 and all(f.startswith("optimizer-") for f in res.files)
    export(src, tmp_path / "one", component="optimizer")
    one, many = load_optimizer_export(tmp_path / "one"), load_optimizer_export(tmp_path / "many")
    assert sorted(one) == sorted(many) and all(torch.equal(one[k], many[k]) for k in one)
    written = sum(p.stat().st_size for p in (tmp_path / "many").iterdir())
    report = inspect(src)
    assert plan.output_bytes == written
    assert (
        export_needs(report, report.inventory.model_node("checkpoint-2"), component="optimizer", max_shard_size="40KB")
        == written
    )


def test_what_the_wizard_is_offered(real_ckpt):
    """optimizer_exportable: where --component optimizer reads from, decided from the inventory only."""
    assert optimizer_exportable(inspect(real_ckpt("hf-fsdp1"))) == "checkpoint-2/optimizer_0"
    assert optimizer_exportable(inspect(real_ckpt("dcp-mixed"))) == "optimizer"
    assert optimizer_exportable(inspect(real_ckpt("fsdp2-dcp"))) == "."
    assert optimizer_exportable(inspect(real_ckpt("accelerate-save-state"))) == "optimizer.bin"
    assert optimizer_exportable(inspect(real_ckpt("lightning-file-optim"))) == "last.ckpt"
    assert optimizer_exportable(inspect(real_ckpt("ds-zero2-bf16"))) == "global_step2"
    assert optimizer_exportable(inspect(real_ckpt("fsdp1-dcp"))) is None
    assert optimizer_exportable(inspect(real_ckpt("hf-model-sharded"))) is None


def test_verify_an_optimizer_export(real_ckpt, real_ckpt_copy, tmp_path):
    for name in ("hf-fsdp1", "lightning-file-optim", "accelerate-save-state", "ds-zero2-bf16"):
        src = real_ckpt(name)
        export(src, tmp_path / name, component="optimizer")
        v = verify(tmp_path / name, src)
        assert v.ok and v.compared == len(load_optimizer_export(tmp_path / name)) and not v.not_in_reference, (name, v)
    # a changed tensor and a config that lost a parameter are both caught
    out = tmp_path / "hf-fsdp1"
    sd = load_optimizer_export(out)
    k = sorted(sd)[3]
    sd[k] = sd[k] + 1
    from safetensors.torch import save_file

    save_file(sd, out / "optimizer.safetensors", metadata={"format": "pt"})
    v = verify(out, real_ckpt("hf-fsdp1"))
    assert not v.ok and v.mismatches == [k]
    cfg = json.loads((out / "optimizer_config.json").read_text())
    cfg["param_groups"][0]["params"] = cfg["param_groups"][0]["params"][1:]
    (out / "optimizer_config.json").write_text(json.dumps(cfg))
    v = verify(out, real_ckpt("hf-fsdp1"))
    assert not v.ok and any("optimizer_config.json" in p for p in v.problems)


def test_cli_and_the_printed_load_code_run_as_printed(real_ckpt, tmp_path):
    """The export guide's example (docs/export.md), and the "Load it with" code it prints, run exactly as printed."""
    from tests.snippets import run_printed, snippet_after

    guide = (ROOT / "docs" / "export.md").read_text()
    line = "ckpt-tui export checkpoint-2 --component optimizer --out optim/"
    assert line in guide
    import shutil

    shutil.copytree(real_ckpt("hf-fsdp2") / "checkpoint-2", tmp_path / "checkpoint-2")
    r = ckpt_tui(*line.split()[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "verified ✓" in r.stdout and "optimizer_config.json" in r.stdout
    got = run_printed(
        snippet_after(r.stdout),
        tmp_path,
        "{'keys': sorted(sd), 'step': config['step'], 'groups': len(config['param_groups'])}",
    )
    assert got["keys"] == sorted(load_optimizer_export(tmp_path / "optim")) and got["step"] == 2 and got["groups"] == 2
    r = ckpt_tui("verify", "optim", "--against", "checkpoint-2", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("✓"), r.stdout + r.stderr


def test_a_truncated_optimizer_shard_is_refused(real_ckpt_copy, tmp_path):
    from ckpt_tui.core.export.write import ExportError

    bad = real_ckpt_copy("hf-fsdp1")
    f = bad / "checkpoint-2" / "optimizer_0" / "__1_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ExportError):
        export(bad / "checkpoint-2", tmp_path / "out", component="optimizer")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fixture", ["hf-fsdp1", "lightning-file-optim"])
def test_both_side_by_side_in_one_folder(real_ckpt, tmp_path, fixture):
    """The wizard's "both": model and optimizer files in one folder, each as its own export writes it."""
    from ckpt_tui.core.export.both import execute_both

    src = real_ckpt(fixture)
    pm, _ = plan_export(src, tmp_path / "both")
    po, _ = plan_export(src, tmp_path / "both", component="optimizer")
    rm, ro = execute_both(pm, po)
    assert rm.verified and ro.verified and rm.out == ro.out == tmp_path / "both"
    export(src, tmp_path / "model")
    export(src, tmp_path / "optim", component="optimizer")
    assert sorted(os.listdir(tmp_path / "both")) == sorted(
        os.listdir(tmp_path / "model") + os.listdir(tmp_path / "optim")
    )
    for f in os.listdir(tmp_path / "both"):
        other = tmp_path / ("model" if (tmp_path / "model" / f).exists() else "optim") / f
        assert (tmp_path / "both" / f).read_bytes() == other.read_bytes(), f
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left
    assert "both" in rm.load_code and "optimizer.safetensors" in ro.load_code
    from ckpt_tui.core.export.write import ExportError

    with pytest.raises(ExportError, match="not empty"):  # a second "both" into it is refused, nothing touched
        execute_both(*[plan_export(src, tmp_path / "both", component=c)[0] for c in ("model", "optimizer")])
