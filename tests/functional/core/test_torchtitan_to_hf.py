"""``export --to hf`` of torchtitan step-N checkpoints, proven by torchtitan itself: samples/torchtitan_hf.py saves a
tiny GQA Llama3 (4 heads, 2 key/value heads, distinct RMSNorm weights, rope theta 500000 with Llama 3.1 scaling) by
torchtitan 0.3.0's CheckpointManager (step-1 full fp32, step-2 model-only bf16), with its job config, and records
torchtitan's own ``Llama3StateDictAdapter.to_hf`` tensors and its Llama3Model's fp32 logits on a fixed 2 x 40 batch.
The export must equal ``to_hf`` tensor for tensor (bit-exact, same dtype), and LlamaForCausalLM on it must give
torchtitan's logits (max |Δ| <= 1e-4 * max |logit|; measured about 7e-7 of it); each mutation (the rotary
permutation omitted, gate and up swapped, two norms swapped) must miss by >= 100x the tolerance."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tui.core.export import to_hf
from ckpt_tui.core.export.api import export
from ckpt_tui.core.export.write import ExportError
from tests.functional.core.hf_mutations import run_worked_example, swapped_copies

transformers = pytest.importorskip("transformers")

TOL = 1e-4
VARIANT = "torchtitan-hf"


def _rel(folder, root, step) -> float:
    o = torch.load(root / f"oracle/logits-step-{step}.pt", weights_only=True)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        got = model(o["ids"]).logits
    return ((got - o["logits"]).abs().max() / o["logits"].abs().max()).item()


@pytest.mark.parametrize("step, dtype", [(1, torch.float32), (2, torch.bfloat16)])
def test_equals_torchtitans_to_hf_and_its_logits(real_ckpt, tmp_path, step, dtype):
    root = real_ckpt(VARIANT)
    out = tmp_path / "hf"
    res = export(root / f"checkpoint/step-{step}", out, to="hf")
    assert res.verified
    assert any("job_config.json" in n for n in res.notes)
    assert any("wq and wk rows permuted per head" in n and "2 key/value heads, head_dim 16" in n for n in res.notes)
    got, want = load_file(out / "model.safetensors"), load_file(root / f"oracle/to_hf-step-{step}.safetensors")
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype == dtype and torch.equal(got[k], want[k]), k
    _, info = transformers.LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert (cfg["hidden_act"], cfg["rms_norm_eps"], cfg["vocab_size"], cfg["tie_word_embeddings"]) == (
        "silu",
        1e-5,
        256,
        False,
    )
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert transformers.AutoConfig.from_pretrained(out).rope_parameters == rope
    assert cfg["rope_theta"] == 500000.0 and cfg["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    rel = _rel(out, root, step)
    print(f"step-{step}: max|Δ| / max|logit| = {rel:.2e}")
    assert rel <= TOL


def test_mutations_miss_by_far_more_than_the_tolerance(real_ckpt, tmp_path):
    root = real_ckpt(VARIANT)
    out = tmp_path / "hf"
    export(root / "checkpoint/step-1", out, to="hf")
    assert _rel(out, root, 1) <= TOL
    misses = {what: _rel(d, root, 1) for what, d in swapped_copies(out, tmp_path).items()}
    d = tmp_path / "no-permutation"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(to_hf, "rope_permutation", lambda n, hd: [(0, n * hd)])
        export(root / "checkpoint/step-1", d, to="hf")
    misses["rotary permutation omitted"] = _rel(d, root, 1)
    print({k: f"{v:.2e}" for k, v in misses.items()})
    assert all(v >= 100 * TOL for v in misses.values()), misses


def test_rope_permutation_is_torchtitans():
    """The row order of the adapter's _permute (w.view(n, hd/2, 2, dim).transpose(1, 2).reshape(-1, dim))."""
    n, hd, dim = 3, 8, 5
    w = torch.arange(n * hd * dim, dtype=torch.float32).reshape(n * hd, dim)
    want = w.view(n, hd // 2, 2, dim).transpose(1, 2).reshape(n * hd, dim)
    rows = [s for s, c in to_hf.rope_permutation(n, hd) for s in range(s, s + c)]
    assert torch.equal(w[rows], want)


def _without_job_config(real_ckpt, tmp_path):
    v = tmp_path / "run"
    shutil.copytree(real_ckpt(VARIANT), v)
    (v / "job_config.json").unlink()
    return v


def test_without_a_job_config_refused_naming_the_values_then_config_works(real_ckpt, tmp_path):
    v = _without_job_config(real_ckpt, tmp_path)
    with pytest.raises(ExportError) as e:
        export(v / "checkpoint/step-2", tmp_path / "x", to="hf")
    for value in ("n_heads", "n_kv_heads", "wq has 64 rows, wk 32", "rms_norm_eps", "rope_theta", "--config PATH"):
        assert value in str(e.value)
    assert not (tmp_path / "x").exists()
    good = tmp_path / "good"
    export(real_ckpt(VARIANT) / "checkpoint/step-2", good, to="hf")
    cfg = json.loads((good / "config.json").read_text())
    given = tmp_path / "config.json"
    given.write_text(json.dumps({k: v for k, v in cfg.items() if k != "rope_parameters"}))
    res = export(v / "checkpoint/step-2", tmp_path / "hf", to="hf", config=given)
    assert any("--config" in n and "trusted" in n for n in res.notes)
    assert _rel(tmp_path / "hf", v, 2) <= TOL
    # shapes are checked against what --config says before anything is written
    given.write_text(json.dumps({**cfg, "num_key_value_heads": 4}))
    with pytest.raises(ExportError, match=r"wk.weight: \[32, 64\], expected \[64, 64\]"):
        export(v / "checkpoint/step-2", tmp_path / "y", to="hf", config=given)
    given.write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(ExportError, match="torchtitan's Llama3 feed-forward is SiLU"):
        export(v / "checkpoint/step-2", tmp_path / "y", to="hf", config=given)
    assert not (tmp_path / "y").exists()


def test_job_configs_that_are_not_llama_refused(real_ckpt, tmp_path):
    v = tmp_path / "run"
    shutil.copytree(real_ckpt(VARIANT), v)
    job = json.loads((v / "job_config.json").read_text())
    job["model_spec"]["model"]["layers"][0]["attention"]["rope"]["scaling"] = "yarn"
    (v / "job_config.json").write_text(json.dumps(job))
    with pytest.raises(ExportError, match="rope scaling 'yarn'"):
        export(v / "checkpoint/step-1", tmp_path / "x", to="hf")
    job["model_spec"]["model"]["layers"][0]["attention"]["rope"]["scaling"] = "none"
    job["model_spec"]["model"]["dim"] = 128
    (v / "job_config.json").write_text(json.dumps(job))
    with pytest.raises(ExportError, match="hidden size \\(dim\\): the configuration says 128, the tensors 64"):
        export(v / "checkpoint/step-1", tmp_path / "x", to="hf")


@pytest.mark.parametrize(
    "doc_file,heading", [("docs/export.md", "### torchtitan"), ("README.md", "#### torchtitan → Hugging Face")]
)
def test_the_worked_example_runs_as_written(real_ckpt, tmp_path, doc_file, heading):
    v = run_worked_example(heading, real_ckpt(VARIANT), tmp_path, doc_file=doc_file)
    assert _rel(v / "hf", v, 2) <= TOL  # the folder it wrote: torchtitan's logits


@pytest.mark.parametrize(
    "variant, src",
    [
        ("torchtitan-hf", "checkpoint/step-1"),
        ("torchtitan-hf", "checkpoint/step-2"),
        ("megatron-hf-tp2", "checkpoints"),
        ("megatron-hf-tied", "checkpoints"),
    ],
)
def test_verify_knows_the_to_hf_mapping(real_ckpt, tmp_path, variant, src):
    """verify DIR --against SRC after --to hf: the source's tensors (torch's DCP loader) mapped to HF's names
    afresh (torch view/split, the adapter's permutation formula): passes, and fails on a mutated tensor."""
    from ckpt_tui.core.verify import verify

    root = real_ckpt(variant)
    out = tmp_path / "hf"
    export(root / src, out, to="hf")
    v = verify(out, root / src)
    assert v.ok and v.compared == len(load_file(out / "model.safetensors")) and not v.not_in_reference, v
    sd = load_file(out / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    sd[name] = sd[name].clone()
    sd[name][0, 0] += 1
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    v = verify(out, root / src)
    assert not v.ok and v.mismatches == [name]


def test_generation_config_beside_the_dump_folder_copied(real_ckpt_copy, tmp_path):
    """torchtitan's dump folder (above checkpoint/step-N/, where its job config is): its generation_config.json
    is copied into the --to hf folder."""
    v = real_ckpt_copy("torchtitan-hf")
    (v / "generation_config.json").write_text(json.dumps({"eos_token_id": 3, "max_new_tokens": 16}))
    res = export(v / "checkpoint/step-1", tmp_path / "hf", to="hf")
    assert json.loads((tmp_path / "hf/generation_config.json").read_text()) == {"eos_token_id": 3, "max_new_tokens": 16}
    assert any(n.startswith("generation_config.json copied from") for n in res.notes), res.notes
