"""deepspeed_source / universal_source against DeepSpeed itself (zero_to_fp32), bit for bit."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ckpt_tui.core.export.sources import to_torch  # noqa: E402
from ckpt_tui.core.formats.deepspeed.universal import universal_source  # noqa: E402
from ckpt_tui.core.formats.deepspeed.zero import ZERO1_FROZEN_NOTE, deepspeed_source  # noqa: E402

ENGINE = "global_step2"
HF = "checkpoint-2/global_step2"
LIGHTNING = "checkpoints/epoch=0-step=2.ckpt/checkpoint"
VARIANTS = {
    "ds-zero1-bf16": ENGINE,
    "ds-zero2-bf16": ENGINE,
    "ds-zero3-bf16": ENGINE,
    "ds-zero2-fp32": ENGINE,
    "ds-zero2-tied": ENGINE,
    "ds-zero1-frozen": ENGINE,
    "ds-zero2-frozen": ENGINE,
    "ds-zero3-frozen": ENGINE,
    "ds-zero2-3ranks": ENGINE,
    "ds-zero3-3ranks": ENGINE,
    "hf-ds-zero1": HF,
    "hf-ds-zero2": HF,
    "hf-ds-zero3": HF,
    "hf-ds-zero2-tied-frozen": HF,
    "lightning-ds-zero2": LIGHTNING,
    "lightning-ds-zero3": LIGHTNING,
}
FROZEN = {"ds-zero1-frozen", "ds-zero2-frozen", "ds-zero3-frozen", "hf-ds-zero2-tied-frozen"}


def _reference(tag_dir: Path, exclude_frozen: bool):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with contextlib.redirect_stdout(io.StringIO()):
        return get_fp32_state_dict_from_zero_checkpoint(
            str(tag_dir.parent), tag=tag_dir.name, exclude_frozen_parameters=exclude_frozen
        )


def _module_weights(tag_dir: Path) -> dict:
    return torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]


@pytest.mark.parametrize(
    "variant,exclude_frozen", [(v, False) for v in VARIANTS] + [(v, True) for v in VARIANTS if v in FROZEN]
)
def test_matches_zero_to_fp32(real_ckpt, variant, exclude_frozen):
    tag_dir = real_ckpt(variant) / VARIANTS[variant]
    ref = _reference(tag_dir, exclude_frozen)
    src = deepspeed_source(tag_dir, exclude_frozen=exclude_frozen)
    assert src.kind == "deepspeed"
    assert src.train_dtype == (None if variant == "ds-zero2-fp32" else "bfloat16")
    got = {t.name: t for t in src.tensors}
    assert len(got) == len(src.tensors)  # unique names

    extra = [n for n in got if n not in ref]
    if variant == "ds-zero1-frozen" and not exclude_frozen:
        # zero_to_fp32 silently drops ZeRO-1 frozen params; we read them from the module weights
        assert extra == ["embed_tokens.weight"]
        t = got["embed_tokens.weight"]
        assert t.frozen and t.dtype == "bfloat16" and t.note == ZERO1_FROZEN_NOTE
        w = _module_weights(tag_dir)["embed_tokens.weight"]
        assert torch.equal(to_torch(t).float(), w.float())
        assert src.notes
    else:
        assert extra == []
    # same names in the same order as zero_to_fp32
    assert [n for n in got if n in ref] == list(ref)

    for name, want in ref.items():
        t = got[name]
        assert t.ranges is not None and t.load is None
        assert t.shape == tuple(want.shape), name
        assert sum(r.length for r in t.ranges) == t.nbytes, name
        have = to_torch(t)
        if have.dtype != want.dtype:
            have, want = have.float(), want.float()
        assert torch.equal(have, want), name


def test_flags(real_ckpt):
    src = deepspeed_source(real_ckpt("ds-zero2-frozen") / ENGINE)
    by = {t.name: t for t in src.tensors}
    assert by["embed_tokens.weight"].frozen and not by["lm_head.weight"].frozen
    assert [t.name for t in src.tensors][:2] == ["position_scale", "embed_tokens.weight"]

    src = deepspeed_source(real_ckpt("ds-zero2-tied") / ENGINE)
    by = {t.name: t for t in src.tensors}
    assert by["lm_head.weight"].tied_to == "embed_tokens.weight"
    assert by["lm_head.weight"].ranges == by["embed_tokens.weight"].ranges
    assert src.tensors[-1].name == "lm_head.weight"

    src = deepspeed_source(real_ckpt("hf-ds-zero2-tied-frozen") / HF)
    by = {t.name: t for t in src.tensors}
    assert by["lm_head.weight"].tied_to == "model.embed_tokens.weight" and by["lm_head.weight"].frozen
    names = {t.name for t in deepspeed_source(real_ckpt("hf-ds-zero2-tied-frozen") / HF, exclude_frozen=True).tensors}
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" not in names


def test_zero3_spans_ranks_without_padding(real_ckpt):
    src = deepspeed_source(real_ckpt("ds-zero3-3ranks") / ENGINE)
    files = {r.path for t in src.tensors for r in (t.ranges or ())}
    assert sum("optim_states" in f for f in files) == 3
    for t in src.tensors:
        if t.name != "position_scale":
            assert len({r.path for r in t.ranges}) == 3  # one slice per rank
            assert sum(r.length for r in t.ranges) == t.numel * 4  # padding never included


@pytest.mark.parametrize("variant", ["universal", "universal-zero2"])
def test_universal(real_ckpt, variant):
    udir = real_ckpt(variant) / "global_step2_universal"
    src = universal_source(udir)
    assert src.kind == "universal" and src.train_dtype == "bfloat16"
    params = sorted(p.name for p in (udir / "zero").iterdir() if (p / "fp32.pt").is_file())
    by = {t.name: t for t in src.tensors}
    assert params and set(params) <= set(by)
    model_states = sorted(udir.glob("*model_states.pt"))[0]
    ms = torch.load(model_states, map_location="cpu", weights_only=False)
    shapes = {k: tuple(v) for g in ms["param_shapes"] for k, v in g.items()}
    for name in params:
        obj = torch.load(udir / "zero" / name / "fp32.pt", map_location="cpu", weights_only=False)
        want = obj["param"] if isinstance(obj, dict) else obj
        have = to_torch(by[name])
        assert have.shape == shapes.get(name, tuple(want.shape)), name
        assert torch.equal(have.reshape(-1), want.reshape(-1)), name
    for b in ms["buffer_names"]:
        assert torch.equal(to_torch(by[b]), ms["module"][b])


def test_peak_memory_small(real_ckpt):
    tag = real_ckpt("ds-zero2-bf16") / ENGINE
    tracemalloc.start()
    try:
        src = deepspeed_source(tag)
        _, peak = tracemalloc.get_traced_memory()
        print(f"peak {peak} bytes")
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, peak
    assert len(src.tensors) == 17


def _copy_tag(real_ckpt, variant, tmp_path) -> Path:
    dst = tmp_path / "tag"
    shutil.copytree(real_ckpt(variant) / ENGINE, dst)
    return dst


def test_rejects_unsupported_layouts(real_ckpt, tmp_path):
    tag = _copy_tag(real_ckpt, "ds-zero2-bf16", tmp_path)
    (tag / "layer_01-model_00-model_states.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="pipeline"):
        deepspeed_source(tag)
    (tag / "layer_01-model_00-model_states.pt").unlink()

    (tag / "mp_rank_01_model_states.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="model-parallel"):
        deepspeed_source(tag)
    (tag / "mp_rank_01_model_states.pt").unlink()

    (tag / "expp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="MoE"):
        deepspeed_source(tag)
    (tag / "expp_rank_0_mp_rank_00_optim_states.pt").unlink()

    (tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(ValueError, match="expected 2"):
        deepspeed_source(tag)


def _resave(path: Path, edit) -> None:
    obj = torch.load(path, map_location="cpu", weights_only=False)
    edit(obj)
    torch.save(obj, path)


def test_rejects_bf16_optimizer(real_ckpt, tmp_path):
    # a BF16_Optimizer state dict: fp32 partitions but no zero_stage (zero_to_fp32 refuses it too)
    tag = _copy_tag(real_ckpt, "ds-zero2-bf16", tmp_path)
    for f in tag.glob("*optim_states.pt"):
        _resave(f, lambda o: o["optimizer_state_dict"].pop("zero_stage"))
    with pytest.raises(ValueError, match="BF16_Optimizer"):
        deepspeed_source(tag)


def test_rejects_mp_world_size(real_ckpt, tmp_path):
    tag = _copy_tag(real_ckpt, "ds-zero2-bf16", tmp_path)
    _resave(tag / "mp_rank_00_model_states.pt", lambda o: o.__setitem__("mp_world_size", 2))
    with pytest.raises(ValueError, match="mp_world_size=2"):
        deepspeed_source(tag)


def test_strided_tensor_ranges(tmp_path):
    # a non-contiguous tensor (e.g. a transposed frozen fragment) becomes row-major byte ranges
    from ckpt_tui.core.export.sources import SourceTensor
    from ckpt_tui.core.formats.deepspeed.states import StatesFile as _File
    from ckpt_tui.core.formats.deepspeed.states import ref_ranges as _ref_ranges

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = {"t": base.t(), "cols": base[:, 1:4], "step": base[::2], "plain": base[1:3]}
    torch.save(views, tmp_path / "x.pt")
    f = _File(tmp_path / "x.pt")
    for name, v in views.items():
        ref = f.obj[name]
        st = SourceTensor(name, tuple(ref.shape), ref.dtype, _ref_ranges(f, ref, name))
        assert torch.equal(to_torch(st), v.contiguous()), name
    assert len(_ref_ranges(f, f.obj["plain"], "plain")) == 1
    assert len(_ref_ranges(f, f.obj["cols"], "cols")) == 4
