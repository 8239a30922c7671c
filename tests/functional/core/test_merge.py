"""The LoRA merge (core/export/merge.py) against PEFT itself: tiny models built here, base and adapter saved as
the real libraries save them, our merged tensors (read by byte range from those files) bit-exact with
``PeftModel.from_pretrained(base, adapter).merge_and_unload().state_dict()`` tensor by tensor, in row blocks
of several sizes, and through the real writer into a safetensors file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ckpt_tui.core.adapters.config import read_lora_config
from ckpt_tui.core.export.merge import ALIGN, merged_bias, merged_tensor, row_blocks
from ckpt_tui.core.export.plan import OutFile, OutTensor
from ckpt_tui.core.export.sources import SourceTensor, to_torch
from ckpt_tui.core.export.write import ByteCounter, ExportError, verify_files, write_file
from ckpt_tui.core.formats.safetensors.source import safetensors_source
from ckpt_tui.core.progress import Cancelled

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

PREFIX = "base_model.model."  # PeftModel's wrapper, in every saved adapter key


def _llama(**kw):
    from ckpt_tui.samples._common import TINY_LLAMA  # the fixtures' model: non-square MLP, 2 layers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY_LLAMA, **kw}))


def _gpt2(**kw):
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, **kw)
    return transformers.GPT2LMHeadModel(cfg)


MODELS = {"llama": _llama, "llama-bias": lambda: _llama(attention_bias=True, mlp_bias=True), "gpt2": _gpt2}
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# (model, base dtype, LoraConfig kwargs, adapter kept in the base's dtype when saved)
CASES = {
    "llama-fp32-linear": ("llama", "fp32", dict(r=4, lora_alpha=8, target_modules=LINEARS), False),
    "llama-bf16-linear-embedding-head": (
        "llama",
        "bf16",
        dict(r=4, lora_alpha=8, target_modules=[*LINEARS, "embed_tokens", "lm_head"]),
        False,
    ),
    "llama-fp16-rslora-patterns": (
        "llama",
        "fp16",
        dict(
            r=4,
            lora_alpha=8,
            use_rslora=True,
            target_modules=["q_proj", "k_proj", "up_proj", "down_proj", "embed_tokens"],
            rank_pattern={"k_proj": 2, "layers.1.mlp.up_proj": 8},
            alpha_pattern={"q_proj": 3, "up_proj": 5},
        ),
        False,
    ),
    "llama-fp32-embedding": (
        "llama",
        "fp32",
        dict(r=8, lora_alpha=16, target_modules=["embed_tokens", "v_proj"]),
        False,
    ),
    "llama-bf16-adapter-saved-bf16": (
        "llama",
        "bf16",
        dict(r=4, lora_alpha=4, target_modules=["q_proj", "down_proj", "embed_tokens"]),
        True,
    ),
    "llama-bf16-lora-bias": (
        "llama-bias",
        "bf16",
        dict(r=4, lora_alpha=8, lora_bias=True, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]),
        False,
    ),
    "gpt2-fp32-conv1d": (
        "gpt2",
        "fp32",
        dict(r=4, lora_alpha=8, fan_in_fan_out=True, target_modules=["c_attn", "c_proj", "c_fc"]),
        False,
    ),
    "gpt2-bf16-conv1d-lora-bias": (
        "gpt2",
        "bf16",
        dict(r=4, lora_alpha=12, fan_in_fan_out=True, lora_bias=True, target_modules=["c_attn", "c_fc"]),
        False,
    ),
}


def _build(tmp_path: Path, case: str) -> tuple[Path, Path, dict[str, object]]:
    """(base folder, adapter folder, the oracle's merged state dict) for ``case``: the base saved with
    save_pretrained, a LoRA on it with every lora_A/lora_B (and lora_B bias) set to random non-zero values
    saved with PEFT, then PEFT's own merge of the two as saved."""
    model_kind, dtype, kw, adapter_in_base_dtype = CASES[case]
    dt = getattr(torch, DTYPES[dtype])
    torch.manual_seed(sum(map(ord, case)))
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    MODELS[model_kind]().to(dt).save_pretrained(base_dir)
    cls = transformers.GPT2LMHeadModel if model_kind == "gpt2" else transformers.LlamaForCausalLM
    model = peft.get_peft_model(
        cls.from_pretrained(base_dir, dtype=dt),
        peft.LoraConfig(**kw),
        autocast_adapter_dtype=not adapter_in_base_dtype,
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:  # PEFT starts B at 0: a merge that did nothing would pass
                p.copy_(torch.randn_like(p, dtype=torch.float32) * 0.2)
    model.save_pretrained(adapter_dir)
    oracle_base = cls.from_pretrained(base_dir, dtype=dt)
    merged = peft.PeftModel.from_pretrained(oracle_base, adapter_dir).merge_and_unload()
    return base_dir, adapter_dir, merged.state_dict()


def _merged_sources(base_dir: Path, adapter_dir: Path, **kw: object) -> tuple[list[SourceTensor], set[str]]:
    """Every tensor of the base as the merge writes it: a merged SourceTensor where the adapter has a LoRA on it
    (weight, and bias with lora_bias), the base's byte ranges otherwise; and the names merged."""
    cfg = read_lora_config(adapter_dir / "adapter_config.json")
    base = safetensors_source(base_dir / "model.safetensors").tensors
    lora = {t.name: t for t in safetensors_source(adapter_dir / "adapter_model.safetensors").tensors}
    out, merged = [], set()
    for t in base:
        module, _, leaf = t.name.rpartition(".")
        key = PREFIX + module
        s = cfg.scale(module)
        if leaf == "weight" and key + ".lora_A.weight" in lora:
            a, b = lora[key + ".lora_A.weight"], lora[key + ".lora_B.weight"]
            out.append(merged_tensor(t, a, b, s, fan_in_fan_out=cfg.fan_in_fan_out, **kw))
        elif leaf == "weight" and key + ".lora_embedding_A" in lora:
            a, b = lora[key + ".lora_embedding_A"], lora[key + ".lora_embedding_B"]
            out.append(merged_tensor(t, a, b, s, embedding=True, **kw))
        elif leaf == "bias" and key + ".lora_B.bias" in lora:
            out.append(merged_bias(t, lora[key + ".lora_B.bias"], s))
        else:
            out.append(t)
            continue
        merged.add(t.name)
    return out, merged


def _raw(x):
    return x.detach().contiguous().reshape(-1).view(torch.uint8)


def _check_against(oracle: dict[str, object], tensors: list[SourceTensor], merged: set[str], base_dir: Path) -> None:
    base = {t.name: t for t in safetensors_source(base_dir / "model.safetensors").tensors}
    assert set(base) <= set(oracle)
    for name in set(oracle) - set(base):  # only tied aliases (GPT-2's lm_head) are not in the saved base
        assert any(oracle[name].data_ptr() == oracle[n].data_ptr() for n in base), name
    for t in tensors:
        ours = to_torch(t)
        assert ours.dtype == oracle[t.name].dtype and tuple(ours.shape) == tuple(oracle[t.name].shape), t.name
        assert torch.equal(_raw(ours), _raw(oracle[t.name])), t.name  # bit-exact, NaN patterns included
        if t.name in merged:  # the merge changed this tensor: a missing merge would not pass
            assert int((_raw(ours) != _raw(to_torch(base[t.name]))).sum()) > 0, t.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_merged_tensors_are_peft_merge_and_unload_bit_exact(tmp_path, case):
    base_dir, adapter_dir, oracle = _build(tmp_path, case)
    tensors, merged = _merged_sources(base_dir, adapter_dir)
    model_kind, _, kw, _ = CASES[case]
    targets = {n for n in merged if n.endswith(".weight")}
    assert len(targets) >= 2 * len(kw["target_modules"]) - 2  # every target of both layers (lm_head/embed once)
    if kw.get("lora_bias"):
        assert {n for n in merged if n.endswith(".bias")}
    _check_against(oracle, tensors, merged, base_dir)


@pytest.mark.parametrize(
    "case", ["llama-bf16-linear-embedding-head", "gpt2-bf16-conv1d-lora-bias", "llama-fp16-rslora-patterns"]
)
@pytest.mark.parametrize("block_bytes", [1, 3 * 64 * 8, 5 * 64 * 8, 7 * 128 * 8, 100 * 64 * 8])
def test_row_blocks_of_any_size_give_the_full_product(tmp_path, case, block_bytes):
    """Whatever block size is asked for (block_bytes=1: the smallest; the others a row of a 16-bit W costing cols * 8
    bytes: 3, 5, 7 or 100 rows), row_blocks rounds it to whole ALIGN-row blocks: the merged model is PEFT's.
    (These models' weights are shorter than ALIGN rows: test_blocks_equal_peft_s_full_product_for_awkward_shapes
    has taller ones, in several blocks.)"""
    base_dir, adapter_dir, oracle = _build(tmp_path, case)
    tensors, merged = _merged_sources(base_dir, adapter_dir, block_bytes=block_bytes)
    _check_against(oracle, tensors, merged, base_dir)


@pytest.mark.parametrize(
    "rows, cols",
    [(64, 64), (256, 64), (129, 64), (65, 1), (1, 64), (4097, 3), (3, 2), (2, 1), (1000, 64), (1537, 130), (769, 400)],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_blocks_equal_peft_s_full_product_for_awkward_shapes(tmp_path, rows, cols, dtype):
    """Shapes whose product is a matrix-vector product (one column, one row, B of one row in the transposed
    case) or whose last block would be one row: row blocks of every size equal PEFT's whole-matrix arithmetic
    (``W += transpose(B @ A, fif) * s`` on fp32 A, B), run here with torch as PEFT runs it."""
    from safetensors.torch import save_file

    torch.manual_seed(rows * 1000 + cols)
    dt = getattr(torch, dtype)
    for transposed in (False, True):
        r = 8
        w = torch.randn(rows, cols).to(dt)
        a = torch.randn(r, rows if transposed else cols) * 0.2
        b = torch.randn(cols if transposed else rows, r) * 0.2
        full = w.clone()
        full += (b @ a).T * 1.5 if transposed else (b @ a) * 1.5  # Linear.merge (fan_in_fan_out when transposed)
        path = tmp_path / f"w{int(transposed)}.safetensors"
        save_file({"w": w, "a": a, "b": b}, str(path))
        st = {t.name: t for t in safetensors_source(path).tensors}
        per_row = cols * (4 + 2 * w.element_size())  # row_blocks' cost of a row
        for block_bytes in (1, per_row * 3, per_row * 64, 32 << 20):
            got = merged_tensor(st["w"], st["a"], st["b"], 1.5, fan_in_fan_out=transposed, block_bytes=block_bytes)
            assert torch.equal(_raw(to_torch(got)), _raw(full)), (transposed, block_bytes)
        # a base that is not byte ranges (a `load` source) is read whole and sliced: the same values
        loaded = SourceTensor("w", (rows, cols), dtype, load=lambda w=w: w.clone())
        got = merged_tensor(loaded, st["a"], st["b"], 1.5, fan_in_fan_out=transposed, block_bytes=1)
        assert torch.equal(_raw(to_torch(got)), _raw(full))


@pytest.mark.parametrize(
    "rows, cols, block_bytes",
    [
        (64, 64, 1),
        (64, 64, 3 * 512),
        (65, 64, 512 * 4),
        (10, 1, 8),
        (5632, 2048, 32 << 20),
        (385, 64, 1),
        (5000, 64, 1),
    ],
)
def test_row_blocks_cover_the_rows_never_one_row(rows, cols, block_bytes):
    blocks = row_blocks(rows, cols, block_bytes)  # a bf16 W: a row costs cols * 8 bytes (W, fp32 delta, output)
    assert blocks[0][0] == 0 and blocks[-1][1] == rows
    assert all(e1 == s2 for (_, e1), (s2, _) in zip(blocks, blocks[1:]))
    assert all(s % ALIGN == 0 for s, _ in blocks)  # each block starts on the whole product's tiles
    assert all(e - s >= min(rows, ALIGN) for s, e in blocks)  # never a short block: the last ends W
    if cols == 1:
        assert blocks == [(0, rows)]  # a matrix-vector product: one block
    else:
        assert all((e - s) * cols * 8 <= max(block_bytes, ALIGN * cols * 8) for s, e in blocks[:-1])


def test_shapes_that_do_not_fit_are_refused():
    w = SourceTensor("m.weight", (8, 6), "bfloat16", ranges=())
    a, b = SourceTensor("a", (2, 6), "float32", ranges=()), SourceTensor("b", (8, 2), "float32", ranges=())
    merged_tensor(w, a, b, 1.0)  # fits: checked before any byte is read
    with pytest.raises(ValueError, match="does not take"):
        merged_tensor(w, a, b, 1.0, fan_in_fan_out=True)
    with pytest.raises(ValueError, match="does not take"):
        merged_tensor(w, SourceTensor("a", (3, 6), "float32", ranges=()), b, 1.0)
    with pytest.raises(ValueError, match="not merged"):
        merged_tensor(SourceTensor("m.weight", (8, 6), "int8", ranges=()), a, b, 1.0)
    with pytest.raises(ValueError, match="not matrices"):
        merged_tensor(SourceTensor("m.weight", (8, 6, 1), "float32", ranges=()), a, b, 1.0)


@pytest.mark.parametrize("case", ["llama-bf16-linear-embedding-head", "gpt2-bf16-conv1d-lora-bias"])
def test_the_writer_writes_the_merged_model(tmp_path, case):
    """An OutFile of the merged tensors and the base's others, written by write_file and read back with
    safetensors: PEFT's merged state dict; verify_files re-reads it through _source_chunks; and cast on the way
    (--dtype after the merge): PEFT's merged tensors ``.to(fp16)``."""
    from safetensors.torch import load_file

    base_dir, adapter_dir, oracle = _build(tmp_path, case)
    tensors, merged = _merged_sources(base_dir, adapter_dir, block_bytes=5 * 64 * 8)
    for out_dtype in ("keep", "float16"):
        f = OutFile(
            f"{out_dtype}.safetensors",
            [OutTensor(t.name, t.shape, t.dtype if out_dtype == "keep" else out_dtype, t) for t in tensors],
        )
        write_file(f, tmp_path / f.name, ByteCounter(f.nbytes, None, "writing"), None)
        back = load_file(str(tmp_path / f.name))
        assert set(back) == {t.name for t in tensors}
        for t in tensors:
            want = oracle[t.name] if out_dtype == "keep" else oracle[t.name].to(torch.float16)
            assert torch.equal(_raw(back[t.name]), _raw(want)), t.name
        plan = type("P", (), {"files": [f]})()  # verify_files reads only .files where given files
        assert verify_files(plan, tmp_path, files=[f]) == []
        # a merged tensor is checked against the digest of what the merge computed, not by merging again: a
        # flipped byte in it on disk is found
        m = next(t for t in f.tensors if t.src.chunks is not None)
        assert m.written_digest is not None
        from ckpt_tui.core.formats.safetensors import header as stfmt

        h = stfmt.read_header(tmp_path / f.name)
        at = h.data_start + h.offsets[m.name][0]
        with open(tmp_path / f.name, "r+b") as fh:
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 1]))
        assert verify_files(plan, tmp_path, files=[f]) == [m.name]
    assert merged


def _computed(name: str, pieces: list[bytes], shape: tuple[int, ...], dtype: str = "float32") -> SourceTensor:
    return SourceTensor(name, shape, dtype, chunks=lambda: iter(pieces))


def test_a_computed_tensor_of_the_wrong_size_is_refused(tmp_path):
    ok = torch.arange(6, dtype=torch.float32)
    raw = ok.numpy().tobytes()
    cases = {"short": [raw[:20]], "long": [raw, b"\0\0\0\0"]}
    for label, pieces in cases.items():
        for out_dtype in ("float32", "bfloat16"):
            f = OutFile(
                f"{label}-{out_dtype}.safetensors", [OutTensor("t", (6,), out_dtype, _computed("t", pieces, (6,)))]
            )
            with pytest.raises(ExportError, match="computed"):
                write_file(f, tmp_path / f.name, ByteCounter(f.nbytes, None, "writing"), None)
        with pytest.raises(ValueError, match="chunks hold"):
            to_torch(_computed("t", pieces, (6,)))
    # pieces that split an element are cast whole: the cast tensor is the cast of the whole
    split = [raw[:3], raw[3:13], raw[13:]]
    f = OutFile("split.safetensors", [OutTensor("t", (6,), "bfloat16", _computed("t", split, (6,)))])
    write_file(f, tmp_path / f.name, ByteCounter(f.nbytes, None, "writing"), None)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / f.name))["t"], ok.to(torch.bfloat16))


def test_a_cancelled_merge_stops_between_pieces(tmp_path):
    cancel = threading.Event()
    seen = []

    def pieces():
        for i in range(4):
            seen.append(i)
            if i == 1:
                cancel.set()
            yield b"\0" * 16

    f = OutFile("c.safetensors", [OutTensor("t", (16,), "float32", SourceTensor("t", (16,), "float32", chunks=pieces))])
    with pytest.raises(Cancelled):
        write_file(f, tmp_path / f.name, ByteCounter(f.nbytes, None, "writing"), cancel)
    assert seen == [0, 1]  # no piece generated after the cancel was seen
