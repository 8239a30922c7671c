"""The TUI tree on DeepSpeed's own universal checkpoint output: the universal folder is shown collapsed
with its summary, and opens (enter) on its files when asked."""

from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.functional.ui.test_app import press_and_wait, wait_for


def child(tnode, name: str):
    hits = [c for c in tnode.children if c.data is not None and c.data.name == name]
    assert len(hits) == 1, [str(c.label) for c in tnode.children]
    return hits[0]


async def test_universal_folder_collapsed_with_summary_and_expands_on_demand(real_ckpt):
    app = make_app(real_ckpt("universal"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        tree = app.query_one(CheckpointTree)
        uni = child(tree.root, "global_step2_universal")
        # the model component is selected, not opened: one line, its summary in the label
        await wait_for(pilot, lambda: tree.cursor_node is uni and app.selected.path == "global_step2_universal")
        assert not uni.is_expanded and uni.allow_expand
        assert "16 parameters with fp32, exp_avg, exp_avg_sq; 66K params, 265.2 kB fp32" in str(uni.label)
        assert not uni.children  # its files are not even loaded until it is opened
        await press_and_wait(pilot, "enter", lambda: uni.is_expanded and len(uni.children) == 3)
        zero = child(uni, "zero")
        assert {c.data.name for c in uni.children} == {
            "zero",
            "zero_pp_rank_0_mp_rank_00_model_states.pt",
            "zero_pp_rank_1_mp_rank_00_model_states.pt",
        }
        await press_and_wait(pilot, "j", lambda: tree.cursor_node is zero)
        await press_and_wait(pilot, "enter", lambda: zero.is_expanded and len(zero.children) == 17)
        param = child(zero, "lm_head.weight")
        tree.select_path(param.data.path + "/fp32.pt")  # what enter on a finding does: opens the way down
        await wait_for(
            pilot,
            lambda: (
                param.is_expanded
                and tree.cursor_node is not None
                and tree.cursor_node.data.path.endswith("lm_head.weight/fp32.pt")
            ),
        )
        assert {c.data.name for c in param.children} == {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"}
        roles = {c.data.name: c.data.role for c in param.children}
        assert roles == {"fp32.pt": "model", "exp_avg.pt": "optimizer", "exp_avg_sq.pt": "optimizer"}
        assert "MODEL" in str(tree.cursor_node.label)
