"""How the TUI cuts a tensor name (``middle_ellipsis``) and spells a tree label (``node_label``): pure
functions over strings and synthetic nodes, no torch, no app."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.cells import cell_len

from ckpt_tui.core.types import Finding
from ckpt_tui.ui.format import GAP, middle_ellipsis, node_label

Q = "model.layers.10.self_attn.q_proj.weight"  # 39 cells


@pytest.mark.parametrize(
    "name,width,cut",
    [
        (Q, 39, Q),  # fits: unchanged
        (Q, 80, Q),
        (Q, 29, "model.layers.10…q_proj.weight"),  # the example: start to the layer index, then the leaf
        (Q, 30, "model.layers.10…q_proj.weight"),  # one spare cell: a lone '.' after the cut says nothing
        (Q, 28, "model.layers.10…_proj.weight"),  # the left-over room shows the next component's end
        (Q, 38, "model.layers.10…elf_attn.q_proj.weight"),
        (Q, 22, "model.layers.10…weight"),
        (Q, 21, "model.layers.10…eight"),  # narrower: the layer index stays whole, the leaf loses its start
        (Q, 16, "model.la….weight"),  # narrower still: characters of each end
        (Q, 1, "…"),
        (Q, 0, ""),
        ("model.layers.0.mlp.gate_proj.weight", 30, "model.layers.0…ate_proj.weight"),  # never grows the start
        ("model.layers.7.mlp.experts.3.w1.weight", 30, "model.layers.7…rts.3.w1.weight"),  # first index only
        ("model.embed_tokens.weight", 20, "model…_tokens.weight"),  # no index: the first component
        ("lm_head.weight", 10, "lm_he…ight"),  # two components: characters
        ("a_name_without_any_dots", 11, "a_nam…_dots"),
    ],
)
def test_middle_ellipsis(name, width, cut):
    assert middle_ellipsis(name, width) == cut


@pytest.mark.parametrize("width", range(0, 45))
def test_middle_ellipsis_never_exceeds_the_width_and_keeps_the_layer_index_from_22_cells(width):
    for layer in (0, 10, 70):
        name = f"model.layers.{layer}.self_attn.q_proj.weight"
        cut = middle_ellipsis(name, width)
        assert cell_len(cut) <= width
        assert cut == name or "…" in cut or width == 0
        if width >= 22:  # `model.layers.70…weight`: layers 0, 10 and 70 never look the same
            assert cut.startswith(f"model.layers.{layer}…") or cut.startswith(f"model.layers.{layer}."), cut
            assert cut.endswith("weight")


def _node(name, role, size, is_dir=False):
    return SimpleNamespace(path=name, name=name, abspath=Path("/x") / name, is_dir=is_dir, role=role, size=size)


@pytest.mark.parametrize(
    "node,findings,parts",
    [
        (_node("pytorch_model.bin", "model", 1_700_000), (), ["MODEL", "pytorch_model.bin", "1.7 MB"]),
        (_node("checkpoint-2", "checkpoint", 1_700_000, True), (), ["checkpoint-2/", "ckpt", "1.7 MB"]),
        (
            _node("global_step2", "model+optimizer", 942_200, True),
            (Finding(code="x", severity="warning", path="global_step2", message="m"),),
            ["▲", "MODEL+OPTIM", "global_step2/", "942.2 kB"],
        ),
        (_node("__0_0.distcp", "shard", 0), (), ["__0_0.distcp"]),
    ],
)
def test_node_label_one_plain_space_between_badge_name_and_size(node, findings, parts):
    label = node_label(node, findings)
    assert label.plain == " ".join(parts)
    assert not label.style  # no style over the whole label: each part has its own
    # each space between parts is a span of its own style (GAP), so an SVG export draws it as a gap, never as
    # the (dropped) first character of the part after it; no other span takes in a separating space
    gaps = [(sp.start, sp.end) for sp in label.spans if sp.style == GAP]
    assert all(label.plain[a:b] == " " for a, b in gaps) and len(gaps) == len(parts) - 1
    bounds = [0] + [i for g in gaps for i in g] + [len(label.plain)]
    assert [label.plain[a:b] for a, b in zip(bounds[::2], bounds[1::2])] == parts
    styled = [label.plain[sp.start : sp.end] for sp in label.spans if sp.style != GAP]
    assert all(t in parts for t in styled), styled
    if node.role == "model":
        assert "MODEL" in styled and "1.7 MB" in styled


@pytest.mark.parametrize("width", [23, 26, 28, 30, 33])
def test_a_long_wrapper_start_gives_way_before_the_leaf(width):
    """HF Trainer FSDP names carry `model.model.`: where start, index and the leaf's two parts do not fit,
    the start before the index's own name goes first, so q_proj / k_proj stay apart."""
    for leaf in ("q_proj", "k_proj"):
        out = middle_ellipsis(f"model.model.layers.0.self_attn.{leaf}.weight", width)
        assert out == f"…layers.0…{leaf}.weight" and len(out) <= width


LORA = [
    f"base_model.model.model.layers.{layer}.self_attn.{p}_proj.lora_{ab}.weight"
    for layer in (0, 1, 10)
    for p in "qkv"
    for ab in "AB"
]


@pytest.mark.parametrize("width", [26, 29, 30, 34, 40, 60])
def test_distinct_cuts_keep_lora_rows_apart_and_the_wrapper_gives_way_first(width):
    from ckpt_tui.ui.format import distinct_cuts

    cuts = distinct_cuts(LORA, width)
    assert all(cell_len(c) <= width for c in cuts)
    assert len(set(cuts)) == len(LORA), cuts  # issue 23: q_proj and v_proj read the same
    if width >= 30:
        assert all(not c.startswith("base_model") for c in cuts)  # the PEFT wrapper went first


def test_distinct_cuts_change_nothing_where_the_plain_cut_already_differs():
    from ckpt_tui.ui.format import distinct_cuts

    names = [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(3)]
    assert distinct_cuts(names, 29) == [middle_ellipsis(n, 29) for n in names]
