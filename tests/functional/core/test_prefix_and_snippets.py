"""Wrapper prefixes (a Lightning export strips the LightningModule's one attribute by default) and
the "Load it with" code: printed by the CLI and the TUI, run here exactly as printed."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from ckpt_tui.core.export.api import export, plan_export, screened_model, source_for
from ckpt_tui.core.verify import verify
from tests.snippets import run_load_snippets, snippet_after

ROOT = Path(__file__).resolve().parents[3]
LIGHTNING = ["lightning-fsdp", "lightning-ds-zero2", "lightning-ds-zero3"]
STRIPPED = "stripped the LightningModule attribute prefix `model.` from every name; --keep-prefix keeps it"


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=_env(),
    )


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def names_in(out: Path) -> set:
    got = set()
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            got |= set(h.keys())
    return got


def source_names(src) -> list:
    return [t.name for t in source_for(screened_model(src)[1]).tensors]


@pytest.mark.parametrize("name", LIGHTNING)
def test_lightning_export_strips_the_one_attribute_prefix(real_ckpt, tmp_path, name):
    src = real_ckpt(name)
    plain = source_names(src)
    assert plain and all(n.startswith("model.") for n in plain)  # LitLM.model = TinyLM()
    res = export(src, tmp_path / "default")
    assert names_in(tmp_path / "default") == {n[len("model.") :] for n in plain}
    assert res.stripped_prefix == "model." and STRIPPED in res.notes
    v = verify(tmp_path / "default", src)
    assert v.ok and v.compared == len(plain) and v.stripped_prefix == "model."
    # --keep-prefix: the LightningModule's own names; verify sees the export kept them
    keep = export(src, tmp_path / "keep", keep_prefix=True)
    assert names_in(tmp_path / "keep") == set(plain) and keep.stripped_prefix is None
    assert not any("stripped" in n for n in keep.notes)
    v = verify(tmp_path / "keep", src)
    assert v.ok and v.compared == len(plain) and v.stripped_prefix is None
    assert verify(tmp_path / "keep", src, keep_prefix=True).ok
    wrong = verify(tmp_path / "default", src, keep_prefix=True)  # the flag is honoured, not guessed over
    assert not wrong.ok and len(wrong.missing_in_output) == len(plain)
    # --strip-prefix P still forces P
    export(src, tmp_path / "forced", strip_prefix="model.layers.")
    assert names_in(tmp_path / "forced") == {n.removeprefix("model.layers.") for n in plain}
    assert verify(tmp_path / "forced", src, strip_prefix="model.layers.").ok


@pytest.mark.parametrize("name", ["hf-model-sharded", "hf-ds-zero2-tied-frozen", "megatron-legacy", "fsdp2-dcp"])
def test_no_prefix_is_stripped_outside_lightning(real_ckpt, tmp_path, name):
    """HF names (model.layers... + lm_head.weight; or only model.* besides a tied lm_head) are HF-style
    already; Megatron's language_model. is one first component too, but not a LightningModule's."""
    src = real_ckpt(name)
    plan, _ = plan_export(src, tmp_path / "out")
    assert plan.prefix.strip is None and not plan.prefix.lightning
    assert [t.name for f in plan.files for t in f.tensors] == [
        n for n in source_names(src) if n not in {a for a, _ in plan.dropped_tied}
    ]
    assert not any("LightningModule" in n for n in plan.to_plan().notes)


# -- the printed snippets, executed ------------------------------------------------------------------

# (fixture, extra export options, attribute `model` sits under for the snippet, form expected)
CASES = [
    ("hf-ds-zero2", [], None, "from_pretrained"),  # config.json beside the checkpoint
    ("hf-ds-zero2-tied-frozen", [], None, "from_pretrained"),
    ("hf-model-sharded", [], None, "from_pretrained"),
    ("lightning-fsdp", [], None, "load_state_dict"),
    ("lightning-ds-zero3", [], None, "load_state_dict"),
    ("lightning-ds-zero2", ["--keep-prefix"], "model", "load_state_dict"),  # `model` is the LightningModule
    ("fsdp2-dcp", [], None, "load_state_dict"),
    ("ds-zero3-bf16", [], None, "load_state_dict"),
    ("plain-pt", [], None, "load_state_dict"),
    ("ds-zero2-tied", ["--max-shard-size", "100KB"], None, "load_state_dict"),  # sharded AND tied
    ("ds-zero2-frozen", ["--exclude-frozen"], None, "load_state_dict"),  # strict=False: the frozen one stays out
]


@pytest.fixture(scope="module")
def exports(real_ckpt, tmp_path_factory):
    """Each case exported by the CLI the way a user does it: from the folder holding the checkpoint,
    with a relative --out. The fixtures are copied there (the cache is read-only)."""
    done = {}
    for name, opts, wrap, form in CASES:
        cwd = tmp_path_factory.mktemp(name)
        shutil.copytree(real_ckpt(name), cwd / name, symlinks=True)
        out = f"{name}-out"
        r = cli("export", name, "--out", out, *opts, cwd=cwd)
        assert r.returncode == 0, r.stderr
        done[name] = (cwd, out, r.stdout, wrap, form)
    return done


def test_printed_snippets_load_every_tensor(exports):
    cases = []
    for name, (cwd, out, stdout, wrap, form) in exports.items():
        snippet = snippet_after(stdout)
        assert (".from_pretrained(" in snippet) == (form == "from_pretrained"), (name, snippet)
        assert repr(out) in snippet  # --out as typed: relative
        cases.append((snippet, cwd, name, wrap))
    reports = run_load_snippets(cases, allow_missing={len(cases) - 1: {"embed_tokens.weight"}})
    assert [r["from_pretrained"] for r in reports] == [c[3] == "from_pretrained" for c in CASES]
    assert all(r["exported"] > 0 for r in reports)


def test_export_says_what_it_stripped_and_where_it_wrote(exports):
    cwd, out, stdout, _, _ = exports["lightning-ds-zero3"]
    assert f"params to {out} in " in stdout  # the Wrote line: --out as typed
    assert f"  note: {STRIPPED}" in stdout
    assert "what your LightningModule holds as `self.model`" in stdout
    assert "strict=True" in stdout and "from_pretrained" not in snippet_after(stdout)
    cwd, out, stdout, _, _ = exports["lightning-ds-zero2"]  # --keep-prefix
    assert "kept the LightningModule attribute prefix `model.` (--keep-prefix)" in stdout
    assert "`model` is your LightningModule" in stdout
    cwd, out, stdout, _, _ = exports["ds-zero2-tied"]
    assert "sd['lm_head.weight'] = sd['embed_tokens.weight']" in stdout and "model.safetensors.index.json" in stdout


def test_verify_passes_on_default_and_kept_lightning_exports(exports):
    for name, said in (("lightning-ds-zero3", "as export strips it"), ("lightning-ds-zero2", "the export kept")):
        cwd, out, _, _, _ = exports[name]
        r = cli("verify", out, "--against", name, cwd=cwd)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("✓ 17 tensors compared") and "0 missing" in r.stdout and said in r.stdout
    r = cli("export", "x", "--out", "y", "--keep-prefix", "--strip-prefix", "model.", cwd=exports["plain-pt"][0])
    assert r.returncode == 2 and "contradict" in r.stderr


# -- single-file Lightning .ckpt (the `state_dict` entry), one attribute and several ------------------

GEN = r"""
import sys
from pathlib import Path
import lightning as L
import torch
from torch import nn
from ckpt_tui.samples._common import batch, seed_all
from ckpt_tui.samples.lightning_ckpt import module_cls

One = module_cls()  # the LightningModule the lightning fixtures train: self.model = TinyLM()

class Two(One):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 8)

out = Path(sys.argv[1])
for cls, name in ((One, "one.ckpt"), (Two, "two.ckpt")):
    seed_all()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(out))
    trainer.fit(cls(), torch.utils.data.DataLoader([batch(i, 0, bs=1)[0] for i in range(2)], batch_size=2))
    trainer.save_checkpoint(out / name)
"""


@pytest.fixture(scope="module")
def lightning_files(tmp_path_factory):
    """Two .ckpt files written by a real Lightning Trainer (fit 1 step, save_checkpoint)."""
    d = tmp_path_factory.mktemp("lit")
    r = subprocess.run([sys.executable, "-c", GEN, str(d)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def test_lightning_ckpt_files_one_attribute_stripped_several_kept(lightning_files):
    d = lightning_files
    one = cli("export", "one.ckpt", "--out", "one-out", cwd=d)
    two = cli("export", "two.ckpt", "--out", "two-out", cwd=d)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert "weights taken from the file's `state_dict` entry" in one.stdout and STRIPPED in one.stdout
    assert all(not n.startswith("model.") for n in names_in(d / "one-out"))
    assert "nothing stripped" in two.stdout and "`head.`, `model.`" in two.stdout
    assert {n.split(".")[0] for n in names_in(d / "two-out")} == {"model", "head"}
    assert "`model` is your LightningModule" in two.stdout
    run_load_snippets(
        [(snippet_after(one.stdout), d, "lightning-file-one"), (snippet_after(two.stdout), d, "lightning-file-two")]
    )
    v = verify(d / "one-out", d / "one.ckpt")  # torch.load of the file's state_dict entry
    assert v.ok and v.compared == 17 and v.stripped_prefix == "model."
    v = verify(d / "two-out", d / "two.ckpt")
    assert v.ok and v.compared == 19 and v.stripped_prefix is None


def test_the_readme_example_is_what_export_prints(real_ckpt, tmp_path):
    text = (ROOT / "docs" / "export.md").read_text()  # the export guide's example
    block = text[text.index("$ ckpt-tui export lightning-run --out merged\n") :]
    block = block[: block.index("```")]
    command, note, *code = block.splitlines()
    shutil.copytree(real_ckpt("lightning-ds-zero2"), tmp_path / "lightning-run")
    r = cli(*command.split()[2:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert note + "\n" in r.stdout
    printed = r.stdout[r.stdout.index("Load it with:\n") :].splitlines()
    assert printed == code
    run_load_snippets([(snippet_after(r.stdout), tmp_path, "lightning-ds-zero2")])
