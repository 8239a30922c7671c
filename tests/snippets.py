"""Run the "Load it with" code an export printed, exactly as printed, and check that it loads.

    run_load_snippet(snippet, cwd, "lightning-ds-zero3")   # raises AssertionError if it does not load

The snippet runs in a fresh Python process whose current folder is ``cwd`` (where the user ran the
export: the output path in the snippet is relative to it). A ``load_state_dict`` snippet gets
``model`` bound to a freshly built model of the fixture's architecture -- the classes
``ckpt_tui/samples/`` trains -- with every floating tensor set to NaN first, so a tensor the
snippet does not load cannot pass; a ``from_pretrained`` snippet gets nothing bound. Then every
exported tensor must be in ``model.state_dict()`` and equal to it (in the model's dtype), and every
key of the model must be exported or share its storage with one that is (a tied twin): no
missing, no unexpected key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ckpt_tui import samples

ROOT = Path(__file__).resolve().parents[1]

# fixture -> (architecture, attribute the model sits under in the object `model` names, or None)
TINYLM = (
    "ds-zero1-bf16",
    "ds-zero2-bf16",
    "ds-zero3-bf16",
    "ds-zero2-fp32",
    "ds-zero1-frozen",
    "ds-zero2-frozen",
    "ds-zero3-frozen",
    "ds-zero2-3ranks",
    "ds-zero3-3ranks",
    "universal",
    "universal-zero2",
    "fsdp1-dcp",
    "fsdp2-dcp",
    "fsdp2-zstd",
    "hf-storage-distributed",
    "hf-storage-single",
    "dcp-mixed",
    "fsdp-full",
    "dcp-ranklocal",
    "dcp-safetensors",
    "dcp-fs-safetensors",
    "accelerate-save-state",
    "plain-pt",
    "plain-pt-optim",
    "plain-pt-optim-groups",
    "demo",
    # Lightning: the default export strips the LightningModule's `model.`, so `model` is what it holds
    "lightning-ds-zero2",
    "lightning-ds-zero3",
    "lightning-fsdp",
    "lightning-file-optim",
)
LLAMA = ("hf-ds-zero1", "hf-ds-zero2", "hf-ds-zero3", "hf-fsdp1", "hf-fsdp2", "hf-model-sharded", "hf-model-bin")
MODELS: dict[str, tuple[str, str | None]] = {
    **{f: ("tinylm", None) for f in TINYLM},
    **{f: ("llama", None) for f in LLAMA},
    "ds-zero2-tied": ("tinylm-tied", None),
    # DeepSpeed beyond ZeRO-1/2/3 (samples/ds_beyond.py); the pipeline's layers as one nn.Sequential: the
    # names a PipelineModule gives them (<layer index>.<parameter>)
    **{f: ("tinylm", None) for f in ("ds-zero0-bf16", "ds-zero0-fp32", "ds-bf16-optimizer")},
    "ds-pipeline": ("tinylm-pipeline", None),
    # DeepSpeed MoE (samples/ds_moe.py): its model holds deepspeed's MoE layers, which the runner does not build; a
    # tree of the exported names stands in (test_ds_moe loads the export strict into the real model)
    **{f: ("tensors", None) for f in ("ds-moe-ep2-zero2-bf16", "ds-moe-ep1-zero2-fp32", "ds-moe-ep2-zero1-bf16")},
    "hf-ds-zero2-tied-frozen": ("llama-tied", None),
    "megatron-legacy": ("tinylm", "language_model"),  # torch.save({"model": {"language_model": sd}})
    # megatron-core's GPTModel and torchtitan's Llama3 live in their own venv, not the tests': a module tree of the
    # exported names and shapes stands in (their oracles are the frameworks' own loads, in test_megatron_torchtitan)
    "megatron-dist": ("tensors", None),
    "megatron-dist-019": ("tensors", None),
    "megatron-pp2": ("tensors", None),
    "megatron-tp2pp2": ("tensors", None),
    "megatron-pp2-016": ("tensors", None),
    "megatron-tp2pp2-016": ("tensors", None),
    **{f: ("tensors", None) for g in ("megatron_hf", "megatron_hf_016") for f in samples.GROUPS[g].variants},
    # no advice of theirs exports today (a resume fixture, verl, FSDP's per-rank files); the generic tree stands in
    # so that a future export advice runs its snippet rather than failing on a missing entry
    **{f: ("tensors", None) for f in ("ds-resume-zero2", "ds-resume-zero3", "fsdp-local", "verl-fsdp1", "verl-fsdp2")},
    "torchtitan": ("tensors", None),
    "torchtitan-hf": ("tensors", None),
    # PEFT LoRA runs (samples/hf_peft.py): their exports load by from_pretrained (PeftModel's or the merged
    # model's); a load_state_dict snippet of one would be a defect the "tensors" tree would still catch
    **{
        f: ("tensors", None)
        for f in (
            "peft-llama",
            "peft-llama-bias-bf16",
            "peft-gpt2-rslora",
            "peft-llama-resized",
            "peft-ddp-mts",
            "peft-ds-zero2",
            "peft-ds-zero3",
            "peft-fsdp2",
            "peft-fsdp1",
            "full-gpt2-optim",
            "full-llama-bias-optim",
        )
    },
    # saves gone wrong (samples/hf_broken.py): the Trainer's tiny Llama, a TinyLM with a never-called `unused`
    # Linear (a tree of the exported names stands in), a ZeRO-3 PEFT adapter
    **{
        f: ("llama", None)
        for f in ("hf-killed-save", "hf-rotation-killed", "hf-model-only", "hf-ds-model-only", "full-ddp-model-only")
    },
    "zero3-ungathered": ("llama", None),
    "dcp-optim-nograd": ("tensors", None),
    "zero3-peft-ungathered": ("tensors", None),
    "fsdp2-rank0-slice": ("tinylm", None),  # export reads its DCP: the whole TinyLM
    # single-file Lightning .ckpt files made by tests/functional/core/test_prefix_and_snippets.py
    "lightning-file-one": ("tinylm", None),  # self.model = TinyLM()
    "lightning-file-two": ("tinylm+head", None),  # self.model = TinyLM(); self.head = nn.Linear(64, 8)
}

_RUNNER = r"""
import ast, json, os, sys
import torch
from torch import nn
from safetensors.torch import load_file

def build(arch, out):
    if arch in ("tinylm", "tinylm-tied"):
        from ckpt_tui.samples._common import TinyLM
        return TinyLM(tied=arch == "tinylm-tied")
    if arch == "tinylm+head":  # a LightningModule's attributes: its state_dict names are theirs
        from ckpt_tui.samples._common import TinyLM
        m = nn.Module()
        m.model, m.head = TinyLM(), nn.Linear(64, 8)
        return m
    if arch == "tinylm-pipeline":  # samples/ds_beyond.py's PipelineModule layers, in one module
        from ckpt_tui.samples._common import Block
        return nn.Sequential(nn.Embedding(256, 64), Block(64), Block(64), nn.LayerNorm(64), nn.Linear(64, 256, bias=False))
    if arch in ("llama", "llama-tied"):
        from transformers import LlamaConfig, LlamaForCausalLM
        from ckpt_tui.samples._common import TINY_LLAMA
        return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, tie_word_embeddings=arch == "llama-tied"))
    if arch == "tensors":  # a module tree holding a parameter of each exported name and shape
        root = nn.Module()
        for f in sorted(os.listdir(out)):
            if f.endswith(".safetensors"):
                for name, t in load_file(os.path.join(out, f)).items():
                    *path, leaf = name.split(".")
                    m = root
                    for p in path:
                        if not hasattr(m, p):
                            m.add_module(p, nn.Module())
                        m = getattr(m, p)
                    m.register_parameter(leaf, nn.Parameter(torch.empty_like(t)))
        return root
    raise SystemExit(f"unknown architecture {arch}")

def out_folder(snippet):
    # the folder it names first; a PEFT snippet names the base first, then the exported adapter: the last
    found = [
        node.value for node in ast.walk(ast.parse(snippet))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and os.path.isdir(node.value)
    ]
    if not found:
        raise SystemExit("the snippet names no existing output folder")
    return found[-1] if "PeftModel.from_pretrained(" in snippet else found[0]

results = []
for case in json.loads(sys.stdin.read()):
    os.chdir(case["cwd"])
    snippet = case["snippet"]
    out = out_folder(snippet)
    ns = {}
    if ".from_pretrained(" not in snippet:
        model = build(case["arch"], out)
        with torch.no_grad():
            for t in model.state_dict().values():
                if t.is_floating_point():
                    t.fill_(float("nan"))
        if case["wrap"]:
            holder = nn.Module()
            holder.add_module(case["wrap"], model)
            model = holder
        ns["model"] = model
    exec(compile(snippet, "<printed snippet>", "exec"), ns)
    model = ns["model"]
    exported = {}
    for f in sorted(os.listdir(out)):  # an optimizer export beside the model ("both") is not the model's
        if f.endswith(".safetensors") and not f.startswith("optimizer"):
            exported.update(load_file(os.path.join(out, f)))
    if "PeftModel.from_pretrained(" in snippet:  # a LoRA adapter: what PEFT saves of the model is the export
        from peft import get_peft_model_state_dict
        # a run that added tokens: PEFT saved the resized embedding layers whole (save_embedding_layers), which
        # it decides by finding the base's config.json from the cwd; from here it may not: say so, as it did
        resized = any(".original_module." in k for k in exported)
        sd = get_peft_model_state_dict(model, save_embedding_layers=True if resized else "auto")
    else:
        sd = model.state_dict()
    owners = {sd[k].untyped_storage().data_ptr() for k in exported if k in sd}
    results.append({
        "out": out, "from_pretrained": ".from_pretrained(" in snippet, "exported": len(exported),
        "unexpected": sorted(set(exported) - set(sd)),
        "missing": sorted(k for k in sd if k not in exported and sd[k].untyped_storage().data_ptr() not in owners),
        "unequal": sorted(k for k, v in exported.items() if k in sd and not torch.equal(sd[k], v.to(sd[k].dtype))),
    })
print(json.dumps(results))
"""


def snippet_after(stdout: str, marker: str = "Load it with:") -> str:
    """The code a command printed after ``marker``, indented by two spaces, dedented as the user
    would paste it."""
    _, found, rest = stdout.partition(marker + "\n")
    assert found, f"no {marker!r} in:\n{stdout}"
    lines = []
    for line in rest.splitlines():
        if line and not line.startswith("  "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip("\n") + "\n"


def run_load_snippets(cases: list[tuple], allow_missing: dict[int, set[str]] | None = None) -> list[dict]:
    """:func:`run_load_snippet` for several (snippet, cwd, fixture[, wrap]) in one process (torch
    is imported once). ``allow_missing``: case index -> keys the export left out on purpose
    (--exclude-frozen). Returns each case's report; raises AssertionError naming the failures."""
    allow_missing = allow_missing or {}
    payload = []
    for case in cases:
        snippet, cwd, fixture = case[:3]
        arch, wrap = MODELS[fixture]
        if len(case) > 3 and case[3] is not None:
            wrap = case[3]
        payload.append({"snippet": snippet, "cwd": str(cwd), "arch": arch, "wrap": wrap})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps(payload), capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, f"the snippet failed:\n{r.stderr[-4000:]}\n--- snippets ---\n" + "\n---\n".join(
        p["snippet"] for p in payload
    )
    reports = json.loads(r.stdout.strip().splitlines()[-1])
    bad = [
        (case[2], rep)
        for i, (case, rep) in enumerate(zip(cases, reports))
        if rep["unexpected"]
        or set(rep["missing"]) != allow_missing.get(i, set())
        or rep["unequal"]
        or not rep["exported"]
    ]
    assert not bad, "snippets that did not load the export:\n" + "\n".join(f"{f}: {rep}" for f, rep in bad)
    return reports


def run_load_snippet(snippet: str, cwd: Path, fixture_name: str, wrap: str | None = None) -> dict:
    """Execute ``snippet`` (as printed, dedented) with the current folder ``cwd``; ``model`` is bound
    to a fresh model of ``fixture_name``'s architecture (held under attribute ``wrap`` of an outer
    module if given, e.g. ``"model"`` for an export that kept a LightningModule's prefix) unless it is
    a from_pretrained snippet. Asserts it loads every tensor, equal, with no missing or unexpected
    key; returns the report ({"exported", "missing", "unexpected", "unequal", "from_pretrained"})."""
    return run_load_snippets([(snippet, cwd, fixture_name, wrap)])[0]


def run_printed(code: str, cwd: Path, expr: str):
    """Run ``code`` (printed by a command, as printed) in a fresh Python in ``cwd``, then return the JSON
    value of ``expr`` evaluated after it (``expr`` names what the code bound: ``sd``, ``config``...)."""
    check = code + f"\nimport json as _j, sys as _s\n_s.stdout.write('\\n' + _j.dumps({expr}))\n"
    p = subprocess.run([sys.executable, "-c", check], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])
