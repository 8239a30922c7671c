"""Contracts later issues build on: nodes delivered as found, progress, cancel, printable plans."""

import threading

import pytest

from ckpt_tui.core.progress import Cancelled, Progress
from ckpt_tui.core.report import inspect
from ckpt_tui.core.types import Plan, PlanStep


def test_nodes_arrive_as_found_then_analyzed(real_ckpt):
    events = []
    rep = inspect(real_ckpt("hf-fsdp1"), on_node=lambda e: events.append((e.kind, e.node.path)))
    found = [p for k, p in events if k == "found"]
    analyzed = [p for k, p in events if k == "analyzed"]
    every = {n.path for n in rep.inventory.nodes()}
    assert set(found) == every and set(analyzed) == every
    # the whole tree is delivered before any header is read
    assert max(i for i, (k, _) in enumerate(events) if k == "found") < min(
        i for i, (k, _) in enumerate(events) if k == "analyzed"
    )
    # a folder is analysed after everything below it
    assert analyzed.index("checkpoint-2/pytorch_model_fsdp_0/.metadata") < analyzed.index(
        "checkpoint-2/pytorch_model_fsdp_0"
    )


def test_progress_counts_files_and_cancel_stops(real_ckpt):
    seen: list[Progress] = []
    inspect(real_ckpt("ds-zero2-bf16"), on_progress=seen.append)
    assert seen and seen[-1].done == seen[-1].total and seen[-1].unit == "files"
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    cancel = threading.Event()

    def stop_after_two(p):
        if p.done >= 2:
            cancel.set()

    with pytest.raises(Cancelled):
        inspect(real_ckpt("ds-zero2-bf16"), on_progress=stop_after_two, cancel=cancel)


def test_plan_is_printable_and_serialisable():
    plan = Plan(
        "Export model",
        (
            PlanStep("write", "out/model.safetensors", "ckpt/pytorch_model_fsdp_0", 2_000_000),
            PlanStep("copy", "out/config.json", "run/config.json", 700),
        ),
        ("tied: lm_head",),
    )
    text = plan.describe()
    assert "write" in text and "out/model.safetensors" in text and "2.0 MB" in text and "note: tied" in text
    assert plan.to_json()["total_bytes"] == 2_000_700
