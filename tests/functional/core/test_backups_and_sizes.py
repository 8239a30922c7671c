"""What `ckpt-tui fix` leaves is shown for what it is: its backup has role `backup` (never read, no finding
of its own), and folder sizes count a file with several names (the backup while it is a hard link of
its target) once. Run on copies of real DeepSpeed checkpoints with the real `ckpt-tui fix`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ckpt_tui.core.repair.atomic import backup_path
from ckpt_tui.core.report import inspect
from ckpt_tui.core.tensors import listable

ROOT = Path(__file__).resolve().parents[3]
MS = "mp_rank_00_model_states.pt"


def ckpt_tui(*args: str) -> subprocess.CompletedProcess:
    from ckpt_tui.samples import launch_env

    env = dict(launch_env(), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_fix_backup_has_role_backup_and_sizes_add_only_the_new_file(real_ckpt_copy):
    root = real_ckpt_copy("ds-zero2-bf16")
    tag = root / "global_step2"
    before = inspect(root)
    tag_size, root_size = before.inventory.node("global_step2").size, before.inventory.root.size
    assert tag_size == sum(p.stat().st_size for p in tag.iterdir())
    r = ckpt_tui("fix", str(root), "--only", "universal-info", "--yes")
    assert r.returncode == 0, r.stderr
    bak = backup_path(tag / MS)
    assert bak.is_file() and os.stat(bak).st_nlink == 1  # the old file, under the backup's name only
    new = (tag / MS).stat().st_size
    rep = inspect(root)
    inv = rep.inventory
    node = inv.node(f"global_step2/{bak.name}")
    assert (node.role, node.format) == ("backup", "backup")
    assert node.facts == {"backup_of": MS, "backup_of_format": "deepspeed-model-states"}
    assert inv.node("global_step2").size == tag_size + new and inv.root.size == root_size + new
    assert not [f for f in rep.findings if f.path == node.path]
    assert inv.node("global_step2").format == "deepspeed-zero"  # the tag is still read as before
    comp, note = listable(inv, node)
    assert comp is None and MS in note and "backup" in note
    doc = json.loads(ckpt_tui("inspect", "--json", str(root)).stdout)
    [j] = [n for n in doc["nodes"] if n["path"] == node.path]
    assert j["role"] == "backup" and j["format"] == "backup" and j["facts"]["backup_of"] == MS


def test_a_hard_linked_backup_is_counted_once(real_ckpt_copy):
    """A repair killed between its backup link and the replace leaves the backup as a hard link of the
    target (the next run reuses it): the same bytes on disk once, so the sizes must not change."""
    root = real_ckpt_copy("ds-zero2-bf16")
    tag = root / "global_step2"
    inv = inspect(root).inventory
    tag_size, root_size = inv.node("global_step2").size, inv.root.size
    os.link(tag / MS, backup_path(tag / MS))
    inv = inspect(root).inventory
    bak = inv.node(f"global_step2/{backup_path(tag / MS).name}")
    assert bak.role == "backup" and bak.size == (tag / MS).stat().st_size and bak.facts["hard_links"] == 2
    assert inv.node(f"global_step2/{MS}").facts["hard_links"] == 2
    assert inv.node("global_step2").size == tag_size and inv.root.size == root_size
    # a second hard link elsewhere in the tree: still once, in the folder that holds it first
    os.link(tag / MS, root / "copy_of_model_states.pt")
    inv = inspect(root).inventory
    assert inv.root.size == root_size
