"""`inspect --json` stays schema version 1: against what the released version printed for every
fixture (data/released_inspect_json.json: each document's key paths with their JSON types, and its
node paths), every key is still there with the same type, and `nodes[]` still lists every file.
New keys may appear (additive); a value may change only where it was wrong (CORRECTED)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import fixture_path

RELEASED = json.loads((Path(__file__).parent / "data" / "released_inspect_json.json").read_text())

# key path -> types the released version printed there that were wrong, and why
CORRECTED: dict[str, set[str]] = {}

# keys added since the release, under schema_version 1 (docs/json.md): key path -> its JSON types. Held like the
# released ones wherever the document has their parent (a run folder: each checkpoint's own components, and the
# top level the newest complete one's)
ADDED: dict[str, set[str]] = {
    "$.checkpoints[].components": {"object"},
    # the run view (issue 28)
    "$.checkpoints[].written": {"number"},
    "$.checkpoints[].problems": {"array"},
    "$.checkpoints[].holds": {"array"},
    "$.checkpoints[].holds[]": {"string"},
    "$.checkpoints[].sizes": {"object"},
    "$.checkpoints[].sizes.model": {"number"},
    "$.checkpoints[].sizes.optimizer": {"number"},
    "$.checkpoints[].sizes.model+optimizer": {"number"},
    "$.checkpoints[].sizes.other": {"number"},
    "$.checkpoints[].sizes.total": {"number"},
    "$.checkpoints[].loss": set(),  # a number where recorded, else null
    "$.checkpoints[].eval_metric": set(),
    "$.checkpoints[].newest_complete": {"boolean"},
    "$.checkpoints[].best": {"boolean"},
    "$.run": {"object"},
    "$.run.total_bytes": {"number"},
    "$.run.optimizer_bytes": {"number"},
    "$.run.higher_is_better": {"boolean"},
}
# and these, each a value or null: present, whatever its type
ADDED_NULLABLE = (
    "$.checkpoints[].loss",
    "$.checkpoints[].eval_metric",
    "$.run.eval_metric",
    "$.run.best_source",
    "$.run.history_from",
    "$.run.no_history",
)

# fixtures whose files changed since the release because the fixture itself was replaced (the hand-made torch DCP
# imitations of torchtitan and Megatron-Core, now written by torchtitan's CheckpointManager and megatron-core's
# dist_checkpointing): their node lists are not comparable, their key paths and types still are, on the folder that
# is now what the fixture's root was (the run's checkpoint folder)
REPLACED = {"torchtitan": "checkpoint", "megatron-dist": "checkpoints"}


def shape(v, path: str = "", out: dict | None = None) -> dict[str, set[str]]:
    """Every key path of a JSON value (``[]`` for list items) with the JSON types found there."""
    out = {} if out is None else out
    t = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }[type(v)]
    out.setdefault(path or "$", set()).add(t)
    if isinstance(v, dict):
        for k, x in v.items():
            shape(x, f"{path}.{k}", out)
    elif isinstance(v, list):
        for x in v:
            shape(x, f"{path}[]", out)
    return out


@pytest.mark.parametrize("variant", sorted(RELEASED))
def test_inspect_json_is_additive(variant):
    old = RELEASED[variant]
    r = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "inspect", str(fixture_path(variant) / REPLACED.get(variant, "")), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1
    if variant not in REPLACED:
        assert sorted(n["path"] for n in doc["nodes"]) == old["nodes"]  # every file still listed
    new = shape(doc)
    # an array that is empty now (a false finding the released version printed is gone) still has its items' keys:
    # the keys are missing from this document, not from the schema
    empty = {p for p in new if p != "$" and not any(k.startswith(p + "[]") for k in new) and "array" in new[p]}
    gone = [k for k in old["shape"] if k not in new and not any(k.startswith(e + "[]") for e in empty)]
    assert not gone, f"keys the released version printed are gone: {gone}"
    # a null the released version printed may have become a value (it was missing); nothing else may change
    retyped = {
        k: (old_t, sorted(new[k]))
        for k, old_t in old["shape"].items()
        if k in new and not set(old_t) - {"null"} - CORRECTED.get(k, set()) <= new[k]
    }
    assert not retyped, f"keys whose JSON type changed: {retyped}"
    if "$.checkpoints[]" in new:  # a run folder: what was added since is held too
        missing = {k: t for k, t in ADDED.items() if not t <= new.get(k, set())}
        assert not missing, f"keys added under schema_version 1 are gone or retyped: {missing}"
        assert not [k for k in ADDED_NULLABLE if k not in new], [k for k in ADDED_NULLABLE if k not in new]
        newest = next((c for c in doc["checkpoints"] if c["complete"]), None)
        assert newest is not None and doc["components"] == newest["components"], doc["components"]
        assert {"model", "model+optimizer"} & set(newest["components"]), newest  # where its model is
