"""What sapper keeps of one tensor after reading it: counts, extremes and sums.

Apart from the reductions (:mod:`sapper.checkpoint.stats` with torch,
:mod:`sapper.checkpoint.arrays` with numpy) so the checks, the reports and a
safetensors file's inspection load no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["CHUNK_ELEMENTS", "TensorStats"]

#: Elements reduced at once: 1M fp32 temporaries are 4 MB each, so the few passes over a
#: chunk (dot, aminmax, two counts) find it in cache (4M-element chunks measured ~1.7x
#: slower on a 1 GB file).
CHUNK_ELEMENTS = 1 << 20

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
    #: Two different magnitudes seen (so not constant). ``finite_min``/``finite_max`` are
    #: exact only while this is False: the fast path does not track them otherwise.
    varied: bool = False

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
        return (
            self.numel > 1
            and self.finite == self.numel
            and not self.varied
            and self.finite_min == self.finite_max
        )

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
