"""Attacks on what this round added to the scan: a Lightning run's ``.ckpt`` files (now listed as its checkpoints,
their names printed by inspect and prune) and the ``trainer_state.json`` read without its ``log_history``.

- A ``.ckpt`` Lightning wrote, copied under a name holding terminal sequences and markup: every face that prints it
  (inspect's text and run table, prune's refusal) shows it visibly, never as the sequence; ``--json`` keeps it exact.
- A ``trainer_state.json`` crafted to make the splice read other facts than the whole parse would: a nested array
  closed at the top level's indent inside the history, keys repeated after it. The facts are the whole parse's."""

from __future__ import annotations

import json
import shutil

from tests.util import ckpt_tui

ESC, BEL = "\x1b", "\x07"
SEQ = f"{ESC}]0;PWNED-TITLE{BEL}{ESC}[2J\x9b2J\u202e"
NAME = f"x{SEQ}[red]RED[@click=app.bell]B-step=2.ckpt"


def _raw_free(text: str) -> None:
    for bad in (ESC, BEL, "\x9b", "\u202e"):
        assert bad not in text, repr(text[:400])
    assert "[red]RED[@click=app.bell]B" in text  # the markup printed as text, not read as styles or an action


def test_a_lightning_ckpt_named_with_escapes_is_listed_and_refused_visibly(real_ckpt_copy):
    run = real_ckpt_copy("lightning-file-optim")
    shutil.copy2(run / "last.ckpt", run / "epoch=0-step=1.ckpt")
    shutil.copy2(run / "last.ckpt", run / NAME)
    doc = json.loads(ckpt_tui("inspect", str(run), "--json", cwd=run.parent).stdout)
    assert doc["layout"] == "run-folder"
    assert [c["path"] for c in doc["checkpoints"]] == [NAME, "epoch=0-step=1.ckpt"]  # exact in JSON
    for args in (("inspect", str(run)), ("prune", str(run), "--what", "checkpoint", "--keep-last", "1")):
        r = ckpt_tui(*args, cwd=run.parent)
        assert "Traceback" not in r.stderr
        _raw_free(r.stdout + r.stderr)
        assert "PWNED-TITLE" in r.stdout + r.stderr  # shown, as text
    assert (run / NAME).is_file() and (run / "epoch=0-step=1.ckpt").is_file()


def test_a_trainer_state_crafted_against_the_history_splice_gives_the_whole_parses_facts(real_ckpt_copy):
    run = real_ckpt_copy("hf-fsdp2")
    ts = next(run.rglob("trainer_state.json"))
    # valid JSON: the history's first entry is an array closed by a line at the top level's indent, and the keys
    # after the history repeat global_step (the last one wins in a whole parse)
    ts.write_text(
        '{\n  "global_step": 111,\n  "log_history": [\n[\n  ], {"loss": 1.0, "step": 1}\n  ],\n'
        '  "global_step": 222,\n  "max_steps": 333\n}\n'
    )
    whole = json.loads(ts.read_text())
    assert whole["global_step"] == 222
    doc = json.loads(ckpt_tui("inspect", str(run), "--json", cwd=run.parent).stdout)
    facts = [n["facts"] for n in doc["nodes"] if n["path"].endswith("trainer_state.json")]
    assert facts and facts[0].get("global_step") == 222 and facts[0].get("max_steps") == 333, facts
