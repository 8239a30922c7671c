"""The TUI on DeepSpeed checkpoints beyond ZeRO-1/2/3 (stage 0, BF16_Optimizer, pipeline): the summary and
the tag's facts name the layout and the optimizer; the tensor table lists what an export writes."""

import pytest

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.details import TensorTable
from tests.functional.ui.test_app import wait_for

CASES = [
    ("ds-zero0-bf16", "ZeRO stage 0", "FP16_UnfusedOptimizer", 17),
    ("ds-zero0-fp32", "ZeRO stage 0", "torch optimizer", 17),
    ("ds-bf16-optimizer", "BF16_Optimizer (ZeRO-1)", "BF16_Optimizer", 17),
    ("ds-pipeline", "pipeline parallel, 2 stages", "torch optimizer", 16),
]


@pytest.mark.parametrize("variant,words,optimizer,tensors", CASES, ids=[c[0] for c in CASES])
async def test_opens_and_names_the_layout(real_ckpt, variant, words, optimizer, tensors):
    app = make_app(real_ckpt(variant) / "checkpoint")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        summary = str(app.query_one("#summary").render())
        assert f"DeepSpeed {words}" in summary and "model and optimizer in `global_step2/`" in summary
        await wait_for(pilot, lambda: app.selected is not None and app.selected.path == "global_step2")
        facts = app.query_one("#facts")
        await wait_for(pilot, lambda: optimizer in _text(facts))
        assert "layout" in _text(facts) and words in _text(facts)
        await wait_for(pilot, lambda: len(app.query_one(TensorTable).rows) == tensors)


def _text(widget) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(widget.content)
    return console.export_text()
