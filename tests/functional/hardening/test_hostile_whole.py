"""Issue 24's new readings, attacked: the names an optimizer's param_groups list (a DCP save by torch itself
with a parameter named with terminal sequences and markup; one whose `params` object is a pickle that would run
code), the training_args.bin fields read for save_only_model, and the siblings listed beside a checkpoint
inspected alone (a symlink posing as a newer checkpoint)."""

from __future__ import annotations

import json
import shutil
import subprocess

import torch

from tests.fixtures import fixture_path
from tests.functional.hardening.test_hostile_terminal import CLICK, SEQ, assert_clean, cli_process

HOSTILE = f"evil{SEQ}{CLICK}".replace(".", "_")  # a module name holds no dot


def _dcp_with_a_never_grad(path, name: str) -> None:
    """A real torch DCP save: get_state_dict of a model whose submodule ``name`` never sees a gradient."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model.add_module(name, torch.nn.Linear(2, 2))  # trainable, never called
    opt = torch.optim.AdamW(model.parameters())
    model[0](torch.ones(1, 4)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(path))


def test_a_never_grad_parameter_named_with_escapes_is_shown_visibly(tmp_path):
    ck = tmp_path / "checkpoint-1"
    _dcp_with_a_never_grad(ck, HOSTILE)
    r = cli_process("inspect", ck)
    out = assert_clean(r.stdout + r.stderr, "inspect")
    assert "optimizer-state-missing" in out and "CLICKME[/]" in out, out
    r = cli_process("inspect", ck, "--json")
    assert_clean(r.stdout, "inspect --json")  # the name's controls as JSON escapes
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "optimizer-state-missing"]
    assert HOSTILE in f["message"]  # the data as it is, for a program to read


class _Run:
    def __reduce__(self):
        return (subprocess.call, (["touch", "CANARY"],))


def test_a_params_list_that_is_a_code_pickle_is_never_run(tmp_path, monkeypatch):
    """torch's own dcp.save of an optimizer state whose param group's `params` is an object that runs code when
    unpickled: ckpt-tui reads that list through the restricted unpickler, refuses it, and runs nothing."""
    import torch.distributed.checkpoint as dcp

    ck = tmp_path / "checkpoint-1"
    state = {
        "model": {"w": torch.ones(2), "v": torch.ones(2)},
        "optimizer": {
            "state": {"w": {"exp_avg": torch.ones(2), "step": torch.tensor(1.0)}},
            "param_groups": [{"lr": 0.1, "params": _Run()}],
        },
    }
    dcp.save(state, checkpoint_id=str(ck))
    monkeypatch.chdir(tmp_path)
    r = cli_process("inspect", ck)
    assert_clean(r.stdout + r.stderr, "inspect")
    assert not (tmp_path / "CANARY").exists()
    assert "optimizer-state-missing" not in r.stdout.decode()


def test_training_args_fields_of_the_wrong_type_are_ignored(tmp_path):
    """A training_args.bin whose save_only_model is not a bool (a string "yes"): no resume-model-only claimed."""
    v = tmp_path / "v"
    shutil.copytree(fixture_path("hf-model-only"), v)
    ta = v / "run" / "checkpoint-2" / "training_args.bin"
    args = torch.load(ta, weights_only=False)  # our own fixture, written by the Trainer: trusted here
    assert args.save_only_model is True
    args.save_only_model = "yes"
    torch.save(args, ta)  # as the Trainer writes it, with a field of the wrong type
    r = cli_process("inspect", v / "run" / "checkpoint-2", "--json")
    doc = json.loads(r.stdout)
    assert not [f for f in doc["findings"] if f["code"] == "resume-model-only"], doc["findings"]


def test_a_symlink_posing_as_a_newer_checkpoint_is_not_advised(tmp_path):
    v = tmp_path / "v"
    shutil.copytree(fixture_path("hf-killed-save"), v)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(v / "run" / "checkpoint-2", elsewhere)
    (v / "run" / "checkpoint-3").symlink_to(elsewhere, target_is_directory=True)
    doc = json.loads(cli_process("inspect", v / "run" / "checkpoint-4", "--json").stdout)
    (f,) = [f for f in doc["findings"] if f["code"] == "checkpoint-incomplete"]
    assert "checkpoint-2" in f["message"] and "checkpoint-3" not in f["message"], f["message"]
