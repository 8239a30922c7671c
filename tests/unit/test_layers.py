"""ckpt-tui's modules form layers: no import cycle (imports inside functions count too), and no
module imports another's private name. Read from the source, nothing is imported, no torch: seconds."""

from __future__ import annotations

import ast
from pathlib import Path

import ckpt_tui

CORE = Path(ckpt_tui.__file__).parent  # the whole package: core, cli, ui, samples
PACKAGE = "ckpt_tui"


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _imports(path: Path):
    """(imported module, names imported from it) for every import statement in the file, resolved
    to absolute names; ``from . import x`` names the submodule x when there is one."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            names = [a.name for a in node.names]
            yield mod, names


def _graph():
    modules = {_module_name(p): p for p in CORE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for mod, path in modules.items():
        for target, names in _imports(path):
            if not target.startswith(PACKAGE):
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if subs:
                edges[mod].update(subs)
            rest = [n for n in names if f"{target}.{n}" not in modules]
            if target in modules and (rest or not names) and target != mod:
                edges[mod].add(target)
            private += [
                f"{mod} imports {target}.{n}"
                for n in rest
                if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
            ]
    return edges, private


def test_no_import_cycle():
    edges, _ = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_no_private_name_imported_across_modules():
    _, private = _graph()
    assert not private, private


def test_graph_sees_imports():  # the checks above would pass vacuously on a broken parser
    edges, _ = _graph()
    assert "ckpt_tui.core.formats.registry" in edges["ckpt_tui.core.scan"]
    assert "ckpt_tui.core.formats.dcp.reader" in edges["ckpt_tui.core.formats.dcp.format"]
    assert "ckpt_tui.core.report" in edges["ckpt_tui.core.repair.run"]  # an import inside a function
    assert "ckpt_tui.ui.run" in edges["ckpt_tui.cli.inspect"]
