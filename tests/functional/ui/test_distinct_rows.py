"""Rows whose tensor names differ read differently in the TUI's table, at 80 and at 120 columns, for the listing
of every fixture (issue 23: the rows of a LoRA's `q_proj` and `v_proj` read the same,
`base_model.model.model.layers.0…proj.lora_A.weight`).

The app is opened once per width, on a PEFT fixture, and its mounted TensorTable is asked how wide the name
column is for each fixture's rows (its own ``_fit``, the same call a draw makes); the cut names are the table's
own (``distinct_cuts``). One real draw per width is also read off the screen.
"""

from __future__ import annotations

import functools

import pytest

from ckpt_tui.core.report import inspect
from ckpt_tui.core.tensors import list_tensors, listable
from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.format import distinct_cuts
from ckpt_tui.ui.widgets.details import MAX_ROWS, TensorTable
from tests.fixtures import REGISTRY, SKIPPED, fixture_path
from tests.functional.ui.test_app import wait_for

PEFT = "peft-llama"


@functools.lru_cache(maxsize=None)
def _listing(name: str) -> list:
    root = fixture_path(name)
    report = inspect(root)
    node, _ = listable(report.inventory, report.inventory.root)
    if node is None:
        return []
    try:
        return list(list_tensors(node, report.inventory.parsed))[:MAX_ROWS]
    except Exception:  # a fixture whose listing is refused (a broken file on purpose) draws no rows
        return []


@pytest.mark.parametrize("width", [80, 120])
async def test_distinct_names_read_distinctly_in_every_fixture_listing(width):
    ck = fixture_path(PEFT) / "run" / "checkpoint-2"
    app = make_app(ck)
    async with app.run_test(size=(width, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        table = app.screen.query_one(TensorTable)
        await wait_for(pilot, lambda: table.is_drawn() and table.rows, timeout=60)
        room = table.content_size.width - table.query_one("DataTable").styles.scrollbar_size_vertical
        drawn = [str(row[0]) for row in (table.query_one("DataTable").get_row_at(i) for i in range(len(table.rows)))]
        names = [r.name for r in table.rows]
        assert len(set(drawn)) == len(set(names)), drawn  # what the screen shows for the PEFT adapter itself
        failures = []
        for name in sorted(REGISTRY):
            if name in SKIPPED:
                continue
            rows = _listing(name)
            if not rows:
                continue
            widths = table._fit([table._cells(r) for r in rows], room)
            cuts = distinct_cuts([r.name for r in rows], widths["name"])
            if len(set(cuts)) != len({r.name for r in rows}):
                seen: dict[str, str] = {}
                for r, c in zip(rows, cuts):
                    if c in seen and seen[c] != r.name:
                        failures.append(f"{name}: {seen[c]!r} and {r.name!r} both read {c!r} ({widths['name']} cells)")
                        break
                    seen[c] = r.name
        assert not failures, "\n".join(failures)
