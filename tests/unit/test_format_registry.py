"""The format registry is the one place that names formats: outside ``ckpt_tui/core/formats/`` no code compares
a ``.format`` attribute with anything (``==``, ``!=``, ``in``, ``not in``, either side, constants moved aside into
a name included), uses one as a dict key or subscript, or looks one up with ``.get(x.format)``. Everything else asks
``registry.format_of(node)``, which answers for every node. No torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "ckpt_tui"
FORMATS = ROOT / "core" / "formats"


def _is_format(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "format"


def violations(source: str, where: str = "<snippet>") -> list[str]:
    """``where:line: what`` for every use of a ``.format`` attribute as a name to compare or look up."""
    out = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_format(s) for s in sides):
                out.append(f"{where}:{node.lineno}: compares {ast.unparse(node)}")
        elif isinstance(node, ast.Subscript) and _is_format(node.slice):
            out.append(f"{where}:{node.lineno}: subscript {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and any(k is not None and _is_format(k) for k in node.keys):
            out.append(f"{where}:{node.lineno}: dict keyed by {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault", "__getitem__", "__contains__")
            and node.args
            and _is_format(node.args[0])
        ):
            out.append(f"{where}:{node.lineno}: looks up {ast.unparse(node)}")
    return out


def test_no_format_name_is_compared_outside_the_formats():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if FORMATS in path.parents:
            continue
        found += violations(path.read_text(), str(path.relative_to(ROOT.parent)))
    assert found == [], "ask formats.registry.format_of(node) instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        'if node.format == "dcp": pass',
        'ok = "dcp" != n.format',
        'ok = c.format in ("dcp", "deepspeed-zero")',
        "ok = c.format not in KINDS",  # a tuple of names moved aside is still a comparison
        "ok = a.format is b",
        "ok = 1 < x.format <= 3",
        "facts = FACTS[node.format]",
        "facts = FACTS.get(node.format, None)",
        "table = {node.format: 1}",
    ],
)
def test_the_check_sees_a_comparison(snippet):
    assert violations(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "fmt = format_of(node)\nif fmt.tag: pass",
        'text = f"{node.format}"',  # shown, not compared
        "bits = [node.format]",
        'label = "{}".format(x)',  # str.format is a call, not an attribute compared
    ],
)
def test_the_check_lets_through_what_asks_the_registry(snippet):
    assert violations(snippet) == []


def test_every_node_format_a_scan_gives_has_a_format():
    """format_of answers for every name the scan or a format writes (the pseudo-formats included)."""
    from ckpt_tui.core.formats.format import Format
    from ckpt_tui.core.formats.registry import UNKNOWN, facts_by_format, format_of
    from ckpt_tui.core.types import Node

    names = facts_by_format()
    for pseudo in ("dir", "unknown", "special", "leftover", "backup", "text", "json", "python"):
        assert pseudo in names
    for name in names:
        node = Node("x", Path("/nonexistent/x"), name == "dir", format=name)
        fmt = format_of(node)
        assert isinstance(fmt, Format) and name in fmt.formats
    assert format_of(Node("x", Path("/x"), False, format="no-such-format")) is UNKNOWN


def test_a_folder_of_one_weights_file_is_described_by_that_files_format(tmp_path):
    """A folder holding one ``weights.safetensors`` is a safetensors checkpoint (was: "torch.save: model in
    `weights.safetensors`", the fallback for any folder of one weights file)."""
    from . import trees
    from .api import inspect

    trees.write_file("accelerate-save-state", "model.safetensors", tmp_path / "ckpt" / "weights.safetensors")
    inv = inspect(tmp_path / "ckpt").inventory
    assert (inv.layout, inv.framework, inv.components) == (
        "safetensors-file",
        "safetensors",
        {"model": "weights.safetensors"},
    )
    assert inv.summary.startswith("safetensors: model in `weights.safetensors` (")


def test_the_optimizer_refusal_names_the_checkpoint_the_export_reads(tmp_path):
    """A run folder whose newest checkpoint is broken: ``--component optimizer`` reads the newest complete one,
    and its refusal names that one's optimizer (it named the broken newest one's)."""
    from . import trees
    from .api import ExportError, plan_export

    run = tmp_path / "run"
    for step in (1, 2):
        for name in ("model.safetensors", "optimizer.safetensors"):
            trees.write_file("accelerate-save-state", "model.safetensors", run / f"checkpoint-{step}" / name)
    trees.truncate(run / "checkpoint-2" / "model.safetensors", 100)
    with pytest.raises(ExportError) as e:
        plan_export(run, tmp_path / "out", component="optimizer")
    assert "the optimizer component is " in str(e.value)
    assert "checkpoint-1/optimizer.safetensors (safetensors" in str(e.value)
    assert "checkpoint-2" not in str(e.value)
