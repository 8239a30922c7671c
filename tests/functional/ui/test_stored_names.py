"""The tensor table lists what is written (issue 25): a DCP's model under the names export writes, `S` the keys as
stored (`ckpt-tui tensors --stored`) and back; an optimizer component its entries (`--component optimizer`)."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from ckpt_tui.core.tensors import list_optimizer_tensors, list_tensors, listable, optimizer_listable
from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.dialogs import HelpScreen
from ckpt_tui.ui.widgets.details import MAX_ROWS, STORED_VIEW, TensorTable
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.functional.ui.test_app import press_and_wait, wait_for
from tests.functional.ui.test_state import text_of


def _cut_from(cell: str, name: str) -> bool:
    """``cell`` is ``name``, or ``name`` cut where the cell says … (a narrow column cuts long names)."""
    first, *rest = cell.split("…")
    if not rest:
        return cell == name
    if not name.startswith(first) or not name.endswith(rest[-1]):
        return False
    at = len(first)
    for piece in rest[:-1]:
        at = name.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return at <= len(name) - len(rest[-1])


def _shows(table: TensorTable, names: list[str], *, stored: bool) -> bool:
    """The table holds ``names`` in this view and has drawn them (the first MAX_ROWS, no filter)."""
    grid = table.query_one(DataTable)
    return (
        table.stored == stored
        and [r.name for r in table.rows] == names
        and table.is_drawn()
        and grid.row_count == min(len(names), MAX_ROWS)
        and all(_cut_from(str(grid.get_row_at(i)[0]), name) for i, name in enumerate(names[:MAX_ROWS]))
    )


def _caption(table: TensorTable) -> str:
    return " ".join(text_of(table.query_one("#tensor-count", Static)).split())


async def test_s_switches_a_dcp_between_the_names_export_writes_and_the_stored_keys(real_ckpt):
    app = make_app(real_ckpt("fsdp2-dcp"))  # one DCP folder: the model and its optimizer state
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        inv = app.report.inventory
        node, _ = listable(inv, inv.root)
        assert node is inv.root and node.role == "model+optimizer"
        exported = [t.name for t in list_tensors(node, inv.parsed)]
        stored = [t.name for t in list_tensors(node, inv.parsed, stored=True)]
        optim = [t.name for t in list_optimizer_tensors(node, inv.parsed)]
        assert exported and optim and set(optim) <= set(stored) and not set(optim) & set(exported)
        assert exported != stored  # the point of the key: the stored keys are not the names export writes

        table = app.main.query_one(TensorTable)
        await wait_for(pilot, lambda: _shows(table, exported, stored=False), timeout=60)
        assert app.main.stored_names is False and STORED_VIEW not in _caption(table)
        assert _caption(table).startswith(f"{len(exported)} tensors")

        await press_and_wait(pilot, "S", lambda: _shows(table, stored, stored=True), timeout=60)
        assert app.main.stored_names is True
        assert _caption(table).startswith(f"{len(stored)} tensors, {STORED_VIEW}"), _caption(table)
        # statistics are named as export writes: not over the stored keys, and it says why
        assert "press S" in (app.main.why_not("stats") or "") and app.main.check_action("stats", ()) is None

        await press_and_wait(pilot, "S", lambda: _shows(table, exported, stored=False), timeout=60)
        assert app.main.stored_names is False and STORED_VIEW not in _caption(table)
        assert app.main.why_not("stats") is None

        # the key is in the help screen and the palette, as every action
        await press_and_wait(pilot, "question_mark", lambda: isinstance(app.screen, HelpScreen))
        keys = [line for s in app.screen.query("Static") for line in text_of(s).splitlines()]
        assert any(line.startswith("S ") and "stored" in line for line in keys), keys
        await press_and_wait(pilot, "escape", lambda: app.screen is app.main)
        assert "Stored keys" in [c.title for c in app.get_system_commands(app.screen)]


async def test_the_optimizer_component_lists_its_entries(real_ckpt):
    """accelerate's optimizer_0/ (an HF Trainer FSDP2 run): selected, the table lists what `ckpt-tui tensors
    --component optimizer` lists; `S` lists the same entries (they are stored under these keys)."""
    app = make_app(real_ckpt("hf-fsdp2"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.report is not None and app.selected is not None, timeout=60)
        inv = app.report.inventory
        ckpt = inv.checkpoints[0]["path"]
        opt, _ = optimizer_listable(inv, inv.node(ckpt))
        assert opt is not None and opt.role == "optimizer"
        entries = [t.name for t in list_optimizer_tensors(opt, inv.parsed)]
        model = [t.name for t in list_tensors(listable(inv, inv.node(ckpt))[0], inv.parsed)]
        assert entries and not set(entries) & set(model)

        table = app.main.query_one(TensorTable)
        app.main.query_one(CheckpointTree).select_path(ckpt)  # the run opens on its run view: its newest checkpoint
        await wait_for(pilot, lambda: _shows(table, model, stored=False), timeout=60)
        app.main.query_one(CheckpointTree).select_path(opt.path)
        await wait_for(pilot, lambda: app.selected.path == opt.path and _shows(table, entries, stored=False), 60)
        await press_and_wait(pilot, "S", lambda: _shows(table, entries, stored=True), timeout=60)
        assert STORED_VIEW in _caption(table)
