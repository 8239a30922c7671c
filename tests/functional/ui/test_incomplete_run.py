"""The TUI on a run whose newest save was killed (issue 24): the summary names the newest complete checkpoint and
the incomplete one, the tree marks the killed checkpoint ✖, and the export wizard has the complete one chosen, the
killed one listed as incomplete."""

from __future__ import annotations

from textual.widgets import OptionList

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.wizards import ExportWizard
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.fixtures import fixture_path
from tests.functional.ui.test_app import press_and_wait, screen_text, step_ready, wait_for


async def test_a_killed_save_is_marked_and_the_export_takes_the_newest_complete():
    app = make_app(fixture_path("hf-killed-save") / "run")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.report is not None, timeout=60)
        text = " ".join(screen_text(app).split())
        assert "newest complete `checkpoint-2/` (newer, incomplete: `checkpoint-4/`)" in text, text
        tree = app.screen.query_one(CheckpointTree)
        assert "✖" in str(tree._by_path["checkpoint-4"].label) and "✖" not in str(tree._by_path["checkpoint-2"].label)
        await press_and_wait(pilot, "e", lambda: isinstance(app.screen, ExportWizard))
        wiz = app.screen
        await wait_for(pilot, lambda: step_ready(wiz, 0))
        options = wiz.query_one("#source-list", OptionList)
        labels = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        chosen = labels[options.highlighted]  # what enter takes
        assert chosen.startswith("checkpoint-2/model.safetensors") and "(complete)" in chosen, labels
        killed = [lb for lb in labels if lb.startswith("checkpoint-4/")]
        assert killed and all("(INCOMPLETE)" in lb for lb in killed), labels
