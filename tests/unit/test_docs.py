"""The docs hold together: the generated reference pages (docs/reference/, written by scripts/write_reference.py
from the registries) are current, and every relative link of README.md, the top-level pages and docs/ resolves
to a file, and for ``#anchor`` to a heading with that GitHub slug. No torch."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")])


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


def _outside_code(text: str) -> str:
    """The page without its fenced blocks and inline code (a `# comment` in a bash block is no heading)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercased, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", text, re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [
        t
        for t in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _outside_code(page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", t)
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == []


def test_slug_is_githubs():
    assert slug("Safety — what is promised, and the tests that attack it") == (
        "safety--what-is-promised-and-the-tests-that-attack-it"
    )
    assert slug("Cost on hostile inputs (`bench/cost_bench.py`, `bench/hostile_bench.py`)") == (
        "cost-on-hostile-inputs-benchcost_benchpy-benchhostile_benchpy"
    )
