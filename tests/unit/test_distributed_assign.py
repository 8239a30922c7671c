"""Which rank writes which output file (core/export/distributed.assign) and when `export` counts as run by a
launcher (launch_env): table-driven, synthetic plans, no torch."""

from pathlib import Path

import pytest

from ckpt_tui.core.export.distributed import assign, launch_env
from ckpt_tui.core.export.plan import ExportPlan, OutFile, OutTensor
from ckpt_tui.core.export.sources import Source, SourceTensor
from ckpt_tui.core.export.write import ExportError


def plan(*sizes: int) -> ExportPlan:
    files = [
        OutFile(f"f{i}", [OutTensor(f"t{i}", (n,), "uint8", SourceTensor(f"t{i}", (n,), "uint8"))])
        for i, n in enumerate(sizes)
    ]
    return ExportPlan(Source("dcp", Path("/src"), []), Path("/out"), files, index=len(files) > 1)


@pytest.mark.parametrize(
    "sizes,world,want",
    [
        ((100, 100, 66), 2, [[0, 2], [1]]),  # largest first to the least loaded, ties to the lower rank
        ((10, 50, 40), 2, [[1], [0, 2]]),
        ((5,), 3, [[0], [], []]),  # fewer files than ranks: some ranks idle
        ((1, 1, 1, 1), 2, [[0, 2], [1, 3]]),
        ((7, 3, 3, 1), 1, [[0, 1, 2, 3]]),
    ],
)
def test_assign_is_greedy_by_bytes_and_deterministic(sizes, world, want):
    assert assign(plan(*sizes), world) == want


@pytest.mark.parametrize(
    "environ,want",
    [
        ({}, None),
        ({"WORLD_SIZE": "1", "RANK": "0"}, None),  # torchrun --nproc_per_node 1: the single-process export
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, (1, 2, "h", 29500, False)),
        (
            {
                "WORLD_SIZE": "2",
                "RANK": "0",
                "MASTER_ADDR": "h",
                "MASTER_PORT": "1",
                "TORCHELASTIC_USE_AGENT_STORE": "True",
            },
            (0, 2, "h", 1, True),
        ),
    ],
)
def test_launch_env(environ, want):
    got = launch_env(environ)
    assert (got if got is None else (got.rank, got.world, got.addr, got.port, got.agent_store)) == want


def test_launch_env_without_master_says_what_to_set():
    with pytest.raises(ExportError, match="MASTER_ADDR, MASTER_PORT is not set"):
        launch_env({"WORLD_SIZE": "2", "RANK": "0"})
