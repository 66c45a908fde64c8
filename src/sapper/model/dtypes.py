"""Bytes per element of the dtype names a Plan uses: the one table every byte count reads."""

from __future__ import annotations

__all__ = ["DTYPE_BYTES"]

DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "tf32": 4,  # tf32 is fp32 storage with reduced-precision matmuls
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
}
