"""The TUI's tree lists a folder's entries with their numbers as numbers (checkpoint-900 before checkpoint-1000),
folders first; the scan and the CLI keep the code-point order of ``ls``."""

from __future__ import annotations

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.tree import CheckpointTree, natural_key
from tests.functional.ui.test_app import wait_for


def test_natural_key_orders_numbers_as_numbers_and_keeps_every_name_apart():
    names = ["checkpoint-1000", "checkpoint-100", "checkpoint-20000", "checkpoint-900", "rank_10", "rank_2", "step_1"]
    names += ["step_01", "10", "9x", "a"]
    assert sorted(names, key=natural_key) == [
        "9x",
        "10",
        "a",
        "checkpoint-100",
        "checkpoint-900",
        "checkpoint-1000",
        "checkpoint-20000",
        "rank_2",
        "rank_10",
        "step_01",
        "step_1",
    ]


async def test_the_tree_lists_checkpoints_in_step_order(tmp_path):
    for step in (20000, 100, 1000, 900):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "notes.txt").write_text("x")
    (tmp_path / "b10.txt").write_text("x")
    (tmp_path / "b9.txt").write_text("x")
    app = make_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        tree = app.main.query_one(CheckpointTree)
        await wait_for(pilot, lambda: len(tree.root.children) == 6)
        shown = [c.data.name for c in tree.root.children if c.data is not None]
    assert shown == ["checkpoint-100", "checkpoint-900", "checkpoint-1000", "checkpoint-20000", "b9.txt", "b10.txt"]
