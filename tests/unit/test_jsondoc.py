"""One helper writes the JSON object of the core's dataclasses (core/jsondoc.py): field order,
renames, properties and value conversion as the documents have always had them."""
from __future__ import annotations

import json
from pathlib import Path

from ckpt_tui.core.export.write import ExportResult
from ckpt_tui.core.types import Finding, Node, Plan, PlanStep, TensorInfo


def test_mirrors_fields_in_order_with_renames_and_properties():
    assert TensorInfo("w", (2, 3), "bfloat16", 12).to_json() == {"name": "w", "shape": [2, 3], "dtype": "bfloat16",
                                                                "bytes": 12}
    assert list(Finding("c", "info", ".", "m").to_json()) == ["code", "severity", "path", "message", "fix"]
    plan = Plan("t", (PlanStep("write", "a", bytes=5),), ("n",))
    assert plan.to_json() == {"title": "t", "steps": [{"op": "write", "target": "a", "source": None, "bytes": 5,
                                                       "detail": ""}], "notes": ["n"], "total_bytes": 5}


def test_node_facts_are_made_jsonable():
    n = Node("x", Path("/r/x"), True, "dcp", "model", None, 7, {"s": {3, 1}, 2: Path("/p"), "t": (1, object)})
    doc = n.to_json()
    assert list(doc) == ["path", "kind", "format", "role", "framework", "size", "facts"] and doc["kind"] == "dir"
    assert doc["facts"] == {"s": [1, 3], "2": "/p", "t": [1, str(object)]}


def test_a_class_can_override_one_value_in_place():
    r = ExportResult(Path("/o"), ["a.safetensors"], 10, 1, 2, 1.23456, True)
    assert json.dumps(r.to_json()) == json.dumps(
        {"out": "/o", "files": ["a.safetensors"], "bytes": 10, "tensors": 1, "params": 2, "seconds": 1.235,
         "verified": True, "mismatches": [], "notes": []})
