"""A capability-matrix cell's statuses, and its dtype's name short enough for a column.

Apart from the matrix (matrix.py), which counts cells, so that what judges them (judging.py) and what
shows them read the same words without importing the matrix.
"""

from __future__ import annotations

PASS, FAIL, KNOWN, NA, UNTESTED = "PASS", "FAIL", "known bug", "N/A", "untested"
STATUSES = (PASS, FAIL, KNOWN, NA, UNTESTED)
_SHORT = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "complex64": "c64",
    "complex128": "c128", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
    "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool", "float8_e4m3fn": "f8e4",
    "float8_e5m2": "f8e5", "-": "-",
}  # fmt: skip


def short_dtype(name: str) -> str:
    """f16, bf16, i32, ...: a dtype's name short enough for a column."""
    return _SHORT.get(name, name)
