"""The docs hold together: the generated reference pages (docs/reference/, written by scripts/write_reference.py
from the registries) are current. No torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("write_reference", ROOT / "scripts" / "write_reference.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generated_reference_pages_are_current():
    """Regenerated in memory from codes.py, facts.py, layout.py and the format registry: a page that differs
    from the committed one is stale (run `python scripts/write_reference.py`)."""
    pages = generator().pages()
    assert pages
    stale = [rel for rel, text in pages.items() if not (ROOT / rel).is_file() or (ROOT / rel).read_text() != text]
    assert stale == [], "stale; run python scripts/write_reference.py"


def test_the_reference_pages_name_every_code_layout_and_format():
    from ckpt_tui.core.codes import CODES
    from ckpt_tui.core.formats.registry import facts_by_format
    from ckpt_tui.core.layout import LAYOUTS

    pages = generator().pages()
    codes, facts, layouts = (pages[f"docs/reference/{n}.md"] for n in ("finding-codes", "facts", "layouts"))
    assert all(f"| `{c}` |" in codes for c in CODES)
    assert all(f"## `{name}`\n" in facts for name in facts_by_format())
    assert all(f"| `{lay}` |" in layouts for lay in LAYOUTS)
