"""One helper writes the JSON object of the core's dataclasses (core/jsondoc.py): field order,
renames, properties and value conversion as the documents have always had them."""

from __future__ import annotations

import json
from pathlib import Path

from ckpt_tui.core.export.write import ExportResult
from ckpt_tui.core.types import Finding, Node, Plan, PlanStep, TensorInfo


def test_mirrors_fields_in_order_with_renames_and_properties():
    assert TensorInfo("w", (2, 3), "bfloat16", 12).to_json() == {
        "name": "w",
        "shape": [2, 3],
        "dtype": "bfloat16",
        "bytes": 12,
        "upcast_from": None,
    }
    assert TensorInfo("f", (2,), "float32", 8, "bfloat16").to_json()["upcast_from"] == "bfloat16"  # additive key
    assert list(Finding("c", "info", ".", "m").to_json()) == ["code", "severity", "path", "message", "fix", "command"]
    plan = Plan("t", (PlanStep("write", "a", bytes=5),), ("n",))
    assert plan.to_json() == {
        "title": "t",
        "steps": [{"op": "write", "target": "a", "source": None, "bytes": 5, "detail": ""}],
        "notes": ["n"],
        "total_bytes": 5,
    }


def test_node_facts_are_made_jsonable():
    n = Node("x", Path("/r/x"), True, "dcp", "model", None, 7, {"s": {3, 1}, 2: Path("/p"), "t": (1, object)})
    doc = n.to_json()
    assert list(doc) == ["path", "kind", "format", "role", "framework", "size", "facts"] and doc["kind"] == "dir"
    assert doc["facts"] == {"s": [1, 3], "2": "/p", "t": [1, str(object)]}


def test_a_class_can_override_one_value_in_place():
    r = ExportResult(Path("/o"), ["a.safetensors"], 10, 1, 2, 1.23456, True)
    assert json.dumps(r.to_json()) == json.dumps(
        {
            "out": "/o",
            "files": ["a.safetensors"],
            "bytes": 10,
            "tensors": 1,
            "params": 2,
            "seconds": 1.235,
            "verified": True,
            "mismatches": [],
            "notes": [],
            "stripped_prefix": None,
            "load_code": "",
        }
    )


def test_repair_and_universal_documents_keep_their_keys_and_values():
    from ckpt_tui.core.convert.universal import UniversalResult, UniversalVerification
    from ckpt_tui.core.repair.run import Repair, RepairResult

    plan = Plan("t", (PlanStep("write", "a", bytes=5),))
    assert list(Repair("i", "c", "p", "title", plan).to_json()) == [
        "id",
        "code",
        "path",
        "title",
        "writes",
        "can_apply",
        "plan",
    ]
    assert RepairResult("i", "c", "p", True, True, "m", True, "/b", ["x"]).to_json() == {
        "id": "i",
        "code": "c",
        "path": "p",
        "ok": True,
        "changed": True,
        "finding_gone": True,
        "message": "m",
        "backup": "/b",
        "written": ["x"],
    }
    v = UniversalVerification(True, 3)
    r = UniversalResult(Path("/o"), Path("/lu"), 1.23456, 7, v, None, ["f"], [], Path("/f.st"), "do", [])
    assert json.dumps(r.to_json()) == json.dumps(
        {
            "out": "/o",
            "latest_file": "/lu",
            "seconds": 1.235,
            "files": 7,
            "verification": {
                "ok": True,
                "checked": 3,
                "problems": [],
                "frozen_ok": [],
                "frozen_absent": [],
                "notes": [],
            },
            "log": None,
            "frozen": ["f"],
            "buffers": [],
            "frozen_file": "/f.st",
            "instructions": "do",
            "warnings": [],
        }
    )
