"""The rest of a ``--to hf`` folder and its plumbing (issue 27's leftovers), on the real Megatron-Core and torchtitan
saves of samples/megatron_hf.py and samples/torchtitan_hf.py:

- the tokenizer and generation_config.json copied (``--tokenizer DIR``, ``--config``'s folder, torchtitan's
  ``hf_assets_path``, Megatron-LM's ``--tokenizer-model``), loaded back by ``AutoTokenizer.from_pretrained``; a tiny
  real tokenizer trained by the ``tokenizers`` library and saved by transformers itself; a symbolic link out of the
  folder never followed (the hand-made attack: a link to a canary file);
- ``--config`` against the run's own record: every value both give must agree;
- ``export_needs(to="hf")``: the bytes the export writes, as written;
- sharded output (``--max-shard-size``): an index ``from_pretrained`` loads, megatron's logits;
- the distributed export (torchrun, two ranks) of ``--to hf``: byte-identical to the single-process one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.export.api import export, export_needs, resolve
from ckpt_tui.core.export.write import ExportError
from ckpt_tui.core.report import inspect

transformers = pytest.importorskip("transformers")

TOL = 1e-4
TEXT = "the quick brown fox jumps over the lazy dog"
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def tiny_tokenizer(folder: Path, *, named_template: bool = False) -> Path:
    """A real byte-level BPE tokenizer trained by ``tokenizers``, saved by transformers' own save_pretrained
    (tokenizer.json, tokenizer_config.json, chat_template.jinja; ``named_template``: a dict of chat templates,
    saved as chat_template.jinja + additional_chat_templates/tool_use.jinja)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([TEXT] * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = {"default": TEMPLATE, "tool_use": "TOOLS " + TEMPLATE} if named_template else TEMPLATE
    fast.save_pretrained(folder)
    return folder


def _same_tokenizer(out: Path, ref: Path) -> None:
    got, want = transformers.AutoTokenizer.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(ref)
    ids = want(TEXT).input_ids
    assert got(TEXT).input_ids == ids and len(ids) < len(TEXT.split()) * 2  # merges learnt, not bytes
    assert got.decode(ids) == TEXT and got.eos_token == "</s>"
    chat = [{"role": "user", "content": "hi"}]
    assert got.apply_chat_template(chat, tokenize=False) == want.apply_chat_template(chat, tokenize=False) == "<user>hi"


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _rel(folder: Path, root: Path, oracle: str = "oracle/logits.pt") -> float:
    o = torch.load(root / oracle, weights_only=True)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        got = model(o["ids"]).logits
    return ((got - o["logits"]).abs().max() / o["logits"].abs().max()).item()


@pytest.fixture
def base(real_ckpt, tmp_path) -> Path:
    """The HF folder the run "started from": megatron-hf-tp2's own config.json (as --to hf writes it), a
    generation_config.json and a tiny real tokenizer."""
    first = tmp_path / "first"
    export(real_ckpt("megatron-hf-tp2") / "checkpoints", first, to="hf")
    b = tiny_tokenizer(tmp_path / "base", named_template=True)
    shutil.copy(first / "config.json", b / "config.json")
    (b / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "temperature": 0.6}))
    return b


# ---------------------------------------------------------------- the tokenizer


def test_config_folder_gives_the_tokenizer_and_generation_config(real_ckpt, tmp_path, base):
    root = real_ckpt("megatron-hf-tp2")
    out = tmp_path / "hf"
    res = export(root / "checkpoints", out, to="hf", config=base)
    assert res.verified
    names = "additional_chat_templates/tool_use.jinja, chat_template.jinja, tokenizer.json, tokenizer_config.json"
    assert any(n.startswith("tokenizer copied from") and "(--config's folder)" in n for n in res.notes), res.notes
    assert sorted(_files(out)) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", *names.split(", ")]
    )
    for name in names.split(", "):
        assert (out / name).read_bytes() == (base / name).read_bytes(), name
    _same_tokenizer(out, base)
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template["tool_use"].startswith("TOOLS ")
    assert transformers.GenerationConfig.from_pretrained(out).temperature == 0.6
    assert _rel(out, root) <= TOL  # and the weights are megatron's, as without --config


def test_tokenizer_option_and_its_refusals(real_ckpt, tmp_path, base):
    """--tokenizer DIR for a run whose checkpoint holds none (Megatron's never does); without --to hf, or a folder
    with no tokenizer, refused; none found anywhere: said."""
    src = real_ckpt("megatron-hf-tp1") / "checkpoints"
    tok = tiny_tokenizer(tmp_path / "tok")
    res = export(src, tmp_path / "hf", to="hf", tokenizer=tok)
    assert any(n.startswith("tokenizer copied from") and "(--tokenizer)" in n for n in res.notes), res.notes
    _same_tokenizer(tmp_path / "hf", tok)
    assert not (tmp_path / "hf/generation_config.json").exists()  # none in --tokenizer's folder or the run's
    res = export(src, tmp_path / "none", to="hf")
    assert any(n.startswith("no tokenizer found (looked in") and "--tokenizer DIR" in n for n in res.notes)
    assert sorted(_files(tmp_path / "none")) == ["config.json", "model.safetensors"]
    with pytest.raises(ExportError, match="--tokenizer goes with --to hf"):
        export(src, tmp_path / "x", tokenizer=tok)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="no tokenizer files there"):
        export(src, tmp_path / "x", to="hf", tokenizer=tmp_path / "empty")
    with pytest.raises(ExportError, match="--tokenizer .*nowhere: no such folder"):
        export(src, tmp_path / "x", to="hf", tokenizer=tmp_path / "nowhere")
    assert not (tmp_path / "x").exists()


def test_tokenizer_cli(real_ckpt, tmp_path):
    from tests.util import ckpt_tui

    tiny_tokenizer(tmp_path / "tok")
    src = str(real_ckpt("megatron-hf-tp1") / "checkpoints")
    r = ckpt_tui("export", src, "--to", "hf", "--tokenizer", "tok", "--out", "hf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = f"note: tokenizer copied from {tmp_path / 'tok'} (--tokenizer): tokenizer.json, tokenizer_config.json, "
    assert said + "chat_template.jinja" in r.stdout, r.stdout  # SRC given absolute: the folder absolute too
    r = ckpt_tui("export", src, "--tokenizer", "tok", "--out", "plain", cwd=tmp_path)
    assert r.returncode == 1 and "--tokenizer goes with --to hf" in r.stderr and "Traceback" not in r.stderr


def test_a_link_out_of_the_folder_is_never_followed(real_ckpt, tmp_path, base):
    """A tokenizer file that is a symbolic link to a file outside its folder (here a canary standing for someone's
    private file): in --config's folder the tokenizer is left out whole and said; given as --tokenizer, refused.
    A link inside the folder, and a Hugging Face cache snapshot's links into its blobs/, are copied."""
    src = real_ckpt("megatron-hf-tp2") / "checkpoints"
    canary = tmp_path / "secret.json"
    canary.write_text('{"CANARY": "private"}')
    (base / "tokenizer_config.json").unlink()
    (base / "tokenizer_config.json").symlink_to(canary)
    res = export(src, tmp_path / "hf", to="hf", config=base)
    said = [n for n in res.notes if "was not copied" in n and "tokenizer" in n]
    assert said and "tokenizer_config.json: it is a symbolic link to a file outside its folder" in said[0], res.notes
    assert sorted(_files(tmp_path / "hf")) == ["config.json", "generation_config.json", "model.safetensors"]
    assert not any(b"CANARY" in p.read_bytes() for p in (tmp_path / "hf").rglob("*") if p.is_file())
    with pytest.raises(ExportError, match="tokenizer_config.json: it is a symbolic link to a file outside its folder"):
        export(src, tmp_path / "x", to="hf", tokenizer=base)
    assert not (tmp_path / "x").exists()
    # a link inside the folder: its file copied (as a file)
    again = tiny_tokenizer(tmp_path / "again")
    linked = shutil.copytree(again, tmp_path / "linked")
    (linked / "real").mkdir()
    (linked / "tokenizer_config.json").rename(linked / "real/tokenizer_config.json")
    (linked / "tokenizer_config.json").symlink_to("real/tokenizer_config.json")
    export(src, tmp_path / "inside", to="hf", tokenizer=linked)
    assert not (tmp_path / "inside/tokenizer_config.json").is_symlink()
    _same_tokenizer(tmp_path / "inside", again)
    # a Hugging Face cache snapshot: every file a link into ../../blobs/
    repo = tmp_path / "hub/models--org--tiny"
    snap = repo / "snapshots/0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for p in again.iterdir():
        shutil.copy(p, repo / "blobs" / f"blob-{p.name}")
        (snap / p.name).symlink_to(Path("../../blobs") / f"blob-{p.name}")
    export(src, tmp_path / "cache", to="hf", tokenizer=snap)
    _same_tokenizer(tmp_path / "cache", again)


def test_megatron_tokenizer_model_in_the_args(real_ckpt, tmp_path, monkeypatch):
    """Megatron-LM's --tokenizer-model: a local folder is copied from; a hub name is said, never downloaded."""
    from ckpt_tui.core.formats.dcp import format as dcp_format

    src = real_ckpt("megatron-hf-tp2") / "checkpoints"
    args = dcp_format.megatron_args(inspect(src).inventory.root.find("iter_0000010"))
    tok = tiny_tokenizer(tmp_path / "tok")
    monkeypatch.setattr(dcp_format, "megatron_args", lambda node: {**args, "tokenizer_model": str(tok)})
    res = export(src, tmp_path / "hf", to="hf")
    assert any("(the run's --tokenizer-model)" in n for n in res.notes), res.notes
    _same_tokenizer(tmp_path / "hf", tok)
    monkeypatch.setattr(dcp_format, "megatron_args", lambda node: {**args, "tokenizer_model": "org/tiny"})
    res = export(src, tmp_path / "hub", to="hf")
    assert any("the run's tokenizer is 'org/tiny'" in n and "nothing is downloaded" in n for n in res.notes), res.notes


def test_torchtitan_hf_assets_path(real_ckpt_copy, tmp_path):
    """torchtitan's job config names hf_assets_path (Trainer.Config), relative to the run's working folder: the dump
    folder less dump_folder. Its tokenizer is copied and said; a folder that is not there is said."""
    v = real_ckpt_copy("torchtitan-hf")
    job = json.loads((v / "job_config.json").read_text())
    assets = tiny_tokenizer(v.parent / "assets/hf/tiny")  # torchtitan's layout: ./assets/hf/<model> beside ./outputs
    (assets / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    job.update(dump_folder=f"./{v.name}", hf_assets_path="./assets/hf/tiny")
    (v / "job_config.json").write_text(json.dumps(job))
    res = export(v / "checkpoint/step-2", tmp_path / "hf", to="hf")
    assert any("(torchtitan's hf_assets_path)" in n for n in res.notes), res.notes
    _same_tokenizer(tmp_path / "hf", assets)
    assert json.loads((tmp_path / "hf/generation_config.json").read_text()) == {"eos_token_id": 2}
    assert _rel(tmp_path / "hf", v, "oracle/logits-step-2.pt") <= TOL
    job.update(hf_assets_path="./assets/hf/gone")
    (v / "job_config.json").write_text(json.dumps(job))
    res = export(v / "checkpoint/step-2", tmp_path / "gone", to="hf")
    assert any("hf_assets_path './assets/hf/gone': no such folder here" in n for n in res.notes), res.notes


# ---------------------------------------------------------------- --config against the run's record


def test_config_must_agree_with_the_megatron_args(real_ckpt, tmp_path, base, monkeypatch):
    src = real_ckpt("megatron-hf-tp2") / "checkpoints"
    res = export(src, tmp_path / "ok", to="hf", config=base / "config.json")
    assert any("agrees with the run's Megatron-LM args on the" in n for n in res.notes), res.notes
    cfg = json.loads((base / "config.json").read_text())
    wrong = {
        **cfg,
        "rms_norm_eps": 1e-6,
        "hidden_act": "gelu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "num_hidden_layers": 3,
    }
    (base / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(ExportError) as e:
        export(src, tmp_path / "x", to="hf", config=base)
    msg = str(e.value)
    for said in (
        "hidden_act: --config says 'gelu', the run's Megatron-LM args 'silu' (swiglu)",
        "rms_norm_eps: --config says 1e-06, the run's Megatron-LM args 1e-05 (norm_epsilon)",
        "rope_theta: --config says 500000.0, the run's Megatron-LM args 10000.0 (rotary_base)",
        "num_hidden_layers: --config says 3, the run's Megatron-LM args 2 (num_layers)",
    ):
        assert said in msg, msg
    assert not (tmp_path / "x").exists()
    # the config's vocab below the padded one: the true vocabulary, said with --true-vocab-size
    (base / "config.json").write_text(json.dumps({**cfg, "vocab_size": 250}))
    res = export(src, tmp_path / "vocab", to="hf", config=base)
    assert any("--true-vocab-size 250 keeps the config's" in n for n in res.notes), res.notes
    # args that lack values (the config is then trusted for them) still must agree on the values they give
    from ckpt_tui.core.formats.dcp import format as dcp_format

    args = dcp_format.megatron_args(inspect(src).inventory.root.find("iter_0000010"))
    monkeypatch.setattr(dcp_format, "megatron_args", lambda node: {**args, "norm_epsilon": None})
    (base / "config.json").write_text(json.dumps({**cfg, "rope_theta": 500000.0, "rope_parameters": None}))
    with pytest.raises(ExportError, match="rope_theta: --config says 500000.0, the run's Megatron-LM args 10000.0"):
        export(src, tmp_path / "x", to="hf", config=base)


def test_config_must_agree_with_torchtitans_job_config(real_ckpt, tmp_path):
    root = real_ckpt("torchtitan-hf")
    good = tmp_path / "good"
    export(root / "checkpoint/step-1", good, to="hf")
    cfg = json.loads((good / "config.json").read_text())
    res = export(root / "checkpoint/step-1", tmp_path / "ok", to="hf", config=good)
    assert any("agrees with torchtitan's job config job_config.json" in n for n in res.notes), res.notes
    given = tmp_path / "config.json"
    given.write_text(
        json.dumps({**cfg, "num_key_value_heads": 4, "rope_parameters": {**cfg["rope_parameters"], "factor": 4.0}})
    )
    with pytest.raises(ExportError) as e:
        export(root / "checkpoint/step-1", tmp_path / "x", to="hf", config=given)
    assert "num_key_value_heads: --config says 4, torchtitan's job config job_config.json 2 (n_kv_heads)" in str(
        e.value
    )
    assert "rope factor: --config says 4.0, torchtitan's job config job_config.json 8.0 (rope.factor)" in str(e.value)


# ---------------------------------------------------------------- export_needs


@pytest.mark.parametrize(
    "variant, src, opts",
    [
        ("megatron-hf-tp2", "checkpoints", {}),
        ("megatron-hf-tp2", "checkpoints", {"dtype": "bf16", "true_vocab_size": 250}),
        ("megatron-hf-tp1", "checkpoints", {"max_shard_size": "100KB", "tokenizer": "TOK"}),
        ("torchtitan-hf", "checkpoint/step-2", {"dtype": "fp32"}),
    ],
)
def test_export_needs_counts_what_to_hf_writes(real_ckpt, tmp_path, variant, src, opts):
    """The free space the wizard and export's preflight ask of --to hf: the bytes it writes, every file of them
    (split and renamed tensors, the headers and index, config.json, the tokenizer copied) -- not the plain export's."""
    if opts.get("tokenizer"):
        opts = {**opts, "tokenizer": tiny_tokenizer(tmp_path / "tok")}
    rep = inspect(real_ckpt(variant) / src)
    node, _ = resolve(rep)
    need = export_needs(rep, node, to="hf", **opts)
    out = tmp_path / "out"
    export(real_ckpt(variant) / src, out, to="hf", verify=False, **opts)
    assert need == sum(_files(out).values())
    if "true_vocab_size" not in opts and "tokenizer" not in opts:
        assert need != export_needs(rep, node, **opts)  # to= counts


# ---------------------------------------------------------------- sharded and distributed


@pytest.mark.parametrize("variant", ["megatron-hf-tp2", "megatron-hf-tied"])
def test_sharded_output_loads_with_from_pretrained(real_ckpt, tmp_path, variant):
    from ckpt_tui.core.verify import verify

    root = real_ckpt(variant)
    out = tmp_path / "hf"
    res = export(root / "checkpoints", out, to="hf", max_shard_size="100KB")
    assert len(res.files) > 2 and (out / "model.safetensors.index.json").is_file()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(res.files)
    _, info = transformers.LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert _rel(out, root) <= TOL
    v = verify(out, root / "checkpoints")
    assert v.ok and v.compared == len(index["weight_map"]) and not v.not_in_reference, v


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_export_to_hf_matches_the_single_one(real_ckpt, tmp_path, base):
    """torchrun, two ranks: each writes its shards of the --to hf plan, rank 0 the index, config.json and the
    copied tokenizer; the folder is byte-identical to the single-process export, and megatron's logits."""
    root = real_ckpt("megatron-hf-tp2")
    args = ["export", str(root / "checkpoints"), "--to", "hf", "--max-shard-size", "100KB", "--tokenizer", str(base)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]), OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    single = tmp_path / "single"
    r = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args, "--out", str(single)], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    dist = tmp_path / "dist"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2"]
    r = subprocess.run(
        [*launcher, "--master_port", str(_free_port()), "-m", "ckpt_tui", *args, "--out", str(dist), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    note = next(n for n in json.loads(r.stdout)["result"]["notes"] if n.startswith("written by 2 ranks"))
    assert "rank 0: model-" in note and "rank 1: model-" in note, note
    files = _files(single)
    assert "tokenizer.json" in files and "model.safetensors.index.json" in files
    assert _files(dist) == files
    assert all((dist / n).read_bytes() == (single / n).read_bytes() for n in files)
    assert _rel(dist, root) <= TOL


def test_the_tokenizer_worked_example_runs_as_written(real_ckpt, tmp_path):
    """docs/export.md's tokenizer example: the run folder with a tokenizer/ saved by transformers beside
    checkpoints/; the folder it writes loads as a model (megatron's logits) and as that tokenizer."""
    from tests.functional.core.hf_mutations import run_worked_example

    v = run_worked_example(
        "### The tokenizer", real_ckpt("megatron-hf-tp2"), tmp_path, lambda v: tiny_tokenizer(v / "tokenizer")
    )
    assert _rel(v / "hf", v) <= TOL
    _same_tokenizer(v / "hf", v / "tokenizer")
