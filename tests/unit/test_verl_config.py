"""A verl actor folder's ``fsdp_config.json`` is read through what every Location answers (``read_bytes``), so a
folder in object storage gets its facts as a local one does (a RemotePath has no ``read_text``)."""

from __future__ import annotations

from pathlib import Path

from ckpt_tui.core.formats.verl.format import VerlFolder
from ckpt_tui.core.types import Node


class _BytesOnly:
    """A file that, like storage.RemotePath, answers read_bytes and not read_text."""

    name = "fsdp_config.json"

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read_bytes(self) -> bytes:
        return self.data


def test_fsdp_config_read_from_a_location_without_read_text():
    cfg = Node("actor/fsdp_config.json", Path("/nonexistent/actor/fsdp_config.json"), False, format="json")
    cfg.abspath = _BytesOnly(b'{"FSDP_version": 2, "world_size": 2}')
    shard = Node("actor/model_world_size_2_rank_1.pt", Path("/nonexistent/actor/model_world_size_2_rank_1.pt"), False)
    actor = Node("actor", Path("/nonexistent/actor"), True, children=[cfg, shard])
    VerlFolder().analyze(actor, None)
    assert actor.facts["fsdp_version"] == 2
    assert actor.facts["config_world_size"] == 2
