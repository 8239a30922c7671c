"""The TUI on weights saved without gathering (issue 24): the tensor table marks each empty tensor with a red ✖
and its caption says weights-empty; the same checkpoint's tag, whole, is listed unmarked."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.details import TensorTable
from tests.fixtures import fixture_path
from tests.functional.ui.test_app import wait_for
from tests.functional.ui.test_state import text_of


async def _table(path):
    app = make_app(path)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        table = app.screen.query_one(TensorTable)
        await wait_for(pilot, lambda: table.is_drawn() and table.rows, timeout=60)
        grid = table.query_one(DataTable)
        shapes = [grid.get_row_at(i)[list(grid.columns).index("shape")] for i in range(grid.row_count)]
        return shapes, text_of(table.query_one("#tensor-count", Static))


async def test_empty_weights_are_marked_red_in_the_tensor_table():
    shapes, caption = await _table(fixture_path("zero3-ungathered") / "checkpoint-2" / "model.safetensors")
    assert len(shapes) == 21 and all(str(s) == "✖ 0" and "red" in str(s.style) for s in shapes), shapes
    assert "✖ weights-empty: holds 21 tensors, every one empty" in " ".join(caption.split()), caption


async def test_the_whole_tag_beside_it_is_not_marked():
    shapes, caption = await _table(fixture_path("zero3-ungathered") / "checkpoint-2")  # lists its model: the tag
    assert shapes and not any("✖" in str(s) for s in shapes)
    assert "weights-empty" not in caption
