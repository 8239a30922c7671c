"""The facts declaration (ckpt_tui/core/facts.py) cannot drift: every node of every synthetic tree
writes only declared keys of the declared types (the diagnose and layout tables check their trees
too), every declared key has a writer; docs/reference/facts.md is generated from the declaration (tests/unit/test_docs.py
holds it current)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_type_hints

import pytest

from . import trees
from .api import FACTS_BY_FORMAT, inspect
from .facts import undeclared

WRITERS = [
    Path(__file__).resolve().parents[2] / "ckpt_tui" / "core" / "scan.py",
    Path(__file__).resolve().parents[2] / "ckpt_tui" / "core" / "leftovers.py",  # the scan's leftover facts
    *sorted((Path(__file__).resolve().parents[2] / "ckpt_tui" / "core" / "formats").rglob("*.py")),
]


@pytest.mark.parametrize("variant", sorted(trees.manifest()))
def test_every_fact_of_a_real_tree_is_declared(variant, tree):
    rep = inspect(tree(variant))
    assert undeclared(rep) == []
    assert any(n.facts for n in rep.inventory.nodes())


def test_every_declared_key_has_a_writer():
    """A key declared but written nowhere (as "key" or key= in the scan and the format modules) must go."""
    src = "\n".join(p.read_text() for p in WRITERS)
    keys = {k for t in FACTS_BY_FORMAT.values() for k in get_type_hints(t)}
    unwritten = sorted(k for k in keys if not re.search(rf"""["']{k}["']|\b{k}=""", src))
    assert unwritten == []


def test_every_literal_key_written_is_declared():
    """What the writers assign by name (x.facts["k"] =, f["k"] =, f.setdefault("k", XFacts(k=...)) is declared
    somewhere (keys taken from a loop over names are checked on the trees above)."""
    src = "\n".join(p.read_text() for p in WRITERS)
    keys = {k for t in FACTS_BY_FORMAT.values() for k in get_type_hints(t)}
    written = set(re.findall(r"""\b(?:facts\)?|f|cf|icf)\[["'](\w+)["']\] = """, src))
    written |= set(re.findall(r"""\bf\.setdefault\(["'](\w+)["']""", src))
    for call in re.findall(r"\b\w*Facts\(([^()]*(?:\([^()]*\)[^()]*)*)\)", src):
        top = re.sub(r"\([^()]*\)", "()", call)  # the call's own arguments, not those of calls inside it
        written |= set(re.findall(r"(?:^|,)\s*(\w+)=", top))
    assert written and not sorted(written - keys)
