"""LoRA runs (issue 23) as a user meets them: inspect says what the adapter is and where its base is; `export`
writes the adapter as PEFT saves it, and `export --merge` the merged model, bit-exact with PEFT's own
`PeftModel.from_pretrained(base).merge_and_unload()`; each printed load snippet runs as printed.

Fixtures: samples/hf_peft.py — each variant is `base-model/` beside the Trainer's `run/checkpoint-2/`, the base
recorded as the relative path `base-model`. The user stands in `run/` (the Trainer's output_dir)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures import fixture_path
from tests.snippets import run_load_snippets, snippet_after
from tests.util import ckpt_tui

FOLDER = ["peft-llama", "peft-llama-bias-bf16", "peft-gpt2-rslora", "peft-llama-resized", "peft-ddp-mts"]
RESIZED = {"peft-llama-resized": 264}  # the run added tokens: its embedding and head have 264 rows, the base 256


def _copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_path(name), d, symlinks=True)
    return d


def _peft(variant: Path, adapter: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(variant / "base-model")
    if variant.name in RESIZED:  # as the run did, and as the printed load code does
        base.resize_token_embeddings(RESIZED[variant.name])
    return PeftModel.from_pretrained(base, adapter).eval()


def _ids(variant: str = ""):
    """Token ids, the added ones among them where the run added tokens."""
    ids = torch.arange(0, 32).reshape(2, 16) % 250
    if variant in RESIZED:
        ids[:, -8:] = torch.arange(256, RESIZED[variant])
    return ids


def test_inspect_names_the_adapter_and_finds_its_base(tmp_path):
    v = _copy("peft-llama", tmp_path)
    r = ckpt_tui("inspect", "checkpoint-2", "--json", cwd=v / "run")
    doc = json.loads(r.stdout)
    assert "LoRA adapter (r=4, alpha=8, on q_proj, v_proj;" in doc["summary"], doc["summary"]
    assert "for `base-model` — found at `../base-model`; optimizer in `optimizer.pt`" in doc["summary"], doc["summary"]
    (f,) = [f for f in doc["findings"] if f["code"] == "adapter-only"]
    assert f["command"] == "ckpt-tui export checkpoint-2 --merge --out DIR"


def test_inspect_says_when_the_base_is_not_found_or_not_recorded(tmp_path):
    v = _copy("peft-llama", tmp_path)
    shutil.rmtree(v / "base-model")
    doc = json.loads(ckpt_tui("inspect", "checkpoint-2", "--json", cwd=v / "run").stdout)
    assert "for `base-model` — not found: pass `--base PATH`;" in doc["summary"], doc["summary"]
    (f,) = [f for f in doc["findings"] if f["code"] == "adapter-only"]
    assert f["command"] == "ckpt-tui export checkpoint-2 --out DIR"  # the adapter needs no base
    cfg = v / "run" / "checkpoint-2" / "adapter_config.json"
    doc = json.loads(cfg.read_text())
    doc["base_model_name_or_path"] = None
    cfg.write_text(json.dumps(doc))
    doc = json.loads(ckpt_tui("inspect", "checkpoint-2", "--json", cwd=v / "run").stdout)
    assert "— base not recorded (`base_model_name_or_path` is null): pass `--base PATH`;" in doc["summary"]


@pytest.mark.parametrize("name", FOLDER)
def test_export_writes_the_adapter_as_peft_saves_it(name, tmp_path):
    v = _copy(name, tmp_path)
    run = v / "run"
    r = ckpt_tui("export", "checkpoint-2", "--out", "adapter", cwd=run)
    assert r.returncode == 0, r.stderr
    out = run / "adapter"
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (out / "adapter_config.json").read_bytes() == (run / "checkpoint-2" / "adapter_config.json").read_bytes()
    got = load_file(out / "adapter_model.safetensors")
    oracle = load_file(v / "oracle" / "adapter_state.safetensors")  # get_peft_model_state_dict of the live run
    assert sorted(got) == sorted(oracle)
    for k in oracle:
        assert got[k].dtype == oracle[k].dtype and torch.equal(got[k], oracle[k]), k
    snippet = snippet_after(r.stdout)
    assert "PeftModel.from_pretrained(base, 'adapter')" in snippet, snippet
    run_load_snippets([(snippet, run, name)])
    with torch.no_grad():  # the exported adapter gives the checkpoint's logits exactly
        a = _peft(v, run / "checkpoint-2")(_ids(name)).logits
        b = _peft(v, out)(_ids(name)).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", FOLDER)
def test_merge_is_bit_exact_with_peft_merge_and_unload(name, tmp_path):
    from transformers import AutoModelForCausalLM

    v = _copy(name, tmp_path)
    run = v / "run"
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    out = run / "merged"
    peft_model = _peft(v, run / "checkpoint-2")
    with torch.no_grad():
        unmerged = peft_model(_ids(name)).logits
    oracle = peft_model.merge_and_unload().state_dict()
    base = load_file(v / "base-model" / "model.safetensors")
    got = {}
    for f in out.glob("*.safetensors"):
        got.update(load_file(f))
    assert sorted(got) == sorted(base)  # every tensor the base has, and only those (a tied head stays tied)
    for k, t in got.items():
        assert t.dtype == oracle[k].dtype and torch.equal(t, oracle[k]), k
    cfg = json.loads((run / "checkpoint-2" / "adapter_config.json").read_text())
    targets = cfg["target_modules"]
    changed = {}
    for k, t in got.items():
        mod = k.rsplit(".", 1)[0]
        hit = mod in targets or mod.rsplit(".", 1)[-1] in targets  # names, or module paths ("all-linear" saved)
        if hit and k.endswith(".weight") and k in base:
            changed[k] = int((t != base[k]).sum())
    assert changed and all(n > 0 for n in changed.values()), changed  # every target moved: a missing merge fails
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert vocab == RESIZED.get(name, 256), vocab  # the adapter's embedding's, where the run added tokens
    model = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    merged, info = model
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        logits = merged.eval()(_ids(name)).logits
    if logits.dtype == torch.float32:
        assert (logits - unmerged).abs().max().item() <= 1e-5
    snippet = snippet_after(r.stdout)
    assert ".from_pretrained('merged')" in snippet, snippet
    run_load_snippets([(snippet, run, name)])


def test_merge_without_the_base_lists_every_place_looked(tmp_path):
    v = _copy("peft-llama", tmp_path)
    shutil.move(v / "base-model", tmp_path / "elsewhere")
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=v / "run")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "`base-model` was not found" in r.stderr and "--base PATH" in r.stderr, r.stderr
    assert not (v / "run" / "merged").exists()
    r = ckpt_tui(
        "export", "checkpoint-2", "--merge", "--base", str(tmp_path / "elsewhere"), "--out", "m", cwd=v / "run"
    )
    assert r.returncode == 0, r.stderr


def test_merge_refuses_a_base_whose_shapes_disagree(tmp_path):
    from safetensors.torch import save_file

    v = _copy("peft-llama", tmp_path)
    f = v / "base-model" / "model.safetensors"
    sd = load_file(f)
    k = "model.layers.0.self_attn.q_proj.weight"
    sd[k] = torch.zeros(sd[k].shape[0], sd[k].shape[1] // 2)
    save_file(sd, f, metadata={"format": "pt"})
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=v / "run")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert k in r.stderr and "the LoRA on it makes" in r.stderr, r.stderr


def test_merge_refuses_lora_variants(tmp_path):
    v = _copy("peft-llama", tmp_path)
    cfg = v / "run" / "checkpoint-2" / "adapter_config.json"
    doc = json.loads(cfg.read_text())
    doc["use_dora"] = True
    cfg.write_text(json.dumps(doc))
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=v / "run")
    assert r.returncode != 0 and "use_dora" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_merge_on_a_whole_model_is_refused(tmp_path):
    v = _copy("peft-llama", tmp_path)
    r = ckpt_tui("export", "base-model", "--merge", "--out", "merged", cwd=v)
    assert r.returncode != 0 and "no LoRA tensors" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _merge_oracle(v: Path, adapter: Path) -> dict:
    return _peft(v, adapter).merge_and_unload().state_dict()


def _equal_files(out: Path, oracle: dict) -> None:
    got = {}
    for f in out.glob("*.safetensors"):
        got.update(load_file(f))
    assert got and all(k in oracle for k in got)
    for k, t in got.items():
        assert t.dtype == oracle[k].dtype and torch.equal(t, oracle[k]), k


@pytest.mark.parametrize("name", ["peft-ds-zero2", "peft-ds-zero3"])
def test_a_deepspeed_tag_exports_its_fp32_masters_and_says_which_adapter_it_took(name, tmp_path):
    v = _copy(name, tmp_path)
    run = v / "run"
    r = ckpt_tui("export", "checkpoint-2", "--out", "adapter", cwd=run)
    assert r.returncode == 0, r.stderr
    # the Trainer also saved adapter_model.safetensors (bf16, gathered): the tag's fp32 masters are taken, and said
    assert "taking the DeepSpeed tag checkpoint-2/global_step2/" in r.stderr, r.stderr
    assert "adapter_model.safetensors beside it (8 tensors, bfloat16" in r.stderr, r.stderr
    got = load_file(run / "adapter" / "adapter_model.safetensors")
    oracle = load_file(v / "oracle" / "adapter_state_fp32.safetensors")  # the live run's fp32 masters
    assert sorted(got) == sorted(oracle) and all(torch.equal(got[k], oracle[k]) for k in oracle)
    run_load_snippets([(snippet_after(r.stdout), run, name)])
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    _equal_files(run / "merged", _merge_oracle(v, run / "adapter"))


def _peft_config(path: Path) -> Path:
    from peft import LoraConfig

    # the run's settings (samples/hf_peft.py): an FSDP save writes no adapter_config.json of its own
    LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], base_model_name_or_path="base-model"
    ).save_pretrained(path)
    return path / "adapter_config.json"


def test_an_fsdp2_save_needs_the_runs_adapter_config_and_then_exports_and_merges(tmp_path):
    v = _copy("peft-fsdp2", tmp_path)
    run = v / "run"
    r = ckpt_tui("export", "checkpoint-2", "--out", "adapter", cwd=run)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    for word in (
        "r=4 on q_proj, v_proj",
        "lora_alpha",
        "use_rslora",
        "fan_in_fan_out",
        "lora_bias",
        "--adapter-config",
    ):
        assert word in r.stderr, (word, r.stderr)
    assert not (run / "adapter").exists()
    cfg = _peft_config(tmp_path / "cfg")
    r = ckpt_tui("export", "checkpoint-2", "--adapter-config", str(cfg), "--out", "adapter", cwd=run)
    assert r.returncode == 0, r.stderr
    got = load_file(run / "adapter" / "adapter_model.safetensors")
    oracle = load_file(v / "oracle" / "adapter_state.safetensors")
    assert sorted(got) == sorted(oracle) and all(torch.equal(got[k], oracle[k]) for k in oracle)
    assert (run / "adapter" / "adapter_config.json").read_bytes() == cfg.read_bytes()
    run_load_snippets([(snippet_after(r.stdout), run, "peft-fsdp2")])
    r = ckpt_tui("export", "checkpoint-2", "--adapter-config", str(cfg), "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    _equal_files(run / "merged", _merge_oracle(v, run / "adapter"))


def test_merge_then_dtype_is_merge_and_unload_then_to(tmp_path):
    v = _copy("peft-llama", tmp_path)
    run = v / "run"
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--dtype", "bf16", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    oracle = {k: t.to(torch.bfloat16) for k, t in _merge_oracle(v, run / "checkpoint-2").items()}
    _equal_files(run / "merged", oracle)


def test_merge_refuses_modules_to_save_on_a_tied_weight(tmp_path):
    from safetensors.torch import save_file

    v = _copy("peft-gpt2-rslora", tmp_path)  # GPT-2 ties lm_head to wte: its base file holds wte only
    ck = v / "run" / "checkpoint-2"
    sd = load_file(ck / "adapter_model.safetensors")
    sd["base_model.model.lm_head.weight"] = torch.zeros(256, 64)  # as PEFT saves modules_to_save=["lm_head"]
    save_file(sd, ck / "adapter_model.safetensors", metadata={"format": "pt"})
    doc = json.loads((ck / "adapter_config.json").read_text())
    doc["modules_to_save"] = ["lm_head"]
    (ck / "adapter_config.json").write_text(json.dumps(doc))
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=v / "run")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "modules_to_save `lm_head.weight`, a weight the base ties to another" in r.stderr, r.stderr
    assert not (v / "run" / "merged").exists()
