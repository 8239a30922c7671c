"""The one dtype table: torch dtype name -> bytes per element, safetensors code, short name.

Every other dtype mapping in ckpt-tui is a view of this table (the restricted unpickler's
storage-class and alias names are pickle syntax, not dtypes, and stay with it).
"""

from __future__ import annotations

# torch name (no "torch." prefix), bytes per element, safetensors dtype code, short name
TABLE: tuple[tuple[str, int, str | None, str | None], ...] = (
    ("float64", 8, "F64", "fp64"),
    ("float32", 4, "F32", "fp32"),
    ("float16", 2, "F16", "fp16"),
    ("bfloat16", 2, "BF16", "bf16"),
    ("int64", 8, "I64", None),
    ("int32", 4, "I32", None),
    ("int16", 2, "I16", None),
    ("int8", 1, "I8", None),
    ("uint8", 1, "U8", None),
    ("uint16", 2, "U16", None),
    ("uint32", 4, "U32", None),
    ("uint64", 8, "U64", None),
    ("bool", 1, "BOOL", None),
    ("float8_e4m3fn", 1, "F8_E4M3", None),
    ("float8_e5m2", 1, "F8_E5M2", None),
    ("complex64", 8, "C64", None),
    ("complex128", 16, None, None),
    ("float8_e4m3fnuz", 1, None, None),
    ("float8_e5m2fnuz", 1, None, None),
    ("complex32", 4, None, None),
)

ITEMSIZE: dict[str, int] = {name: size for name, size, _, _ in TABLE}
ST_CODE: dict[str, str] = {name: code for name, _, code, _ in TABLE if code}  # torch name -> safetensors code
FROM_ST_CODE: dict[str, tuple[str, int]] = {code: (name, size) for name, size, code, _ in TABLE if code}
SHORT: dict[str, str] = {name: short for name, _, _, short in TABLE if short}


def short_dtype(name: str) -> str:
    """``bf16`` for ``bfloat16``; names without a short form as they are."""
    return SHORT.get(name, name)
