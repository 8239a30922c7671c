"""The checkpoint tree: children are added when a folder is expanded, so a folder of 100,000
files shows at once. A DeepSpeed universal checkpoint folder (a folder per parameter, several files
each) stays collapsed with its summary until it is expanded. The top folder's small sub-folders are open at load,
unless together they add more than ``AUTO_OPEN_LINES`` lines (a run of 200 checkpoints shows a line per checkpoint).

The pane is as wide as its shown lines (CSS ``width: auto``, see ``get_content_width``), within limits: while
the tree has the focus it leaves the right pane ``RIGHT_ROOM`` columns, so at 120 columns no file name is
cut (``RUN_ROOM`` while it shows a run folder's run view, whose table then fits at 80 columns); while the right
pane has it the tree takes at most ``SHARE_UNFOCUSED`` of the width, so tensor names
get the room."""

from __future__ import annotations

import re
from typing import Any, Optional

from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from ...core.formats.registry import format_of
from ...core.types import Node
from ..format import node_label, plain_text, visible

MAX_CHILDREN = 400
# the top folder's sub-folders are opened at load when the lines they add total at most this; a run of 200 checkpoints
# (1,200 files) shows a line per checkpoint instead: each line is measured for the pane's width, and the run view is
# the overview of such a run
AUTO_OPEN_LINES = 200


def natural_key(name: str) -> tuple[list[object], str]:
    """Sorts names with their numbers as numbers: checkpoint-900 before checkpoint-1000, rank_2 before rank_10
    (the scan lists them by code point, as ``ls`` does). re.split puts the digit runs at the odd places, so two keys
    compare text with text and numbers with numbers; the name itself breaks ties (``step_01`` and ``step_1``)."""
    parts = re.split(r"(\d+)", name)
    return [int(p) if i % 2 else p for i, p in enumerate(parts)], name


class CheckpointTree(Tree[Node]):
    BINDINGS = [Binding("j", "cursor_down", "Down", show=False), Binding("k", "cursor_up", "Up", show=False)]
    DEFAULT_CSS = """
    CheckpointTree { width: auto; min-width: 24; padding-right: 1; }
    """
    RIGHT_ROOM = 40  # columns left to the right pane while the tree has the focus (its table shows a name and shape)
    RUN_ROOM = 54  # ... and while it shows a run view (its checkpoints' table fits whole at 80 columns)
    SHARE_UNFOCUSED = 1 / 3  # the most of its container the tree takes while the focus is elsewhere on its screen

    def __init__(self, **kw: Any) -> None:
        super().__init__("…", **kw)
        self.show_root = True
        self.guide_depth = 2
        self.findings_by_path: dict[str, list] = {}
        self.adapter_path: Optional[str] = None  # the node badged ADAPTER (a LoRA adapter's weights)
        self._by_path: dict[str, TreeNode[Node]] = {}
        self.right_room = self.RIGHT_ROOM  # RUN_ROOM while the right pane shows the run view

    def content_width(self) -> int:
        """Cells the shown lines need (guides, icons and labels): the width at which no label is cut,
        without the pane's border and scrollbar. Changes as folders open and close."""
        self._tree_lines  # builds the lines (and the virtual size) if a change left them stale
        return self.virtual_size.width

    def get_content_width(self, container: Size, viewport: Size) -> int:
        """``width: auto``: the content's width, at most what the limits above leave. ``container`` is the
        parent's width less this pane's border; the scrollbar is added after this."""
        return self._content_width_within(container, self.right_room)

    def pane_width(self, parent: Size, right_room: int) -> int:
        """The whole pane's width (border and scrollbar included) that a layout in ``parent`` (its content size)
        gives this tree while it leaves the right pane ``right_room`` columns: what the screen reckons the run
        view's panel will get before the layout that shows it."""
        gutter = self.styles.gutter.width
        inner = Size(max(0, parent.width - gutter), parent.height)
        width = self._content_width_within(inner, right_room) + gutter
        if self.show_vertical_scrollbar:  # added by Textual after get_content_width
            width += self.styles.scrollbar_size_vertical
        least = self.styles.min_width
        return max(width, (least.cells or 0) if least is not None else 0)

    def _content_width_within(self, container: Size, right_room: int) -> int:
        outer = container.width + self.styles.gutter.width
        if self._focus_elsewhere():
            limit = int(outer * self.SHARE_UNFOCUSED)
        else:
            limit = outer - right_room
        bar_size = self.styles.scrollbar_size_vertical
        shown = self.show_vertical_scrollbar
        # more lines than rows: the scrollbar shows after the layout that reveals it, and Textual adds its width
        # then; reserved now, so the pane's width holds and the right pane is laid out (and the run table filled)
        # once, not twice
        scrolls = self.last_line + 1 > container.height
        bar = bar_size if shown or scrolls else 0
        width = max(0, min(self.content_width(), limit - self.styles.gutter.width - bar))
        return width + bar_size if scrolls and not shown else width

    def _focus_elsewhere(self) -> bool:
        """Another widget of this screen has the focus (a dialog on top leaves the screen's focus as it was)."""
        try:
            focused = self.screen.focused
        except Exception:  # not mounted yet
            return False
        return focused is not None and focused is not self

    def on_focus(self) -> None:
        self.refresh(layout=True)

    def on_blur(self) -> None:
        self.refresh(layout=True)

    def load(self, root: Node, findings_by_path: dict[str, list], adapter_path: Optional[str] = None) -> None:
        """Show ``root``'s tree; ``adapter_path``: the node holding a LoRA adapter (badged ADAPTER)."""
        self.findings_by_path = findings_by_path
        self.adapter_path = adapter_path
        self.clear()
        self._by_path = {}
        self.root.set_label(self._label(root))
        self.root.data = root
        self._by_path["."] = self.root
        self._fill(self.root, root)
        self.root.expand()
        opened = [(tn, n) for tn in self.root.children if (n := tn.data) is not None and self._opens(n)]
        if sum(len(n.children) for _, n in opened) > AUTO_OPEN_LINES:
            return  # many checkpoints: a line each
        for tn, n in opened:
            self._fill(tn, n)
            tn.expand()

    @staticmethod
    def _opens(node: Node) -> bool:
        """A sub-folder of the top one opened at load: a small folder, not one shown collapsed (universal)."""
        return node.is_dir and len(node.children) <= 40 and not format_of(node).collapsed

    def _subtree_findings(self, node: Node) -> list:
        if not node.is_dir:
            return self.findings_by_path.get(node.path, [])
        pre = "" if node.path == "." else node.path + "/"
        return [f for p, fs in self.findings_by_path.items() if p == node.path or p.startswith(pre) for f in fs]

    def _label(self, node: Node) -> Text:
        label = node_label(node, self._subtree_findings(node), adapter=node.path == self.adapter_path)
        fmt = format_of(node)
        if fmt.one_line:  # a universal checkpoint: its summary on its line
            label.append(" ")
            label.append(visible(fmt.tree_label(node) or ""), style="dim")
        return label

    def _fill(self, tnode, node: Node) -> None:
        if getattr(tnode, "_filled", False):
            return
        tnode._filled = True
        kids = sorted(node.children, key=lambda c: (not c.is_dir, natural_key(c.name)))
        for c in kids[:MAX_CHILDREN]:
            label = self._label(c)
            if c.is_dir:
                child = tnode.add(label, data=c, allow_expand=bool(c.children))
            else:
                child = tnode.add_leaf(label, data=c)
            self._by_path[c.path] = child
        if len(kids) > MAX_CHILDREN:
            tnode.add_leaf(plain_text(f"… {len(kids) - MAX_CHILDREN} more (use `ckpt-tui inspect --all`)"))

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        if event.node.data is not None:
            self._fill(event.node, event.node.data)

    def select_path(self, path: str) -> None:
        """Expand the way down to ``path`` and move the cursor there."""
        parts = [] if path == "." else path.split("/")
        tnode = self.root
        node = self.root.data
        for i in range(len(parts)):
            if node is None:
                break
            self._fill(tnode, node)
            tnode.expand()
            sub = "/".join(parts[: i + 1])
            nxt = self._by_path.get(sub)
            if nxt is None:
                break
            tnode, node = nxt, nxt.data

        def place():  # line numbers exist only after the tree has been laid out
            self.move_cursor(tnode)
            self.scroll_to_node(tnode, animate=False)

        self.call_after_refresh(place)
