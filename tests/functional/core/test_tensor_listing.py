"""Which tensors the user sees for a node (core.tensors.listable, asked by the TUI's table and by
`ckpt-tui tensors`) and that the listing is what the file really holds: every DeepSpeed model-states
and optim-states file of real ZeRO-2/ZeRO-3 and HF Trainer checkpoints listed from headers equals
torch.load of the file (names, shapes, dtypes); the optim-states reader an optimizer export will use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_tui.core.formats.deepspeed.reader import MODEL_STATES_RE, OPTIM_STATES_RE, read_optim_states
from ckpt_tui.core.report import inspect
from ckpt_tui.core.tensors import list_tensors, listable
from ckpt_tui.core.types import numel

ROOT = Path(__file__).resolve().parents[3]
TAGS = {"ds-zero2-bf16": "global_step2", "ds-zero3-bf16": "global_step2", "hf-ds-zero2": "checkpoint-2/global_step2"}


def loaded(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every tensor torch.load finds in ``path``, dotted as the object nests them."""
    out = {}
    stack = [("", torch.load(path, map_location="cpu", weights_only=False, mmap=True))]
    while stack:
        prefix, x = stack.pop()
        if isinstance(x, torch.Tensor):
            out[prefix] = (tuple(x.shape), str(x.dtype).removeprefix("torch."))
        elif isinstance(x, dict):
            stack += [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            stack += [(f"{prefix}.{i}" if prefix else str(i), v) for i, v in enumerate(x)]
    return out


def states_files(tag: Path) -> list[Path]:
    return sorted(p for p in tag.iterdir() if MODEL_STATES_RE.match(p.name) or OPTIM_STATES_RE.match(p.name))


@pytest.mark.parametrize("variant", list(TAGS))
def test_every_states_file_lists_what_torch_load_holds(real_ckpt, variant):
    root = real_ckpt(variant)
    inv = inspect(root).inventory
    files = states_files(root / TAGS[variant])
    assert len(files) >= 3 and any(OPTIM_STATES_RE.match(p.name) for p in files)
    for p in files:
        node = inv.node(f"{TAGS[variant]}/{p.name}")
        comp, note = listable(inv, node)
        assert comp is node and note == "", p.name  # the file itself, as the TUI's table shows it
        rows = list(list_tensors(comp, inv.parsed))
        got = {t.name: (tuple(t.shape), t.dtype) for t in rows}
        assert len(got) == len(rows) and got == loaded(p), p.name
        assert all(
            t.nbytes == numel(t.shape) * torch.empty(0, dtype=getattr(torch, t.dtype)).element_size() for t in rows
        )
        if OPTIM_STATES_RE.match(p.name):
            names = " ".join(got)
            assert "exp_avg" in names and "exp_avg_sq" in names and ("fp32_groups" in names or "fp32_flat" in names)


def _cli_tensors(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", "tensors", "--json", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("variant", list(TAGS))
def test_cli_tensors_lists_states_files(real_ckpt, variant):
    tag = real_ckpt(variant) / TAGS[variant]
    optim = next(p for p in states_files(tag) if OPTIM_STATES_RE.match(p.name))
    model = next(p for p in states_files(tag) if MODEL_STATES_RE.match(p.name))
    for p in (optim, model):
        r = _cli_tensors(p)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        got = {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in doc["tensors"]}
        assert got and got == loaded(p), p.name


def test_optim_states_reader_partitions_cover_every_parameter(real_ckpt):
    """ZeRO-2: each rank's slices of its fp32 partition, over all ranks, cover each parameter's elements
    exactly; the partition and the optimizer state are the file's tensors, named as torch.load nests them."""
    tag = real_ckpt("ds-zero2-bf16") / "global_step2"
    ms = torch.load(tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    shapes = {k: tuple(v) for g in ms["param_shapes"] for k, v in g.items()}
    covered = dict.fromkeys(shapes, 0)
    for p in sorted(tag.glob("*_optim_states.pt")):
        st = read_optim_states(p)
        real = torch.load(p, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        assert st.zero_stage == 2 and st.partition_count == 2 and st.dp_rank in (0, 1) and st.mp_rank == 0
        [(name, ref)] = st.fp32_partitions
        assert name == "optimizer_state_dict.single_partition_of_fp32_groups.0"
        assert ref.shape == tuple(real["single_partition_of_fp32_groups"][0].shape) and ref.dtype == "float32"
        state = {n.rsplit(".", 1)[-1]: r.shape for n, r in st.optimizer_state}
        assert state == {k: tuple(v.shape) for k, v in real["base_optimizer_state"]["state"][0].items()}
        for pname, (start, n) in st.slices.items():
            addr = real["param_slice_mappings"][0][pname]
            assert (start, n) == (addr.start, addr.numel) and start + n <= ref.shape[0]
            covered[pname] += n
    assert covered == {k: numel(s) for k, s in shapes.items()}


def test_zero3_optim_states_reader(real_ckpt):
    tag = real_ckpt("ds-zero3-bf16") / "global_step2"
    p = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    st = read_optim_states(p)
    assert (st.zero_stage, st.partition_count, st.dp_rank) == (3, 2, 1)
    real = torch.load(p, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    assert [r.shape for _, r in st.fp32_partitions] == [tuple(t.shape) for t in real["fp32_flat_groups"]]
    assert {n.rsplit(".", 1)[-1] for n, _ in st.optimizer_state} == set(real["optimizer_state_dict"]["state"][0])


def test_listable_picks_the_component_of_a_folder(real_ckpt):
    inv = inspect(real_ckpt("hf-ds-zero2")).inventory
    tag = inv.node("checkpoint-2/global_step2")
    assert listable(inv, tag) == (tag, "")
    comp, note = listable(inv, inv.root)  # a run folder: its newest checkpoint's model
    assert comp is tag and "newest checkpoint" in note and "global_step2" in note
    comp, note = listable(inv, inv.node("checkpoint-2"))
    assert comp is tag and "model component" in note
    assert listable(inv, inv.node("checkpoint-2/trainer_state.json")) == (None, "")
    st = inv.node("checkpoint-2/model.safetensors")
    assert listable(inv, st) == (st, "") and len(list(list_tensors(st))) == st.facts["tensor_count"]


def test_listable_dcp_files_show_their_folder_and_universal_param_folders(real_ckpt):
    inv = inspect(real_ckpt("fsdp2-dcp")).inventory
    assert inv.root.format == "dcp"
    comp, note = listable(inv, inv.node(".metadata"))
    assert comp is inv.root and "DCP folder" in note
    assert len(list(list_tensors(comp, inv.parsed, stored=True))) == inv.root.facts["tensor_count"]
    inv = inspect(real_ckpt("universal")).inventory
    uni = inv.node("global_step2_universal")
    assert listable(inv, inv.root)[0] is uni
    assert len(list(list_tensors(uni))) == uni.facts["tensor_count"]
    param = inv.node("global_step2_universal/zero/embed_tokens.weight")  # a parameter's folder: its fp32 weights
    comp, note = listable(inv, param)
    assert comp is param.child("fp32.pt") and "fp32.pt" in note
    real = torch.load(comp.abspath, map_location="cpu", weights_only=False)  # ZeRO-3's converter: a bare tensor
    assert [(t.name, t.shape, t.dtype) for t in list_tensors(comp)] == [("fp32.pt", tuple(real.shape), "float32")]


@pytest.mark.parametrize(
    "variant,rel",
    [
        ("ds-zero2-bf16", "global_step2/mp_rank_00_model_states.pt"),
        ("lightning-ds-zero2", "checkpoints/epoch=0-step=2.ckpt/checkpoint/mp_rank_00_model_states.pt"),
    ],
)
def test_stats_are_named_as_the_listing_names_them(real_ckpt, variant, rel):
    """`ckpt-tui stats` of a DeepSpeed model-states file reads the `module` weights (named `X`, as export
    names them); the listing of the same file names them `module.X`: each statistic carries the listing's
    name, so a table of the listing finds every row's statistics."""
    from ckpt_tui.core.analysis import stats

    path = real_ckpt(variant) / rel
    report = inspect(path)
    node = report.inventory.root
    listed = {t.name for t in list_tensors(node)}
    st = stats(path)
    assert st and {s.name for s in st}.isdisjoint(listed)  # the weights' own names are not the listing's
    assert {s.listed_as for s in st} <= listed
    assert {s.listed_as for s in st} == {n for n in listed if n.startswith("module.")}
    assert all(s.listed_as == f"module.{s.name}" for s in st)
    assert "listed_as" not in st[0].to_json()


# (fixture, the model component inside it): DCPs holding the model, several beside their optimizer state
LISTED_AS_WRITTEN = [
    ("fsdp2-dcp", "."),
    ("fsdp2-zstd", "."),
    ("dcp-mixed", "combined"),
    ("hf-fsdp2", "checkpoint-2/pytorch_model_fsdp_0"),
    ("torchtitan", "checkpoint/step-1"),
    ("lightning-fsdp", "checkpoints/epoch=0-step=2.ckpt"),
    ("hf-storage-distributed", "."),
]


@pytest.mark.parametrize("variant,rel", LISTED_AS_WRITTEN, ids=[f"{v}/{r}" for v, r in LISTED_AS_WRITTEN])
def test_what_is_listed_is_what_export_writes(real_ckpt, tmp_path, variant, rel):
    """Issue 25: `tensors` (and the TUI's table, which asks the same function) lists the names, dtypes and number
    of tensors export writes; the optimizer state saved beside them only under --component optimizer, and every
    stored entry under --stored."""
    import json

    from safetensors import safe_open

    from ckpt_tui.core.export.api import export
    from tests.util import ckpt_tui

    src = real_ckpt(variant) / rel
    export(src, tmp_path / "out", verify=False)
    written = {}
    for f in (tmp_path / "out").glob("model*.safetensors"):
        with safe_open(str(f), "pt") as st:
            written.update(
                {k: (tuple(st.get_slice(k).get_shape()), str(st.get_slice(k).get_dtype())) for k in st.keys()}
            )
    r = ckpt_tui("tensors", str(src), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in json.loads(r.stdout)["tensors"]}
    short = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    assert {k: (s, short.get(d, d)) for k, (s, d) in written.items()} == listed
    inv = inspect(src).inventory
    node, _ = listable(inv, inv.root)
    assert [t.name for t in list_tensors(node, inv.parsed)] == [t["name"] for t in json.loads(r.stdout)["tensors"]]
    if node.role == "model+optimizer":
        opt = json.loads(ckpt_tui("tensors", str(src), "--component", "optimizer", "--json", cwd=tmp_path).stdout)
        stored = json.loads(ckpt_tui("tensors", str(src), "--stored", "--json", cwd=tmp_path).stdout)
        assert opt["tensors"] and not {t["name"] for t in opt["tensors"]} & set(listed)
        assert len(stored["tensors"]) == node.facts["tensor_count"] > len(listed)
        assert node.facts["model_tensor_count"] == len(listed)  # the count the TUI's details show


def _plain_dcp_run(root):
    """A run saved with torch's own dcp.save, step-1/ and step-2/ (model and optimizer), one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters())
    for step in (1, 2):
        m(torch.randn(2, 8)).sum().backward()
        opt.step()
        msd, osd = get_state_dict(m, opt)
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(root / f"step-{step}"))
    return m


def test_a_plain_dcp_run_is_torch_dcp_and_tensors_run_lists_what_export_run_takes(tmp_path):
    """Issue 25: a folder name (step-N) is no evidence of torchtitan; `tensors RUN` lists the checkpoint
    `export RUN` takes, and says which."""
    import json
    import warnings

    from safetensors.torch import load_file

    from tests.util import ckpt_tui

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "torch.distributed is disabled ... assuming ... a single process"
        m = _plain_dcp_run(tmp_path / "run")
    doc = json.loads(ckpt_tui("inspect", "run", "--json", cwd=tmp_path).stdout)
    assert "torchtitan" not in doc["summary"] and "torch.distributed.checkpoint" in doc["summary"], doc["summary"]
    assert [c["layout"] for c in doc["checkpoints"]] == ["dcp", "dcp"]
    r = ckpt_tui("tensors", "run", "--json", cwd=tmp_path)
    assert r.returncode == 0 and "step-2" in r.stderr, r.stderr
    listed = [t["name"] for t in json.loads(r.stdout)["tensors"]]
    r = ckpt_tui("export", "run", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0 and "`run/step-2/`" in r.stderr, r.stderr
    got = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(listed) == sorted(got) == sorted(m.state_dict())
    assert all(torch.equal(got[k], v) for k, v in m.state_dict().items())  # step 2's weights


def test_torchtitan_is_named_from_its_entries_and_its_last_step_export_from_the_run(real_ckpt, tmp_path):
    import json

    from tests.util import ckpt_tui

    doc = json.loads(ckpt_tui("inspect", str(real_ckpt("torchtitan")), "--json", cwd=tmp_path).stdout)
    # step-1 holds train_state, dataloader, lr_scheduler; step-2 is the model-only last-step export beside it
    assert [(c["path"], c["layout"]) for c in doc["checkpoints"]] == [
        ("checkpoint/step-2", "torchtitan"),
        ("checkpoint/step-1", "torchtitan"),
    ]
