"""Per-tensor statistics, reduced over bounded chunks so no tensor is ever copied whole.

A :class:`StatsAccumulator` takes the chunks of one tensor (slices read from a
safetensors file, or pieces of a memory-mapped torch tensor) and keeps only counts and
sums; the temporaries of one chunk are a few times :data:`CHUNK_ELEMENTS` elements.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from sapper.checkpoint.tensorstats import CHUNK_ELEMENTS, TensorStats

__all__ = [
    "CHUNK_ELEMENTS",
    "StatsAccumulator",
    "TensorStats",
    "flat_chunks",
    "stats_of",
]

#: dtypes whose largest finite value a trained tensor can plausibly reach (clamped on
#: overflow); fp32/fp64 saturation is not a failure mode seen in practice.
_SATURABLE = {torch.float16, torch.bfloat16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _SATURABLE.add(getattr(torch, _name))


@dataclass
class StatsAccumulator:
    """Sums and counts of one tensor, fed chunk by chunk in row-major order."""

    stats: TensorStats
    _offset: int = field(default=0, repr=False)

    def add(self, chunk: torch.Tensor) -> None:
        s = self.stats
        x = chunk.reshape(-1)
        n = x.numel()
        if n == 0:
            return
        offset = self._offset
        self._offset += n
        s.numel += n
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        if not (x.is_floating_point() or x.is_complex()):
            self._integers(x)
            return
        if x.is_complex():
            x = torch.view_as_real(x).reshape(-1)
        work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
        sum_sq = float(torch.dot(work, work))
        if math.isfinite(sum_sq):
            self._finite(x, work, sum_sq)
        else:  # a NaN/Inf in the chunk, or squares past the float range: the careful path
            self._careful(x, work, offset)

    def _integers(self, x: torch.Tensor) -> None:
        s = self.stats
        s.floating = False
        s.zeros += x.numel() - int(torch.count_nonzero(x))
        wide = x.to(torch.float64)
        lo, hi = torch.aminmax(wide)
        s.abs_max = max(s.abs_max, float(-lo), float(hi))
        s.sum_sq += float(torch.dot(wide, wide))
        s.finite_min = min(s.finite_min, float(lo))
        s.finite_max = max(s.finite_max, float(hi))

    def _finite(self, x: torch.Tensor, work: torch.Tensor, sum_sq: float) -> None:
        """Every value finite: three passes for the common dtypes. The magnitudes' bits
        (sign masked off) are ordered like the magnitudes, so one integer aminmax gives
        the abs-max and says whether any value is zero or subnormal (below the smallest
        normal's bits); only then are they counted."""
        s = self.stats
        s.sum_sq += sum_sq
        spec = _BITS.get(x.dtype)
        if spec is None:
            self._finite_generic(x, work)
            return
        view, mask, min_normal = spec
        mags = torch.bitwise_and(x.view(view), mask)
        lo_bits, hi_bits = (int(v) for v in torch.aminmax(mags))
        top = float(torch.tensor([hi_bits], dtype=view).view(x.dtype)[0])
        s.abs_max = max(s.abs_max, top)
        if lo_bits == hi_bits:  # one magnitude throughout: constant unless the signs differ
            lo, hi = (float(v) for v in torch.aminmax(work))
            s.finite_min = min(s.finite_min, lo)
            s.finite_max = max(s.finite_max, hi)
        else:
            s.varied = True
        if lo_bits < min_normal:
            zeros = x.numel() - int(torch.count_nonzero(mags))
            s.zeros += zeros
            s.subnormal += int(torch.count_nonzero(mags < min_normal)) - zeros
        if x.dtype in _SATURABLE and top >= torch.finfo(x.dtype).max:
            s.saturated += int((work.abs() >= torch.finfo(x.dtype).max).sum())

    def _finite_generic(self, x: torch.Tensor, work: torch.Tensor) -> None:
        s = self.stats
        lo, hi = (float(v) for v in torch.aminmax(work))
        s.finite_min = min(s.finite_min, lo)
        s.finite_max = max(s.finite_max, hi)
        top = max(-lo, hi)
        s.abs_max = max(s.abs_max, top)
        zeros, subnormal = _zeros_and_subnormals(x)
        s.zeros += zeros
        s.subnormal += subnormal
        if x.dtype in _SATURABLE and top >= torch.finfo(x.dtype).max:
            s.saturated += int((work.abs() >= torch.finfo(x.dtype).max).sum())

    def _careful(self, x: torch.Tensor, work: torch.Tensor, offset: int) -> None:
        s = self.stats
        n = x.numel()
        native = x.dtype
        finite = torch.isfinite(work)
        n_finite = int(finite.sum())
        if n_finite < n:
            nan = int(torch.isnan(work).sum())
            pos = int((work == math.inf).sum())
            s.nan += nan
            s.posinf += pos
            s.neginf += n - n_finite - nan - pos
            if s.first_nonfinite is None:
                s.first_nonfinite = offset + int(torch.nonzero(~finite)[0, 0])
            work = torch.where(finite, work, torch.zeros((), dtype=work.dtype))
        mag = work.abs()
        s.zeros += int((work == 0).sum()) - (n - n_finite)
        if n_finite:
            s.abs_max = max(s.abs_max, float(mag.max()))
            s.sum_sq += float(torch.dot(mag.double(), mag.double()))
            lo = torch.where(finite, work, torch.full((), math.inf, dtype=work.dtype)).min()
            hi = torch.where(finite, work, torch.full((), -math.inf, dtype=work.dtype)).max()
            s.finite_min = min(s.finite_min, float(lo))
            s.finite_max = max(s.finite_max, float(hi))
        info = torch.finfo(native)
        if native in _SATURABLE:
            s.saturated += int((mag >= info.max).sum())
        s.subnormal += int(((mag > 0) & (mag < info.tiny)).sum())


#: (integer view, magnitude mask, bits of the smallest normal) of the dtypes read from
#: their bits on the fast path.
_BITS = {
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x00800000),
    torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF, 0x0010000000000000),
    torch.float16: (torch.int16, 0x7FFF, 0x0400),
    torch.bfloat16: (torch.int16, 0x7FFF, 0x0080),
}

#: (integer view, exponent mask) of the dtypes whose subnormals are counted from the bits:
#: a non-zero value with an all-zero exponent is subnormal.
_EXPONENT = {
    torch.float32: (torch.int32, 0x7F800000),
    torch.float64: (torch.int64, 0x7FF0000000000000),
    torch.float16: (torch.int16, 0x7C00),
    torch.bfloat16: (torch.int16, 0x7F80),
}


def _zeros_and_subnormals(x: torch.Tensor) -> tuple[int, int]:
    """Zeros and subnormals of a finite chunk. Values with a non-zero exponent field are
    normal; when every value is (the common case for weights) that one count settles
    both, and only a chunk with zeros or subnormals pays a second count to split them."""
    n = x.numel()
    spec = _EXPONENT.get(x.dtype)
    if spec is None:
        nonzero = int(torch.count_nonzero(x))
        mag = x.to(torch.float32).abs()
        return n - nonzero, int(((mag > 0) & (mag < torch.finfo(x.dtype).tiny)).sum())
    view, mask = spec
    normal = int(torch.count_nonzero(torch.bitwise_and(x.view(view), mask)))
    if normal == n:
        return 0, 0
    nonzero = int(torch.count_nonzero(x))
    return n - nonzero, nonzero - normal


def flat_chunks(tensor: torch.Tensor, size: int = CHUNK_ELEMENTS) -> Iterator[torch.Tensor]:
    """Pieces of a tensor in row-major order, each at most ``size`` elements (views of a
    contiguous tensor: a memory-mapped storage is paged in one piece at a time)."""
    flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)
    for start in range(0, flat.numel(), size):
        yield flat[start : start + size]


def stats_of(
    key: str, chunks: Iterable[torch.Tensor], dtype: str, shape: tuple[int, ...], file: str = ""
) -> TensorStats:
    acc = StatsAccumulator(TensorStats(key=key, dtype=dtype, shape=shape, file=file))
    for chunk in chunks:
        acc.add(chunk)
    return acc.stats
