"""``--to hf``'s side files and its ``--config`` cross-check, table-tested on synthetic folders and records
(core/export/hf_folder.py, core/export/hf_agree.py); the real saves are tests/functional/core/test_to_hf_folder.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_tui.core.export.errors import ExportError
from ckpt_tui.core.export.hf_agree import check_config_agrees, config_values, megatron_values
from ckpt_tui.core.export.hf_folder import file_problem, tokenizer_names, torchtitan_assets_dir

# what Megatron-LM's args of a Llama 3.1-style run hold (the values --to hf compares)
ARGS = {
    "num_attention_heads": 4,
    "group_query_attention": True,
    "num_query_groups": 2,
    "kv_channels": 16,
    "hidden_size": 64,
    "ffn_hidden_size": 96,
    "num_layers": 2,
    "swiglu": True,
    "norm_epsilon": 1e-5,
    "rotary_base": 500000,
    "use_rope_scaling": True,
    "rope_scaling_factor": 8.0,
    "padded_vocab_size": 256,
    "untie_embeddings_and_output_weights": True,
}
# the HF config.json of the same model, as transformers 4 wrote it (legacy rope keys)
CONFIG = {
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,  # not compared: the args' is the training length
}


def _cfg(tmp_path: Path, **change: object) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in {**CONFIG, **change}.items() if v is not None}))
    return p


def test_a_config_that_agrees_says_so(tmp_path):
    notes = check_config_agrees(megatron_values(ARGS), _cfg(tmp_path), "the args")
    assert notes == [f"--config {tmp_path / 'config.json'} agrees with the args on the 16 values both give"]
    # transformers 5's rope_parameters read the same; a folder is read as its config.json
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, **{k: v for k, v in CONFIG["rope_scaling"].items()}}
    rope.pop("type")
    _cfg(tmp_path, rope_parameters=rope, rope_scaling=None, rope_theta=None)
    assert "16 values" in check_config_agrees(megatron_values(ARGS), tmp_path, "the args")[0]


@pytest.mark.parametrize(
    "change, said",
    [
        ({"num_key_value_heads": 4}, "num_key_value_heads: --config says 4, the args 2 (num_query_groups)"),
        ({"num_key_value_heads": None}, "num_key_value_heads: --config says 4, the args 2"),  # absent: MHA
        ({"head_dim": 32}, "head_dim: --config says 32, the args 16 (kv_channels)"),
        ({"hidden_act": "gelu"}, "hidden_act: --config says 'gelu', the args 'silu' (swiglu)"),
        ({"rms_norm_eps": 1e-6}, "rms_norm_eps: --config says 1e-06, the args 1e-05 (norm_epsilon)"),
        ({"rope_theta": 10000.0}, "rope_theta: --config says 10000.0, the args 500000.0 (rotary_base)"),
        ({"rope_scaling": None}, "rope_type: --config says 'default', the args 'llama3' (use_rope_scaling)"),
        (
            {"rope_scaling": {**CONFIG["rope_scaling"], "factor": 32.0}},  # type: ignore[dict-item]
            "rope factor: --config says 32.0, the args 8.0 (rope_scaling_factor)",
        ),
        ({"vocab_size": 300}, "vocab_size: --config says 300, the args 256 (padded_vocab_size)"),
        ({"num_hidden_layers": 4}, "num_hidden_layers: --config says 4, the args 2 (num_layers)"),
        ({"hidden_size": 128}, "hidden_size: --config says 128, the args 64 (hidden_size)"),
        ({"intermediate_size": 128}, "intermediate_size: --config says 128, the args 96 (ffn_hidden_size)"),
        (
            {"tie_word_embeddings": True},
            "tie_word_embeddings: --config says True, the args False (untie_embeddings_and_output_weights)",
        ),
        ({"model_type": "qwen2"}, "model_type 'qwen2'; --to hf writes Llama"),
    ],
)
def test_every_disagreement_is_named(tmp_path, change, said):
    with pytest.raises(ExportError) as e:
        check_config_agrees(megatron_values(ARGS), _cfg(tmp_path, **change), "the args")
    assert said in str(e.value)


def test_all_disagreements_at_once_and_only_values_both_give(tmp_path):
    with pytest.raises(ExportError) as e:
        check_config_agrees(megatron_values(ARGS), _cfg(tmp_path, hidden_act="gelu", num_hidden_layers=3), "the args")
    assert str(e.value).count("\n  ") == 2
    # args that lack a value: not compared (the config gives it); a config that lacks one: likewise
    args = {k: v for k, v in ARGS.items() if k not in ("norm_epsilon", "swiglu")}
    notes = check_config_agrees(megatron_values(args), _cfg(tmp_path, rms_norm_eps=1e-6, hidden_size=None), "the args")
    assert "on the 12 values both give" in notes[0]  # 16 less eps, hidden_act, hidden_size and head_dim (from it)


def test_a_smaller_config_vocab_is_the_true_vocabulary(tmp_path):
    notes = check_config_agrees(megatron_values(ARGS), _cfg(tmp_path, vocab_size=250), "the args")
    assert "--true-vocab-size 250 keeps the config's" in notes[1]


def test_config_values_defaults_as_transformers_reads_them(tmp_path):
    v = config_values(_cfg(tmp_path, num_key_value_heads=None, rope_scaling=None))
    assert v["groups"][1] == 4 and v["head_dim"][1] == 16 and v["rope_type"][1] == "default"
    with pytest.raises(ExportError, match="cannot read it as a config.json"):
        config_values(tmp_path / "nowhere.json")


# ---------------------------------------------------------------- torchtitan's hf_assets_path


@pytest.mark.parametrize(
    "dump, assets, made, found",
    [
        ("./outputs", "./assets/hf/tiny", "work/assets/hf/tiny", True),  # torchtitan's defaults' layout
        ("outputs", "assets/hf/tiny", "work/assets/hf/tiny", True),
        ("./work/outputs", "./assets/hf/tiny", "assets/hf/tiny", True),  # run from the folder above work/
        (".", "./assets/hf/tiny", "work/outputs/assets/hf/tiny", True),  # the dump folder was the working one
        ("./outputs", "./assets/hf/gone", "work/assets/hf/tiny", "no such folder here"),
        ("/elsewhere/outputs", "./assets/hf/tiny", "work/assets/hf/tiny", "which it does not record"),
        ("./other", "./assets/hf/tiny", "work/assets/hf/tiny", "which it does not record"),
    ],
)
def test_hf_assets_path_resolved_as_the_run_did(tmp_path, dump, assets, made, found):
    """The job config lies in the dump folder (tmp/work/outputs); a relative hf_assets_path is relative to the
    run's working folder: the dump folder less the dump_folder it records."""
    run = tmp_path / "work/outputs"
    run.mkdir(parents=True)
    (tmp_path / made).mkdir(parents=True, exist_ok=True)
    job = run / "job_config.json"
    job.write_text(json.dumps({"dump_folder": dump, "hf_assets_path": assets, "model_spec": {"model": {}}}))
    p, note = torchtitan_assets_dir(job)
    if found is True:
        assert p is not None and p.resolve() == (tmp_path / made).resolve() and note is None, note
    else:
        assert p is None and found in (note or ""), note


def test_hf_assets_path_of_an_older_job_config_and_none(tmp_path):
    (tmp_path / "tok").mkdir()
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model": {"hf_assets_path": str(tmp_path / "tok")}}))
    assert torchtitan_assets_dir(job) == (tmp_path / "tok", None)
    job.write_text(json.dumps({"model_spec": {}}))
    assert torchtitan_assets_dir(job) == (None, None)


# ---------------------------------------------------------------- links


def test_links_out_of_the_folder_are_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd").write_text("root:x:0:0")
    (secret / "t.jinja").write_text("{{ secret }}")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "merges.txt").symlink_to(secret / "passwd")
    (tok / "vocab.json").symlink_to("tokenizer.json")  # inside: fine
    (tok / "additional_chat_templates").symlink_to(secret)  # a linked folder: its files are outside
    assert tokenizer_names(tok) == [
        "tokenizer.json",
        "vocab.json",
        "merges.txt",
        "additional_chat_templates/t.jinja",
    ]
    problems = {n: file_problem(tok / n, tok) for n in tokenizer_names(tok)}
    assert problems == {
        "tokenizer.json": None,
        "vocab.json": None,
        "merges.txt": "it is a symbolic link to a file outside its folder",
        "additional_chat_templates/t.jinja": "it is a symbolic link to a file outside its folder",
    }
    (tok / "tokenizer_config.json").write_text("{not json")
    assert file_problem(tok / "tokenizer_config.json", tok) == "it is not valid JSON (corrupt)"


def test_a_hub_cache_snapshot_may_link_into_its_blobs(tmp_path):
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs/abc").write_text("{}")
    snap = repo / "snapshots/0123"
    snap.mkdir(parents=True)
    (snap / "tokenizer.json").symlink_to("../../blobs/abc")
    (snap / "merges.txt").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("x")
    assert file_problem(snap / "tokenizer.json", snap) is None
    assert file_problem(snap / "merges.txt", snap) == "it is a symbolic link to a file outside its folder"
