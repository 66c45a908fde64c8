"""Per-tensor statistics, reduced over bounded chunks so no tensor is ever copied whole.

A :class:`StatsAccumulator` takes the chunks of one tensor (slices read from a
safetensors file, or pieces of a memory-mapped torch tensor) and keeps only counts and
sums; the temporaries of one chunk are a few times :data:`CHUNK_ELEMENTS` elements.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CHUNK_ELEMENTS",
    "StatsAccumulator",
    "TensorStats",
    "flat_chunks",
    "stats_of",
]

#: Elements reduced at once: 4M fp32 temporaries are 16 MB each.
CHUNK_ELEMENTS = 1 << 22

#: dtypes whose largest finite value a trained tensor can plausibly reach (clamped on
#: overflow); fp32/fp64 saturation is not a failure mode seen in practice.
_SATURABLE = {torch.float16, torch.bfloat16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _SATURABLE.add(getattr(torch, _name))


@dataclass
class TensorStats:
    """What sapper knows of one tensor after reading it once."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    file: str = ""
    numel: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    #: Flat (row-major) index of the first NaN/Inf.
    first_nonfinite: int | None = None
    zeros: int = 0
    abs_max: float = 0.0
    sum_sq: float = 0.0
    finite_min: float = math.inf
    finite_max: float = -math.inf
    saturated: int = 0
    subnormal: int = 0
    floating: bool = True

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    @property
    def finite(self) -> int:
        return self.numel - self.nonfinite

    @property
    def rms(self) -> float:
        return math.sqrt(self.sum_sq / self.finite) if self.finite else math.nan

    @property
    def zero_fraction(self) -> float:
        return self.zeros / self.numel if self.numel else 0.0

    @property
    def constant(self) -> bool:
        """Every finite value equal (all zero included), over more than one element."""
        return self.numel > 1 and self.finite == self.numel and self.finite_min == self.finite_max

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.key,
            "file": self.file,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "numel": self.numel,
            "nan": self.nan,
            "posinf": self.posinf,
            "neginf": self.neginf,
            "first_nonfinite": self.first_nonfinite,
            "zero_fraction": self.zero_fraction,
            "abs_max": self.abs_max,
            "rms": self.rms,
            "saturated": self.saturated,
            "subnormal_fraction": self.subnormal / self.numel if self.numel else 0.0,
        }


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
            s.floating = False
            s.zeros += int((x == 0).sum())
            wide = x.to(torch.float64)
            s.abs_max = max(s.abs_max, float(wide.abs().max()))
            s.sum_sq += float((wide * wide).sum())
            s.finite_min = min(s.finite_min, float(wide.min()))
            s.finite_max = max(s.finite_max, float(wide.max()))
            return
        if x.is_complex():
            x = torch.view_as_real(x).reshape(-1)
        native = x.dtype
        work = x if native == torch.float64 else x.to(torch.float32)
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
            s.sum_sq += float(
                torch.sum(mag.double() ** 2)
                if native == torch.float64
                else torch.sum(mag * mag, dtype=torch.float64)
            )
            lo = torch.where(finite, work, torch.full((), math.inf, dtype=work.dtype)).min()
            hi = torch.where(finite, work, torch.full((), -math.inf, dtype=work.dtype)).max()
            s.finite_min = min(s.finite_min, float(lo))
            s.finite_max = max(s.finite_max, float(hi))
        info = torch.finfo(native)
        if native in _SATURABLE:
            s.saturated += int((mag >= info.max).sum())
        s.subnormal += int(((mag > 0) & (mag < info.tiny)).sum())


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
