"""Names you can read at any width (issue 12): the tree pane is as wide as its names within limits, and the
tensor table gives the name what the other columns leave, cut in the middle so the layer index stays.

Read from what the screen shows (the compositor's rendered lines, sliced to each widget's region), never
from the widgets' computed widths: a name is "not cut" when it appears whole on screen.
"""

from __future__ import annotations

import contextlib
import re
import time

import pytest
from textual.widgets import DataTable

from ckpt_tui.core.present import shape_text
from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.widgets.details import MAX_ROWS, TensorTable
from ckpt_tui.ui.widgets.tree import CheckpointTree
from tests.fixtures import REGISTRY, SKIPPED, fixture_path

ALL = [k for k in REGISTRY if k not in SKIPPED]
TWO_LAYER = [
    "ds-zero2-bf16",
    "hf-ds-zero2",
    "hf-fsdp1",
    "fsdp2-dcp",
    "hf-model-sharded",
    "lightning-ds-zero2",
    "universal",
]  # the model and folder layouts the fixtures cover, each a 2-layer model


def widget_lines(app, widget) -> list[str]:
    """The text the screen shows inside ``widget``'s region, line by line (clipped by its containers: a
    table taller than its pane shows only its top)."""
    compositor = app.screen._compositor
    lines = [strip.text for strip in compositor.render_strips()]
    r = compositor.find_widget(widget).visible_region
    return [line[r.x : r.right] for line in lines[r.y : r.bottom]]


async def wait_for(pilot, cond, what: str, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def settled(pilot, app) -> None:
    """Wait until two renders in a row are the same (a state, not a number of seconds)."""
    last, t0 = None, time.monotonic()
    while (shot := [s.text for s in app.screen._compositor.render_strips()]) != last:
        assert time.monotonic() - t0 < 60, "the screen kept changing"
        last = shot
        await pilot.pause(0.05)


async def opened(pilot, app) -> CheckpointTree:
    """The scan is done, the tree is loaded and the tensor table drawn at its width."""
    tree = app.query_one(CheckpointTree)
    tensors = app.query_one(TensorTable)
    await wait_for(pilot, lambda: app.report is not None and tree.root.data is not None, "the scan")
    if app.main.run_view is not None:
        # a run folder opens on its run view (issue 28): its tensor table is a checkpoint's, the newest one's
        newest = app.main.run_view.rows[0].path
        tree.select_path(newest)
        await wait_for(pilot, lambda: app.selected is not None and app.selected.path == newest, "the newest checkpoint")
    await wait_for(pilot, lambda: app.selected is not None and tensors.is_drawn(), "the tensor table")
    await settled(pilot, app)
    return tree


def _tree_nodes(node):
    yield node
    for child in node.children:
        yield from _tree_nodes(child)


async def open_every_folder(pilot, tree: CheckpointTree) -> None:
    while closed := [n for n in _tree_nodes(tree.root) if n.allow_expand and not n.is_expanded]:
        for n in closed:
            n.expand()
        await wait_for(pilot, lambda: all(n.children for n in closed), "the folders' children")


def _name(node) -> str:
    n = node.data
    return (n.abspath.name if n.path == "." else n.name) + ("/" if n.is_dir else "")


async def assert_tree_names_whole(pilot, app, tree: CheckpointTree) -> int:
    """Page through the tree; every line shows its node's whole name. Returns the number of lines read."""
    read = 0
    total = tree.last_line + 1
    for top in range(0, total, max(1, tree.scrollable_content_region.height)):
        tree.scroll_to(y=top, animate=False, immediate=True)
        await settled(pilot, app)
        y0 = round(tree.scroll_offset.y)
        for i, line in enumerate(widget_lines(app, tree)):
            node = tree.get_node_at_line(y0 + i)
            if node is None or node.data is None:
                continue
            assert _name(node) in line, f"{_name(node)!r} is cut at {app.size.width} columns: {line!r}"
            read += 1
    return read


def table_rows(app) -> tuple[str, list[str]]:
    """The tensor table's header and its visible rows, as shown."""
    table = app.query_one(TensorTable).query_one(DataTable)
    lines = widget_lines(app, table)
    return lines[0], [line for line in lines[1 : 1 + table.row_count]]


@contextlib.asynccontextmanager
async def every_folder_open(key: str, size: tuple[int, int], monkeypatch):
    """Fixture ``key`` opened as typed from its parent folder, at ``size``, every folder of the tree open."""
    path = fixture_path(key)
    monkeypatch.chdir(path.parent)
    app = make_app(path.name)
    async with app.run_test(size=size) as pilot:
        tree = await opened(pilot, app)
        await open_every_folder(pilot, tree)
        yield pilot, app, tree


@pytest.mark.parametrize("key", ALL)
async def test_at_120_columns_no_file_name_is_cut_with_the_tree_focused(key, monkeypatch):
    async with every_folder_open(key, (120, 40), monkeypatch) as (pilot, app, tree):
        assert app.focused is tree
        assert await assert_tree_names_whole(pilot, app, tree) >= 2


@pytest.mark.parametrize("key", TWO_LAYER)
async def test_at_200_columns_no_file_or_tensor_name_is_cut(key, monkeypatch):
    async with every_folder_open(key, (200, 50), monkeypatch) as (pilot, app, tree):
        await assert_tree_names_whole(pilot, app, tree)
        # every component's tensors: move the cursor to each node that lists tensors
        seen = 0
        for node in [n for n in _tree_nodes(tree.root) if n.data is not None]:
            if app.main.component_for(node.data)[0] is None:
                continue  # nothing the core lists for it
            if node.data.path == "." and app.main.run_view is not None:
                continue  # a run folder's own line shows its run view (issue 28), its checkpoints their tensors
            app.main.selected = node.data
            tensors = app.main.query_one(TensorTable)
            table = tensors.query_one(DataTable)
            await wait_for(pilot, lambda: tensors.rows and tensors.is_drawn(), f"the tensors of {node.data.path}")
            for top in range(0, min(len(tensors.rows), MAX_ROWS), max(1, table.scrollable_content_region.height - 1)):
                table.scroll_to(y=top, animate=False, immediate=True)
                await settled(pilot, app)
                header, rows = table_rows(app)
                assert header.split() == ["name", "size", "dtype", "shape"]
                y0 = round(table.scroll_offset.y)
                for i, line in enumerate(rows):
                    r = tensors.rows[y0 + i]
                    if len(r.name) > NAME_FITS_200:  # not a weight: a framework's state key (a Lightning
                        assert shape_text(r.shape) in line  # callback's repr) -- cut in the middle
                        continue
                    assert r.name in line and shape_text(r.shape) in line, f"{r.name!r} is cut: {line!r}"
                    seen += 1
        assert seen >= 10


NAME_FITS_200 = 100  # a weight's name this long is whole at 200 columns (the 2-layer fixtures' are far shorter)


@pytest.mark.parametrize("key", ["hf-ds-zero2", "hf-fsdp1", "ds-zero2-bf16"])
async def test_at_80_columns_every_tensor_row_shows_its_layer_index_and_shape(key, monkeypatch):
    path = fixture_path(key)
    monkeypatch.chdir(path.parent)
    app = make_app(path.name)
    async with app.run_test(size=(80, 24)) as pilot:
        await opened(pilot, app)
        tensors = app.query_one(TensorTable)
        header, rows = table_rows(app)
        assert "shape" in header.split()
        indexed = 0
        for r, line in zip(tensors.rows, rows):
            m = re.match(r"(.*?)([^.]+\.\d+)\.", r.name)
            if m:  # `model.layers.10`: the layer index with its own name (a long wrapper start may give way)
                start = m.group(1) + m.group(2)
                assert start + "." in line or start + "…" in line or f"…{m.group(2)}…" in line, (
                    f"{r.name!r} lost its layer: {line!r}"
                )
                indexed += 1
            assert shape_text(r.shape) in line, f"the shape of {r.name!r} is cut: {line!r}"
        assert indexed >= 3  # the rows shown are layer rows, not just the embedding


async def test_the_tree_gives_way_to_the_table_when_the_table_has_the_focus(monkeypatch):
    path = fixture_path("hf-ds-zero2")
    monkeypatch.chdir(path.parent)
    app = make_app(path.name)
    async with app.run_test(size=(120, 40)) as pilot:
        tree = await opened(pilot, app)
        target = "checkpoint-2/global_step2"
        tree.select_path(target)
        await wait_for(pilot, lambda: tree.cursor_node and tree.cursor_node.data.path == target, "the cursor")
        tree.cursor_node.expand()
        await wait_for(pilot, lambda: len(tree.cursor_node.children) == 3, "global_step2 open")
        await settled(pilot, app)
        long = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
        assert any(long in line for line in widget_lines(app, tree))  # focused: the tree's names whole
        tensors = app.query_one(TensorTable)
        tensors.query_one(DataTable).focus()
        await wait_for(pilot, lambda: tree.region.width <= 40, "the tree to give way")
        await wait_for(pilot, tensors.is_drawn, "the table redrawn at its new width")
        await settled(pilot, app)
        _, rows = table_rows(app)
        assert len(rows) >= 15 and all(r.name in line for r, line in zip(tensors.rows, rows)), rows  # names whole
        assert not any(long in line for line in widget_lines(app, tree))
