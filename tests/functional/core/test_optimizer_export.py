"""`ckpt-tui export --component optimizer` of DeepSpeed ZeRO-1/2/3 tags, bit-exact against DeepSpeed's
own `ds_to_universal` (run for real through `ckpt-tui universal` on a copy): every parameter's
exp_avg, exp_avg_sq and fp32 master, the step, the param groups; frozen parameters (no optimizer
state) accounted for; a sharded output; names as the model export has them; the refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tui.core.export.api import export, plan_export
from ckpt_tui.core.export.write import ExportError
from tests.util import ckpt_tui, load_optimizer_export


def universal_of(copy: Path, tmp_path: Path) -> Path:
    """DeepSpeed's ds_to_universal of ``copy`` (via `ckpt-tui universal`): the folder holding zero/."""
    uc = tmp_path / "uc"
    r = ckpt_tui("universal", str(copy), "--out", str(uc), "--no-export-frozen", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (uc / "zero").is_dir()
    return uc


def state_tensor(path: Path) -> torch.Tensor:
    obj = torch.load(path, weights_only=False)
    return obj["param"] if isinstance(obj, dict) else obj


CASES = [
    ("ds-zero1-bf16", 1, []),
    ("ds-zero2-bf16", 2, []),
    ("ds-zero3-bf16", 3, []),
    ("ds-zero1-frozen", 1, ["embed_tokens.weight"]),
    ("ds-zero3-frozen", 3, ["embed_tokens.weight"]),
    ("ds-zero2-3ranks", 2, []),
    ("ds-zero3-3ranks", 3, []),
]  # 3 ranks: uneven partitions, padding


@pytest.mark.parametrize("variant,stage,frozen", CASES, ids=[c[0] for c in CASES])
def test_matches_ds_to_universal_bit_exact(real_ckpt_copy, tmp_path, variant, stage, frozen):
    copy = real_ckpt_copy(variant)
    uc = universal_of(copy, tmp_path)
    res = export(copy, tmp_path / "out", component="optimizer")
    assert res.verified and res.files == ["optimizer.safetensors"]
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["optimizer.safetensors", "optimizer_config.json"]
    sd = load_optimizer_export(out)
    cfg = json.loads((out / "optimizer_config.json").read_text())
    assert cfg["zero_stage"] == stage and cfg["frozen_params"] == frozen

    # every parameter with optimizer state in the universal checkpoint, and only those, is exported
    ref_params = sorted(p.name for p in (uc / "zero").iterdir() if (p / "exp_avg.pt").is_file())
    params = sorted({k.rsplit(".", 1)[0] for k in sd})
    assert params == ref_params and len(params) >= 10
    assert sorted(n for g in cfg["param_groups"] for n in g["params"]) == params
    assert not set(frozen) & set(params)
    assert len(sd) == 3 * len(params)  # bf16 runs: the fp32 masters are apart from the module weights
    for p in params:
        for key, ref_file in (("exp_avg", "exp_avg.pt"), ("exp_avg_sq", "exp_avg_sq.pt"), ("master", "fp32.pt")):
            got = sd[f"{p}.{key}"]
            ref = state_tensor(uc / "zero" / p / ref_file)
            assert got.dtype == ref.dtype == torch.float32
            assert got.numel() == ref.numel(), (p, key)
            # ZeRO-3 universal stores params flat; ours have the parameter's shape
            assert torch.equal(got, ref.reshape(got.shape)), (p, key)
        assert sd[f"{p}.exp_avg_sq"].abs().sum() > 0  # trained: not an all-zero state compared with itself

    # the step and the param groups, as DeepSpeed saved them
    zopt = torch.load(uc / "zero" / "optimizer_state.pt", weights_only=False)
    if stage <= 2:
        steps = {float(torch.load(uc / "zero" / p / "step.pt", weights_only=False)) for p in params}
        groups = zopt["param_groups"]
    else:
        steps = {float(s["step"]) for s in zopt["optimizer_state_dict"]["state"].values()}
        groups = zopt["optimizer_state_dict"]["param_groups"]
    assert steps == {cfg["step"]} and cfg["step"] == 2
    assert len(groups) == len(cfg["param_groups"])
    for ref, got in zip(groups, cfg["param_groups"]):
        for k in ("lr", "eps", "weight_decay"):
            assert got[k] == ref[k]
        assert got["betas"] == list(ref["betas"])
        assert got["step"] == 2


def test_sharded_output(real_ckpt, tmp_path):
    src = real_ckpt("ds-zero2-bf16")
    export(src, tmp_path / "one", component="optimizer")
    res = export(src, tmp_path / "many", component="optimizer", max_shard_size="100KB")
    assert res.verified and len(res.files) > 3
    index = json.loads((tmp_path / "many" / "optimizer.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(res.files)
    for f in res.files:  # each shard within the limit, unless one tensor alone exceeds it
        shard = load_file(tmp_path / "many" / f)
        assert f.startswith("optimizer-") and (len(shard) == 1 or sum(t.nbytes for t in shard.values()) <= 100_000)
    one, many = load_file(tmp_path / "one" / "optimizer.safetensors"), load_optimizer_export(tmp_path / "many")
    assert sorted(one) == sorted(many) == sorted(index["weight_map"])
    assert all(torch.equal(one[k], many[k]) for k in one)
    assert (tmp_path / "many" / "optimizer_config.json").read_text() == (
        tmp_path / "one" / "optimizer_config.json"
    ).read_text()


def test_fp32_run_writes_no_master(real_ckpt, tmp_path):
    res = export(real_ckpt("ds-zero2-fp32"), tmp_path / "out", component="optimizer")
    sd = load_file(tmp_path / "out" / "optimizer.safetensors")
    assert sd and not any(k.endswith(".master") for k in sd)
    assert {k.rsplit(".", 1)[1] for k in sd} == {"exp_avg", "exp_avg_sq"}
    assert any("no <name>.master" in n for n in res.notes)


def test_names_match_the_model_export(real_ckpt, tmp_path):
    """A Lightning DeepSpeed tag: the model export strips the LightningModule prefix; so does this one."""
    src = real_ckpt("lightning-ds-zero2") / "checkpoints" / "epoch=0-step=2.ckpt"
    model = export(src, tmp_path / "model")
    export(src, tmp_path / "optim", component="optimizer")
    assert model.stripped_prefix
    names = set(load_file(tmp_path / "model" / "model.safetensors"))
    sd = load_file(tmp_path / "optim" / "optimizer.safetensors")
    params = {k.rsplit(".", 1)[0] for k in sd}
    assert params and params <= names
    assert not any(p.startswith(model.stripped_prefix) for p in params if model.stripped_prefix + p not in names)
    cfg = json.loads((tmp_path / "optim" / "optimizer_config.json").read_text())
    assert {n for g in cfg["param_groups"] for n in g["params"]} == params
    for p in params:  # the masters are the model export's weights, bit for bit
        assert torch.equal(sd[f"{p}.master"], load_file(tmp_path / "model" / "model.safetensors")[p])


def test_cli_refuses_what_it_cannot_read_yet(real_ckpt_copy, real_ckpt, tmp_path):
    real_ckpt_copy("universal")
    r = ckpt_tui("export", "universal", "--out", "out", "--component", "optimizer", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert "the optimizer component is universal/global_step2_universal/ (deepspeed-universal" in r.stderr
    # the one list of what --component optimizer reads: each format's own words, as the CLI help says them too
    from ckpt_tui.core.formats.registry import optimizer_sources

    assert f"not supported yet (only of {optimizer_sources()})" in r.stderr
    assert (
        "DeepSpeed ZeRO-1/2/3 tag folders" in optimizer_sources() and "verl FSDP actor folders" in optimizer_sources()
    )
    help_text = " ".join(ckpt_tui("export", "--help", cwd=tmp_path).stdout.split())
    assert " ".join(optimizer_sources().split()) in help_text
    assert not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match="does not go with --component optimizer"):
        plan_export(real_ckpt("ds-zero2-bf16"), tmp_path / "out", component="optimizer", from_module_states=True)


def test_cli_writes_it(real_ckpt, tmp_path):
    r = ckpt_tui("export", str(real_ckpt("ds-zero3-bf16")), "--out", "out", "--component", "optimizer", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "verified ✓" in r.stdout and 'sd = load_file(f"{out}/optimizer.safetensors")' in r.stdout
    assert "optimizer_config.json" in r.stdout
    assert sorted(os.listdir(tmp_path / "out")) == ["optimizer.safetensors", "optimizer_config.json"]


@pytest.mark.parametrize("shard", [None, "100KB"], ids=["one-file", "sharded"])
def test_the_printed_load_code_runs_as_printed(real_ckpt, tmp_path, shard):
    """The "Load it with" code an optimizer export prints, run exactly as printed from the folder the
    export ran in: `sd` holds every exported tensor, `config` the step and the param groups."""
    from tests.snippets import run_printed, snippet_after

    args = ["export", str(real_ckpt("ds-zero2-bf16")), "--out", "out", "--component", "optimizer"]
    r = ckpt_tui(*args, *(["--max-shard-size", shard] if shard else []), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = run_printed(
        snippet_after(r.stdout),
        tmp_path,
        "{'keys': sorted(sd), 'step': config['step'], 'groups': len(config['param_groups'])}",
    )
    assert got["keys"] == sorted(load_optimizer_export(tmp_path / "out")) and any(
        k.endswith(".exp_avg_sq") for k in got["keys"]
    )
    assert got["step"] == 2 and got["groups"] >= 1


def test_a_truncated_rank_is_refused(real_ckpt_copy, tmp_path):
    bad = real_ckpt_copy("ds-zero2-bf16")
    f = bad / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ExportError, match="problems an export cannot work around"):
        export(bad, tmp_path / "out", component="optimizer")
    assert not (tmp_path / "out").exists()


def test_the_readme_worked_example_is_what_export_prints(real_ckpt, tmp_path):
    """The export guide's worked example (docs/export.md), from the folder holding the HF Trainer + ZeRO-2 bf16 `checkpoint-2`: the
    command as written, its stderr line and stdout block as shown (only the seconds may differ), the printed
    code run as printed, and what the guide says `sd` and `config` then hold."""
    import re
    import shutil

    from tests.snippets import run_printed, snippet_after

    text = (Path(__file__).resolve().parents[3] / "docs" / "export.md").read_text()
    block = text[text.index("$ ckpt-tui export checkpoint-2 --component optimizer --out optim/\n") :]
    command, said, *shown = block[: block.index("```")].splitlines()
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", tmp_path / "checkpoint-2")
    r = ckpt_tui(*command.split()[2:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert said in r.stderr.splitlines()

    def seconds(s: str) -> str:
        return re.sub(r" in [0-9.]+ s ", " in N s ", s)

    assert [seconds(x) for x in r.stdout.splitlines()] == [seconds(x) for x in shown]
    master = "sd['model.embed_tokens.weight.master']"
    got = run_printed(
        snippet_after(r.stdout),
        tmp_path,
        f"{{'keys': sorted(sd), 'shape': list({master}.shape), 'dtype': str({master}.dtype),"
        " 'config': {k: config[k] for k in ('step', 'zero_stage')},"
        " 'opt': [config['optimizer']['type'], config['optimizer']['params']['lr']],"
        " 'groups': [(len(g['params']), sorted(k for k in ('lr', 'betas', 'eps', 'weight_decay') if k in g))"
        " for g in config['param_groups']]}",
    )
    names = sorted({k.rsplit(".", 1)[0] for k in got["keys"]})
    assert len(names) == 21 and len(got["keys"]) == 63
    assert all(f"{n}.{s}" in got["keys"] for n in names for s in ("exp_avg", "exp_avg_sq", "master"))
    assert got["shape"] == [256, 64] and got["dtype"] == "torch.float32"
    assert got["config"] == {"step": 2, "zero_stage": 2} and got["opt"] == ["Adam", 0.001]
    assert got["groups"] == [[21, ["betas", "eps", "lr", "weight_decay"]]]
    # the names are the model export's
    r = ckpt_tui("export", "checkpoint-2", "--out", "model/", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(load_file(tmp_path / "model" / "model.safetensors")) == names


def test_a_half_precision_dtype_says_it_casts_the_optimizer_state(real_ckpt, tmp_path):
    """--dtype bf16 with --component optimizer does what it says and says what it costs; keep writes fp32."""
    res = export(real_ckpt("ds-zero2-bf16"), tmp_path / "out", component="optimizer", dtype="bf16")
    assert any("casts the optimizer state too" in n and "written in bf16" in n for n in res.notes), res.notes
    assert {t.dtype for t in load_file(tmp_path / "out" / "optimizer.safetensors").values()} == {torch.bfloat16}
    plan, _ = plan_export(real_ckpt("ds-zero2-bf16"), tmp_path / "keep", component="optimizer")
    assert not any("casts the optimizer state" in n for n in plan.notes)
