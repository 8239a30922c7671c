"""The scan reads a ``trainer_state.json`` without its ``log_history`` (``_trainer_state_head``): the facts are the
whole parse's, a file not laid out as the Trainer writes it is parsed whole, and a cut file is still corrupt."""

from __future__ import annotations

import json

import pytest

from ckpt_tui.core.formats.plain.format import _trainer_state_head


def _state(entries: int) -> dict:
    """What the HF Trainer records (TrainerState), with a history of train and eval entries."""
    log = []
    for i in range(entries):
        log.append({"epoch": i / 10, "grad_norm": 1.5, "learning_rate": 1e-4, "loss": 2.0 - i / 100, "step": 10 * i})
        if i % 5 == 4:
            log.append({"epoch": i / 10, "eval_loss": 2.1, "eval_runtime": 0.5, "step": 10 * i})
    return {
        "best_global_step": 40,
        "best_metric": 1.9,
        "best_model_checkpoint": "/scratch/job7/out/checkpoint-40",
        "epoch": 3.0,
        "eval_steps": 50,
        "global_step": 10 * entries,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": log,
        "logging_steps": 10,
        "max_steps": 1000,
        "num_input_tokens_seen": 0,
        "num_train_epochs": 3,
        "save_steps": 100,
        "stateful_callbacks": {"TrainerControl": {"args": {"should_save": True}, "attributes": {}}},
        "total_flos": 1.0,
        "train_batch_size": 8,
        "trial_name": None,
        "trial_params": None,
    }


def _written(doc: dict) -> bytes:
    # transformers' TrainerState.save_to_json: json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize("entries", [1, 7, 300])
def test_the_head_is_the_whole_parse_without_the_history(entries):
    doc = _state(entries)
    head = _trainer_state_head(_written(doc))
    assert head == {**doc, "log_history": []}


def test_an_empty_history_is_left_to_the_whole_parse_even_with_a_top_level_array_after_it():
    """``"log_history": []`` closes on its own line: the first top-level ``]`` after it is another key's, and
    splicing up to it would drop the keys between."""
    doc = {**_state(0), "z_later": [1, 2]}
    assert _trainer_state_head(_written(doc)) is None


def test_a_file_not_laid_out_as_the_trainer_writes_it_is_left_to_the_whole_parse():
    assert _trainer_state_head(json.dumps(_state(3)).encode()) is None  # compact: no indented key to find


@pytest.mark.parametrize("cut", [0.5, 0.97])  # inside the history; after it
def test_a_cut_file_gives_no_head_and_the_whole_parse_fails(cut):
    raw = _written(_state(50))
    bad = raw[: int(len(raw) * cut)]
    assert _trainer_state_head(bad) is None
    with pytest.raises(ValueError):
        json.loads(bad)


def test_nested_arrays_in_the_history_do_not_end_it_early():
    doc = _state(3)
    doc["log_history"][1]["per_group"] = [[1, 2], [3, [4, 5]]]
    assert _trainer_state_head(_written(doc)) == {**doc, "log_history": []}
