"""`export --merge` (issue 23) beyond the arithmetic: what it refuses, what it does not import, what it copies.

- Refusals, each with its reason on one line, exit 1, no traceback, nothing written: a LoRA on a
  MultiheadAttention, `target_parameters`, `trainable_token_indices` and a LoRA on a tied weight. The adapters
  are made by PEFT itself (`get_peft_model(...).save_pretrained`) on tiny models built here: the shared fixtures
  hold none of these, and PEFT is what writes them in the wild.
- The merge imports neither peft nor transformers: the CLI runs under a meta path finder that refuses both (and
  logs every attempt), and writes what a plain run writes, tensor for tensor.
- The merged folder's tokenizer is the checkpoint's where it has one (all its files, none of the base's), else
  the base's; its generation_config.json is the base's, never a checkpoint's.

Layout as the fixtures (samples/hf_peft.py): `base-model/` beside `run/checkpoint-2/`, the user in `run/`; the
fixtures record the base as `base-model`, the adapters built here as that folder's absolute path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures import fixture_path
from tests.util import ckpt_tui

ROOT = Path(__file__).resolve().parents[3]


def _copy(name: str, tmp_path: Path) -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_path(name), d, symlinks=True)
    return d


def _tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _tensors(out: Path) -> dict[str, torch.Tensor]:
    got: dict[str, torch.Tensor] = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(load_file(f))
    return got


# ---------------------------------------------------------------- refusals


def _llama():
    import transformers

    from ckpt_tui.samples._common import TINY_LLAMA  # the fixtures' model

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))


def _gpt2():
    import transformers

    torch.manual_seed(0)  # tie_word_embeddings: GPT-2's default, lm_head shares wte's weight
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


class _Toy(torch.nn.Module):
    """A model with an nn.MultiheadAttention, which PEFT's LoRA wraps as `lora.MultiheadAttention`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = torch.nn.Linear(16, 32)


def _save_toy(model: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    doc = {"architectures": ["Toy"], "model_type": "toy", "vocab_size": 32, "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(doc))


def _peft_run(tmp_path: Path, model: torch.nn.Module, **lora) -> Path:
    """`base-model/` (the model as saved) beside `run/checkpoint-2/` (PEFT's save_pretrained of a LoRA on it,
    lora_B set non-zero as training leaves it); the run's folder."""
    from peft import LoraConfig, get_peft_model

    v = tmp_path / "variant"
    (v / "base-model").mkdir(parents=True)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(v / "base-model")
    else:
        _save_toy(model, v / "base-model")
    # what get_peft_model records for a base loaded from that folder (an absolute path: PEFT looks for its
    # config.json there when it saves, and would ask the Hub for a path it cannot find)
    model.name_or_path = str(v / "base-model")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, **lora))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.02)
    peft_model.save_pretrained(v / "run" / "checkpoint-2")
    cfg = json.loads((v / "run" / "checkpoint-2" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(v / "base-model"), cfg
    return v / "run"


def _refused(run: Path, *words: str) -> str:
    """The merge of `checkpoint-2` refused: exit 1, no traceback, the reason on one line naming every word, and
    nothing written (no --out, nothing left beside it). The line, returned."""
    before = _tree(run.parent)
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and not r.stdout.strip(), r.stderr
    lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    # one reason: a line saying it all, or a header (cannot merge … into the base in …:) and one such line
    assert 1 <= len(lines) <= 2, r.stderr
    said = [ln for ln in lines if all(w in ln for w in words)]
    assert len(said) == 1, (words, r.stderr)
    line = said[0]
    assert not (run / "merged").exists()
    assert _tree(run.parent) == before  # no staging folder or partial file left anywhere
    return line


def test_merge_refuses_a_lora_on_a_multihead_attention(tmp_path):
    # PEFT wraps the whole nn.MultiheadAttention (its packed in_proj_weight) and, always, its out_proj: it merges
    # them by its own path, which a W + B·A·s per weight does not cover
    run = _peft_run(tmp_path, _Toy(), target_modules=["attn"])
    saved = load_file(run / "checkpoint-2" / "adapter_model.safetensors")
    assert "base_model.model.attn.lora_A.weight" in saved
    assert "base_model.model.attn.base_layer.out_proj.lora_A.weight" in saved
    line = _refused(run, "MultiheadAttention", "`attn`")
    assert "out_proj" not in line  # PEFT's LoRA on the out_proj is part of it, not another problem


def test_merge_refuses_target_parameters(tmp_path):
    # a LoRA on a parameter (ParamWrapper): PEFT saves it under the names of a LoRA on the module, so only the
    # config tells it apart from one a plain merge computes
    run = _peft_run(tmp_path, _llama(), target_modules=[], target_parameters=["mlp.gate_proj.weight"])
    saved = load_file(run / "checkpoint-2" / "adapter_model.safetensors")
    assert "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight" in saved
    _refused(run, "target_parameters")


def test_merge_refuses_trainable_token_indices(tmp_path):
    run = _peft_run(tmp_path, _llama(), target_modules=["q_proj"], trainable_token_indices=[3, 5])
    saved = load_file(run / "checkpoint-2" / "adapter_model.safetensors")
    assert "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta" in saved
    _refused(run, "trainable_token_indices")


@pytest.mark.parametrize("key,value", [("trainable_token_indices", [3, 5]), ("target_parameters", ["q_proj.weight"])])
def test_merge_refuses_the_config_keys_whatever_the_tensors(key, value, tmp_path):
    # the key alone: tensors that read as a plain LoRA (peft-llama's) do not make the merge go through
    run = _copy("peft-llama", tmp_path) / "run"
    cfg = run / "checkpoint-2" / "adapter_config.json"
    doc = json.loads(cfg.read_text())
    doc[key] = value
    cfg.write_text(json.dumps(doc))
    _refused(run, key)


@pytest.mark.parametrize(
    "targets,module",
    [(["lm_head"], "`lm_head`"), (["wte", "c_attn"], "`transformer.wte`")],
    ids=["lm_head", "wte"],
)
def test_merge_refuses_a_lora_on_a_tied_weight(targets, module, tmp_path):
    # GPT-2 ties lm_head to wte: its base file holds wte only, and a merge into one changes the other
    run = _peft_run(tmp_path, _gpt2(), target_modules=targets, fan_in_fan_out="c_attn" in targets)
    assert "lm_head.weight" not in load_file(run.parent / "base-model" / "model.safetensors")
    line = _refused(run, module, "ties")
    assert "c_attn" not in line


# ---------------------------------------------------------------- no peft, no transformers

# a meta path finder that refuses peft and transformers (and their submodules), logging each attempt to $BLOCK_LOG
BLOCKER = """
import importlib.abc, os, sys

class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("peft", "transformers"):
            with open(os.environ["BLOCK_LOG"], "a") as f:
                f.write(name + "\\n")
            raise ImportError(f"{name}: blocked by the test")
        return None

sys.meta_path.insert(0, _Refuse())
"""
CLI = BLOCKER + "from ckpt_tui.cli import main\nmain()\n"


def _blocked(code: str, *args: str, cwd: Path, log: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), BLOCK_LOG=str(log))
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_blocker_blocks(tmp_path):
    # the test below proves nothing unless the finder really stands in the way
    log = tmp_path / "log"
    r = _blocked(BLOCKER + "import transformers\n", cwd=tmp_path, log=log)
    assert r.returncode != 0 and "ImportError: transformers: blocked by the test" in r.stderr, r.stderr
    r = _blocked(BLOCKER + "from peft import PeftModel\n", cwd=tmp_path, log=log)
    assert r.returncode != 0 and "ImportError: peft: blocked by the test" in r.stderr, r.stderr
    assert log.read_text().split() == ["transformers", "peft"]


def test_merge_imports_neither_peft_nor_transformers(tmp_path):
    run = _copy("peft-llama", tmp_path) / "run"
    log = tmp_path / "imports.log"
    r = _blocked(CLI, "export", "checkpoint-2", "--merge", "--out", "blocked", cwd=run, log=log)
    assert r.returncode == 0, r.stderr
    assert not log.exists(), log.read_text()  # not even tried (a caught ImportError would hide behind a fallback)
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "plain", cwd=run)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (run / "blocked").iterdir()) == sorted(p.name for p in (run / "plain").iterdir())
    got, want = _tensors(run / "blocked"), _tensors(run / "plain")
    assert got and sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
    base = load_file(run.parent / "base-model" / "model.safetensors")
    assert any(not torch.equal(got[k], base[k]) for k in base)  # a merge, not a copy of the base
    for name in ("config.json", "generation_config.json"):
        assert (run / "blocked" / name).read_bytes() == (run / "plain" / name).read_bytes(), name


# ---------------------------------------------------------------- tokenizer and generation config


def _tokenizer(folder: Path, tag: str, files: tuple[str, ...]) -> dict[str, bytes]:
    """A small tokenizer file set written into ``folder``, its contents marked with ``tag``; name -> bytes."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, f"{tag}-a": 3, f"{tag}-b": 4}
    docs = {
        "tokenizer.json": {
            "version": "1.0",
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": None,
            "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        },
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "model_max_length": 64,
            "comment": tag,
        },
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "pad_token": f"<{tag}-pad>"},
    }
    out = {}
    for name in files:
        text = json.dumps(docs[name], indent=2) if name in docs else f"{{# {tag} #}}{{{{ messages }}}}\n"
        (folder / name).write_text(text)
        out[name] = text.encode()
    return out


TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
BASE_TOKENIZER = (*TOKENIZER, "special_tokens_map.json", "chat_template.jinja")


def _generation_configs(v: Path) -> bytes:
    """The base's generation_config.json (one written if the fixture has none); a checkpoint's own beside it,
    which the merge must not take. The base's bytes."""
    gen = v / "base-model" / "generation_config.json"
    if not gen.is_file():
        gen.write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, "max_length": 48}))
    (v / "run" / "checkpoint-2" / "generation_config.json").write_text(json.dumps({"max_length": 7, "run": 1}))
    return gen.read_bytes()


def test_merged_folder_takes_the_checkpoints_tokenizer_whole_and_the_bases_generation_config(tmp_path):
    v = _copy("peft-llama", tmp_path)
    run = v / "run"
    _tokenizer(v / "base-model", "base", BASE_TOKENIZER)
    ours = _tokenizer(run / "checkpoint-2", "run", TOKENIZER)
    gen = _generation_configs(v)
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    out = run / "merged"
    for name, text in ours.items():
        assert (out / name).read_bytes() == text, name
    # the checkpoint's tokenizer is a whole: none of the base's files beside it (the base's special_tokens_map
    # would set another pad token on the run's tokenizer, its chat template another template)
    assert not (out / "special_tokens_map.json").exists() and not (out / "chat_template.jinja").exists()
    assert (out / "generation_config.json").read_bytes() == gen
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == json.loads((v / "base-model" / "config.json").read_text())


def test_merged_folder_takes_the_bases_tokenizer_where_the_checkpoint_has_none(tmp_path):
    v = _copy("peft-llama", tmp_path)
    run = v / "run"
    base = _tokenizer(v / "base-model", "base", BASE_TOKENIZER)
    gen = _generation_configs(v)
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    out = run / "merged"
    for name, text in base.items():
        assert (out / name).read_bytes() == text, name
    assert (out / "generation_config.json").read_bytes() == gen


# ---------------------------------------------------------------- fan_in_fan_out, layer by layer


@pytest.mark.parametrize(
    "targets",
    [
        ["attn.c_proj", "lm_head"],  # the Linear wrapped last: PEFT saves fan_in_fan_out false, c_proj was a Conv1D
        ["lm_head", "attn.c_proj"],
        ["attn.c_attn", "mlp.c_fc"],  # every target a Conv1D: saved true
    ],
)
def test_fan_in_fan_out_is_each_layers_as_peft_merged_it(targets, tmp_path):
    """PEFT decides fan_in_fan_out per layer by the base module's type (Conv1D or nn.Linear) and rewrites the saved
    value as it wraps each layer: the saved one is the last wrapped layer's. An untied GPT-2 with a LoRA on a square
    Conv1D (attn.c_proj) and on lm_head: the merge is bit-exact with merge_and_unload() whatever the saved value."""
    import transformers
    from peft import PeftModel

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_embd=64, n_layer=1, n_head=4, vocab_size=256, n_positions=64, tie_word_embeddings=False
    )
    run = _peft_run(tmp_path, transformers.GPT2LMHeadModel(cfg), target_modules=targets, fan_in_fan_out=True)
    r = ckpt_tui("export", "checkpoint-2", "--merge", "--out", "merged", cwd=run)
    assert r.returncode == 0, r.stderr
    base = transformers.GPT2LMHeadModel.from_pretrained(run.parent / "base-model")
    oracle = PeftModel.from_pretrained(base, run / "checkpoint-2").merge_and_unload().state_dict()
    got = _tensors(run / "merged")
    changed = [k for k in got if k.endswith(".weight") and any(t.split(".")[-1] in k for t in targets)]
    assert changed, sorted(got)
    for k, t in got.items():
        assert torch.equal(t, oracle[k]), k


def test_fan_in_fan_out_of_a_remote_code_base_is_refused(tmp_path):
    """A base of its own code (auto_map in config.json) with an adapter saying fan_in_fan_out: whether a layer was a
    Conv1D cannot be told from files, so the merge is refused rather than guessed."""
    run = _copy("peft-gpt2-rslora", tmp_path) / "run"
    base = run.parent / "base-model"
    cfg = json.loads((base / "config.json").read_text())
    cfg["model_type"] = "my-gpt"
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_my.MyGPT"}
    (base / "config.json").write_text(json.dumps(cfg))
    _refused(run, "auto_map", "fan_in_fan_out", "Conv1D")
