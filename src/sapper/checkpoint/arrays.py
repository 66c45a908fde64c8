"""Per-tensor statistics of a safetensors file with numpy: no torch for a file that
needs none.

The reductions are those of :class:`sapper.checkpoint.stats.StatsAccumulator`, step for
step, on numpy arrays: the same fast path (the magnitudes' bits of a finite chunk give
its abs-max, zeros and subnormals), the same careful path (a NaN or Inf in the chunk, or
squares past the float32 range), the same float32 sum of squares where torch takes one,
so the statistics and the findings built on them are the same whichever reads the file.
numpy has no bfloat16 or float8: those are read as their bits and widened to float32
exactly (every bfloat16 and float8 value is a float32 value).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np

from sapper.checkpoint.tensorstats import TensorStats

__all__ = ["STORED", "ArrayStats", "array_stats", "flat_pieces", "widen"]

#: safetensors dtype -> the numpy dtype of its stored bits.
STORED = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64,
    "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
}  # fmt: skip

#: (unsigned view, magnitude mask, bits of the smallest normal) of the floating dtypes
#: read from their bits on the fast path (as torch's ``_BITS``).
_BITS = {
    "F32": (np.uint32, 0x7FFFFFFF, 0x00800000),
    "F64": (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x0010000000000000),
    "F16": (np.uint16, 0x7FFF, 0x0400),
    "BF16": (np.uint16, 0x7FFF, 0x0080),
}
#: Largest finite value of the dtypes a trained tensor can saturate, and the smallest
#: normal of the float8 ones (their subnormals are counted from the values).
_MAX = {"F16": 65504.0, "BF16": 3.3895313892515355e38, "F8_E4M3": 448.0, "F8_E5M2": 57344.0}
_TINY = {"F8_E4M3": 2.0**-6, "F8_E5M2": 2.0**-14}


def _float8_table(exponent_bits: int, mantissa_bits: int, ieee: bool) -> np.ndarray:
    """The float32 value of each of the 256 bit patterns of a float8 format: ``ieee``
    (E5M2) has infinities and NaNs at the top exponent, otherwise (E4M3FN) only the
    all-ones pattern is NaN and there is no infinity."""
    bias = (1 << (exponent_bits - 1)) - 1
    top = (1 << exponent_bits) - 1
    out = np.empty(256, dtype=np.float32)
    for bits in range(256):
        sign = -1.0 if bits & 0x80 else 1.0
        exp = (bits >> mantissa_bits) & top
        man = bits & ((1 << mantissa_bits) - 1)
        if ieee and exp == top:
            value = math.inf if man == 0 else math.nan
        elif not ieee and exp == top and man == (1 << mantissa_bits) - 1:
            value = math.nan
        elif exp == 0:
            value = man / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + man / (1 << mantissa_bits)) * 2.0 ** (exp - bias)
        out[bits] = sign * value
    return out


_FLOAT8 = {"F8_E4M3": _float8_table(4, 3, False), "F8_E5M2": _float8_table(5, 2, True)}


def widen(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The values of stored bits as numpy computes with them: bfloat16 and float8 as
    float32 (exactly), the other dtypes as they are."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    table = _FLOAT8.get(dtype)
    return table[raw] if table is not None else raw


class ArrayStats:
    """Sums and counts of one tensor, fed chunk by chunk (its stored bits, flat) in
    row-major order; ``dtype`` is the safetensors name."""

    def __init__(self, stats: TensorStats, dtype: str) -> None:
        self.stats = stats
        self.dtype = dtype
        self._offset = 0

    def add(self, raw: np.ndarray) -> None:
        # squares past the float range and NaNs compared are expected: the careful path
        # counts them, so numpy's warnings would only reach the user's terminal
        with np.errstate(all="ignore"):
            self._add(raw)

    def _add(self, raw: np.ndarray) -> None:
        s = self.stats
        n = raw.size
        if n == 0:
            return
        offset = self._offset
        self._offset += n
        s.numel += n
        dtype = self.dtype
        if dtype == "BOOL":
            raw = raw.view(np.uint8)
        if dtype not in _BITS and dtype not in _FLOAT8:
            self._integers(raw)
            return
        work = widen(raw, dtype)
        if work.dtype == np.float16:
            work = work.astype(np.float32)
        sum_sq = float(np.dot(work, work))
        if math.isfinite(sum_sq):
            self._finite(raw, work, sum_sq)
        else:
            self._careful(work, offset)

    def _integers(self, x: np.ndarray) -> None:
        s = self.stats
        s.floating = False
        s.zeros += x.size - int(np.count_nonzero(x))
        wide = x.astype(np.float64)
        lo, hi = float(wide.min()), float(wide.max())
        s.abs_max = max(s.abs_max, -lo, hi)
        s.sum_sq += float(np.dot(wide, wide))
        s.finite_min = min(s.finite_min, lo)
        s.finite_max = max(s.finite_max, hi)

    def _finite(self, raw: np.ndarray, work: np.ndarray, sum_sq: float) -> None:
        s = self.stats
        s.sum_sq += sum_sq
        spec = _BITS.get(self.dtype)
        if spec is None:
            self._finite_generic(work)
            return
        view, mask, min_normal = spec
        mags = np.bitwise_and(raw.view(view), view(mask))
        lo_bits, hi_bits = int(mags.min()), int(mags.max())
        top = _value_of_bits(hi_bits, self.dtype)
        s.abs_max = max(s.abs_max, top)
        if lo_bits == hi_bits:  # one magnitude throughout: constant unless the signs differ
            s.finite_min = min(s.finite_min, float(work.min()))
            s.finite_max = max(s.finite_max, float(work.max()))
        else:
            s.varied = True
        if lo_bits < min_normal:
            zeros = mags.size - int(np.count_nonzero(mags))
            s.zeros += zeros
            s.subnormal += int(np.count_nonzero(mags < min_normal)) - zeros
        limit = _MAX.get(self.dtype)
        if limit is not None and top >= limit:
            s.saturated += int(np.count_nonzero(np.abs(work) >= limit))

    def _finite_generic(self, work: np.ndarray) -> None:
        """A finite float8 chunk (no bit layout shared with the fast path)."""
        s = self.stats
        lo, hi = float(work.min()), float(work.max())
        s.finite_min = min(s.finite_min, lo)
        s.finite_max = max(s.finite_max, hi)
        top = max(-lo, hi)
        s.abs_max = max(s.abs_max, top)
        mag = np.abs(work)
        nonzero = int(np.count_nonzero(work))
        s.zeros += work.size - nonzero
        s.subnormal += int(np.count_nonzero((mag > 0) & (mag < _TINY[self.dtype])))
        limit = _MAX[self.dtype]
        if top >= limit:
            s.saturated += int(np.count_nonzero(mag >= limit))

    def _careful(self, work: np.ndarray, offset: int) -> None:
        s = self.stats
        n = work.size
        finite = np.isfinite(work)
        n_finite = int(np.count_nonzero(finite))
        if n_finite < n:
            nan = int(np.count_nonzero(np.isnan(work)))
            pos = int(np.count_nonzero(work == math.inf))
            s.nan += nan
            s.posinf += pos
            s.neginf += n - n_finite - nan - pos
            if s.first_nonfinite is None:
                s.first_nonfinite = offset + int(np.flatnonzero(~finite)[0])
            work = np.where(finite, work, work.dtype.type(0))
        mag = np.abs(work)
        s.zeros += int(np.count_nonzero(work == 0)) - (n - n_finite)
        if n_finite:
            s.abs_max = max(s.abs_max, float(mag.max()))
            wide = mag.astype(np.float64)
            s.sum_sq += float(np.dot(wide, wide))
            s.finite_min = min(s.finite_min, float(np.where(finite, work, math.inf).min()))
            s.finite_max = max(s.finite_max, float(np.where(finite, work, -math.inf).max()))
        limit = _MAX.get(self.dtype)
        if limit is not None:
            s.saturated += int(np.count_nonzero(mag >= limit))
        tiny = _TINY.get(self.dtype) or float(np.finfo(_NATIVE[self.dtype]).tiny)
        s.subnormal += int(np.count_nonzero((mag > 0) & (mag < tiny)))


def _value_of_bits(bits: int, dtype: str) -> float:
    """The value a magnitude's bits stand for in a dtype of the fast path."""
    raw = np.array([bits], dtype=_BITS[dtype][0])
    if dtype == "BF16":
        return float(widen(raw, dtype)[0])
    return float(raw.view(STORED[dtype])[0])


#: The numpy dtype whose smallest normal is the stored dtype's (bfloat16 shares float32's
#: exponent range).
_NATIVE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.float32}


def array_stats(
    key: str,
    chunks: Iterable[np.ndarray],
    dtype: str,
    shown: str,
    shape: tuple[int, ...],
    file: str = "",
) -> TensorStats:
    """The statistics of one tensor from its stored bits in flat ``chunks``; ``dtype``
    is the safetensors name, ``shown`` the name reports give it (torch's)."""
    acc = ArrayStats(TensorStats(key=key, dtype=shown, shape=shape, file=file), dtype)
    for chunk in chunks:
        acc.add(chunk)
    return acc.stats


def flat_pieces(array: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """A flat array in pieces of at most ``size`` elements (views)."""
    for start in range(0, array.size, size):
        yield array[start : start + size]
