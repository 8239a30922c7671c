"""The export wizard's domain answers come from the core: which components it offers (model weights
only, not the files inside them) and the free space an export needs (``export_needs``: exactly what the
export writes, never the optimizer states). On real checkpoints."""

from __future__ import annotations

import pytest

from ckpt_tui.core.export.api import export, export_needs
from ckpt_tui.core.report import inspect


def test_export_candidates_are_model_weights_not_their_parts(real_ckpt):
    inv = inspect(real_ckpt("universal")).inventory
    assert inv.export_candidates() == [("global_step2_universal", "the model component")]  # not 16 fp32.pt files
    inv = inspect(real_ckpt("accelerate-save-state")).inventory
    paths = [p for p, _ in inv.export_candidates()]
    assert paths == ["model.safetensors"] and inv.components["optimizer"] not in paths
    inv = inspect(real_ckpt("hf-ds-zero2")).inventory
    assert [p for p, _ in inv.export_candidates()] == ["checkpoint-2/global_step2", "checkpoint-2/model.safetensors"]


NEEDS = [
    ("hf-ds-zero2", "checkpoint-2/global_step2", {}),
    ("ds-zero2-bf16", "global_step2", {"dtype": "bf16"}),
    ("hf-model-sharded", "model.safetensors.index.json", {"max_shard_size": "100KB"}),
    ("fsdp2-dcp", ".", {}),
]


@pytest.mark.parametrize("variant,rel,opts", NEEDS)
def test_export_needs_is_the_written_output_size(real_ckpt, tmp_path, variant, rel, opts):
    """The number the export wizard shows (and export's free-space check uses) is what the export writes,
    byte for byte -- model weights, headers, index, copied config files -- not the component's size on
    disk (a DeepSpeed tag's size counts every rank's optimizer states)."""
    rep = inspect(real_ckpt(variant))
    node = rep.inventory.node(rel)
    assert rel in [p for p, _ in rep.inventory.export_candidates()]
    need = export_needs(rep, node, **opts)
    out = tmp_path / "out"
    res = export(node.abspath, out, verify=False, **opts)
    written = sum(p.stat().st_size for p in out.iterdir())
    assert need == written and res.files
    if variant.startswith(("hf-ds", "ds-")):
        assert need < node.size / 2  # the optimizer states are not counted
    if opts.get("max_shard_size"):
        assert len(res.files) > 1 and (out / "model.safetensors.index.json").is_file()
