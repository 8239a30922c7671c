"""A LoRA merged into its base weight, computed in row blocks, bit-exact with PEFT's ``merge_and_unload()``.

    w = merged_tensor(base_w, lora_a, lora_b, cfg.scale(module))           # a SourceTensor with ``chunks``
    b = merged_bias(base_b, lora_b_bias, cfg.scale(module))                 # lora_bias=True

The oracle is peft 0.21 (``PeftModel.from_pretrained(base, dir)``, default ``autocast_adapter_dtype=True``, then
``merge_and_unload()``, default ``safe_merge=False``; ``peft/tuners/lora/layer.py``). What it computes, with
``A``/``B`` as stored in the adapter file and ``s`` the Python float ``lora_alpha / r`` (``/ math.sqrt(r)`` with
rslora, per module with ``rank_pattern``/``alpha_pattern``):

- the adapter weights are fp32 whatever the base's dtype (autocast upcasts fp16/bf16 ones; a file's bf16 values
  copy into them exactly): ``a = A.float()``, ``b = B.float()``; the delta is an fp32 tensor, so
  ``get_delta_weight``'s own cast back to (b)f16 (``cast_to_fp32``) never happens;
- ``Linear``: ``W += transpose(b @ a, fan_in_fan_out) * s``, an in-place add of an fp32 delta into W's dtype:
  ``(W.float() + delta).to(W.dtype)``, rounded once (the contract of the issue);
- ``Embedding``: ``W += (transpose(b @ a, True) * s).to(W.dtype)`` with ``lora_embedding_A`` (r, num_embeddings)
  and ``lora_embedding_B`` (dim, r): the delta is rounded to W's dtype *before* the add, then the add of two
  (b)f16 tensors is rounded again: ``(W.float() + delta.to(W.dtype).float()).to(W.dtype)``. That is not the
  issue's single-rounding formula (bf16 results differ in the last bit); PEFT's is what is computed here;
- ``lora_bias``: ``bias += B.bias.float() * s`` (fp32 product, one rounding into the bias's dtype).

Row blocks, and why they are bit-exact: a block of W's rows needs only those rows of the delta, which is the
same matrix product restricted in one dimension: ``b[rows] @ a`` (Linear), ``(b @ a[:, rows]).T``
(``fan_in_fan_out``, Embedding; the product PEFT forms, then transposed as PEFT does: ``a.T[rows] @ b.T`` is a
different BLAS call and differs in the last bit). That every element is computed by the same gemm kernel whatever the other dimension held on the machine where
this was first measured (torch 2.13 with MKL 2024.2, 360k random blocks, any start), but not on an AVX-512 AMD
machine: there MKL's sgemm gave other last bits for a block that split its row tiles (24 or 48 rows) than the whole
product, and a product of few rows other bits by where its N dimension was cut. So blocks start at multiples of
``ALIGN`` (384) rows and the last one ends W (a short remainder joins it; no block is a matrix-vector product); a
transposed product (``fan_in_fan_out``, Embedding) of fewer than ``ALIGN`` W columns is one block; a W with one
column is one block. Measured on that machine: every aligned block equals the whole product, 1 and 2 threads.
``torch.mm(..., out=)`` into a reused
buffer is the same kernel call. Memory: one block's W rows, fp32 delta and output bytes (``block_bytes`` bounds the
three together: ``cols * (4 + 2 * itemsize)`` a row), with A and B (small) loaded once.

Never imports peft or transformers; torch only inside the functions.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Iterator, Union, cast

from ..safetext import visible
from ..storage import open_read
from .sources import ByteRange, SourceTensor, to_torch

MERGE_DTYPES = ("float32", "bfloat16", "float16")  # bases PEFT merges through an fp32 adapter (autocast)


def merged_tensor(
    base: SourceTensor,
    a: SourceTensor,
    b: SourceTensor,
    scale: float,
    *,
    fan_in_fan_out: bool = False,
    embedding: bool = False,
    block_bytes: int = 32 << 20,
) -> SourceTensor:
    """``base`` (W) with the LoRA ``b @ a`` merged as PEFT merges it (module docstring), as a SourceTensor of
    W's name, shape and dtype whose ``chunks`` compute it in row blocks. ``fan_in_fan_out``: W is (in, out)
    (GPT-2's Conv1D); ``embedding``: ``a``/``b`` are ``lora_embedding_A``/``lora_embedding_B``. A, B and the
    shapes are checked here (ValueError), W's bytes are read block by block when ``chunks`` runs."""
    if fan_in_fan_out and embedding:
        raise ValueError("fan_in_fan_out and embedding: PEFT has no such LoRA layer")
    rows, cols = _check_shapes(base, a, b, transposed=fan_in_fan_out or embedding)
    scale = float(scale)

    def chunks() -> Iterator[Union[bytes, memoryview]]:
        import torch

        if rows == 0 or cols == 0:
            return
        dt = getattr(torch, base.dtype)
        item = torch.empty((), dtype=dt).element_size()
        fa, fb = _fp32(a), _fp32(b)  # as autocast_adapter_dtype leaves them
        fill = _row_filler(base, rows, cols, item)
        blocks = row_blocks(rows, cols, block_bytes, item)
        if (fan_in_fan_out or embedding) and cols < ALIGN:
            # blocks of the transposed product split its N dimension, and a gemm of so few rows (W's columns)
            # gave other bits by where N was cut: one block (W has fewer than ALIGN columns, so it stays small)
            blocks = [(0, rows)]
        most = max(e - s for s, e in blocks)
        # one W-rows buffer and one fp32 delta buffer, reused block after block (torch.mm(out=) is the same
        # kernel call): fresh blocks of tens of MB per block stay in glibc's heap once its mmap threshold has risen
        wbuf = bytearray(most * cols * item)
        wall = torch.frombuffer(wbuf, dtype=dt)
        dall = torch.empty(most * cols, dtype=torch.float32)
        for s, e in blocks:
            n = e - s
            fill(s, e, memoryview(wbuf)[: n * cols * item])
            w = wall[: n * cols].view(n, cols)
            if fan_in_fan_out or embedding:  # PEFT: transpose(b @ a, True) * s; rows of W = columns of a
                d = torch.mm(fb, fa[:, s:e], out=dall[: n * cols].view(cols, n)).mul_(scale).T
            else:
                d = torch.mm(fb[s:e], fa, out=dall[: n * cols].view(n, cols)).mul_(scale)
            # elementwise, in slices of rows: a mixed-dtype add allocates a temporary the size of its operands
            step = max(1, (1 << 18) // cols)
            for i in range(0, n, step):
                wi, di = w[i : i + step], d[i : i + step]
                if embedding:  # Embedding.merge: W += delta.to(W.dtype), an add in W's dtype
                    wi.add_(di.to(dt))
                else:  # Linear.merge: W += delta (fp32): computed in fp32, rounded once; delta + W, commuted
                    wi.copy_(di.add_(wi))
            # a view, not a copy: the consumer (export's writer) writes it before asking for the next block, which
            # refills the buffer; one fresh 32 MB block per step cost more in page faults than the merge itself
            yield memoryview(wbuf)[: n * cols * item]

    return SourceTensor(base.name, tuple(base.shape), base.dtype, chunks=chunks, note="LoRA merged")


def merged_bias(bias: SourceTensor, b_bias: SourceTensor, scale: float) -> SourceTensor:
    """``bias`` with ``lora_B``'s bias merged (``lora_bias=True``): ``bias += B.bias.float() * scale``, as
    PEFT's ``Linear.merge`` adds it: the fp32 product, rounded once into the bias's dtype."""
    if bias.dtype not in MERGE_DTYPES:
        raise ValueError(f"{visible(bias.name)}: a {bias.dtype} bias is not merged (PEFT's fp32 adapter path)")
    if len(bias.shape) != 1 or tuple(b_bias.shape) != tuple(bias.shape):
        raise ValueError(
            f"{visible(bias.name)}: bias {tuple(bias.shape)} and lora_B bias {tuple(b_bias.shape)} do not match"
        )
    scale = float(scale)

    def chunks() -> Iterator[Union[bytes, memoryview]]:
        import torch

        d = _fp32(b_bias).mul(scale)
        out = d.add_(to_torch(bias)).to(getattr(torch, bias.dtype))
        yield bytes(out.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

    return SourceTensor(bias.name, tuple(bias.shape), bias.dtype, chunks=chunks, note="LoRA bias merged")


# Row blocks start at multiples of this many rows (and the last one, up to twice as long, ends W): a BLAS gemm
# computes a row's product by the tile it falls in, full or remainder, and MKL on an AVX-512 machine gave other last
# bits for a block that split its tiles (24 or 48 rows there) than the whole product does, which is PEFT's. 384 is a
# multiple of every tile height in use (4 to 128 rows); a block of fewer rows would meet a small-matrix path.
ALIGN = 384


def row_blocks(rows: int, cols: int, block_bytes: int, item: int = 2) -> list[tuple[int, int]]:
    """The [start, end) row blocks of a (rows, cols) merge of a W of ``item``-byte elements: each block's
    working set (its W rows, their fp32 delta and the output bytes: ``cols * (4 + 2 * item)`` a row) at most
    ``block_bytes`` where it can be, in whole multiples of ``ALIGN`` rows (so each block's product is the whole
    product's, bit for bit), the remainder joining the last block; one block where W has one column (the module
    docstring says why: a matrix-vector product sums in another order)."""
    if rows <= 0:
        return []
    if cols <= 1:
        return [(0, rows)]
    per = max(ALIGN, block_bytes // (cols * (4 + 2 * item)) // ALIGN * ALIGN)
    bounds = list(range(0, rows, per)) + [rows]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < ALIGN:
        del bounds[-2]  # a short remainder joins the block before it (a gemm of a few rows takes other paths)
    return list(zip(bounds, bounds[1:]))


def _check_shapes(base: SourceTensor, a: SourceTensor, b: SourceTensor, *, transposed: bool) -> tuple[int, int]:
    """W's (rows, columns), where W, A and B fit together (ValueError naming them otherwise)."""
    name = visible(base.name)
    if base.dtype not in MERGE_DTYPES:
        raise ValueError(
            f"{name}: a {base.dtype} weight is not merged (PEFT's fp32 adapter path covers fp32/bf16/fp16)"
        )
    if len(base.shape) != 2 or len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"{name}: W {tuple(base.shape)}, A {tuple(a.shape)}, B {tuple(b.shape)}: not matrices")
    rows, cols = (int(x) for x in base.shape)
    r, fan_in = (int(x) for x in a.shape)
    fan_out, rb = (int(x) for x in b.shape)
    # B @ A is (fan_out, fan_in): W itself (Linear), or W transposed (Conv1D's (in, out), Embedding's (num, dim))
    want = (fan_in, fan_out) if transposed else (fan_out, fan_in)
    if rb != r or (rows, cols) != want:
        raise ValueError(
            f"{name}: W {tuple(base.shape)} does not take B {tuple(b.shape)} @ A {tuple(a.shape)}"
            + (" transposed" if transposed else "")
        )
    for t in (a, b):
        if t.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"{visible(t.name)}: a {t.dtype} LoRA weight is not merged")
    return rows, cols


def _fp32(t: SourceTensor) -> Any:
    """The adapter weight as PEFT holds it after ``autocast_adapter_dtype``: fp32, contiguous."""
    import torch

    return to_torch(t).to(torch.float32).contiguous()


def _row_filler(base: SourceTensor, rows: int, cols: int, item: int) -> Callable[[int, int, memoryview], None]:
    """``fill(s, e, into)``: the bytes of W's rows [s, e) into ``into``. By byte range where W has them (only
    those rows are read); a ``load``/``chunks`` source is materialised once and sliced."""
    import torch

    row_bytes = cols * item
    if base.ranges is None:
        whole = to_torch(base).to(getattr(torch, base.dtype)).contiguous().reshape(-1).view(torch.uint8)
        if tuple(whole.shape) != (rows * row_bytes,):
            raise ValueError(f"{visible(base.name)}: loaded {tuple(whole.shape)} bytes, not a {rows}x{cols} tensor")
        raw = memoryview(whole.numpy())

        def sliced(s: int, e: int, into: memoryview) -> None:
            into[:] = raw[s * row_bytes : e * row_bytes]

        return sliced
    ranges = base.ranges
    if sum(r.length for r in ranges) != rows * row_bytes:
        raise ValueError(f"{visible(base.name)}: its byte ranges do not hold a {rows}x{cols} {base.dtype} tensor")

    def read(s: int, e: int, into: memoryview) -> None:
        _read_into(ranges, s * row_bytes, into)

    return read


def _read_into(ranges: tuple[ByteRange, ...], start: int, view: memoryview) -> None:
    """Fill ``view`` with the bytes [start, start + len(view)) of the concatenation of ``ranges`` (OSError where a
    file ends early): one copy, straight into the block."""
    pos = 0  # offset of the current range in the concatenation
    for r in ranges:
        lo, hi = max(start, pos), min(start + len(view), pos + r.length)
        if lo < hi:
            with open_read(r.path) as f:
                f.seek(r.offset + lo - pos)
                got = 0
                while got < hi - lo:  # a ranged remote read may come short: read on until EOF
                    part = view[lo - start + got : hi - start]
                    n = cast(io.BufferedIOBase, f).readinto(part)  # a BufferedReader, local or ranged
                    if not n:
                        raise OSError(f"{visible(r.path)}: ended {hi - lo - got} bytes early at {r.offset + lo - pos}")
                    got += n
        pos += r.length
        if pos >= start + len(view):
            break
