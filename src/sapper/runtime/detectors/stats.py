"""Robust statistics shared by the detectors: median/MAD, Theil–Sen slope.

Training curves are noisy and heavy-tailed; a mean and standard deviation are dragged by
the very spikes a detector hunts. The median and the median absolute deviation (MAD) are
not, so thresholds are written as ``median + k · 1.4826 · MAD`` (1.4826 makes the MAD a
standard deviation for normal noise).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

__all__ = ["RollingRobust", "finite", "mad", "median", "robust_sigma", "theil_sen_slope"]

MAD_TO_SIGMA = 1.4826


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan
    mid = n // 2
    return xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation around ``center`` (default: the median)."""
    if not values:
        return math.nan
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def robust_sigma(values: Sequence[float]) -> float:
    return MAD_TO_SIGMA * mad(values)


def theil_sen_slope(xs: Sequence[float], ys: Sequence[float], max_points: int = 32) -> float:
    """Median of pairwise slopes: a trend that one outlier cannot tilt."""
    pts = list(zip(xs, ys, strict=True))
    if len(pts) > max_points:  # thin evenly; the estimate barely changes and stays O(n²)-cheap
        stride = len(pts) / max_points
        pts = [pts[int(i * stride)] for i in range(max_points)]
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(pts)
        for x2, y2 in pts[i + 1 :]
        if x2 != x1
    ]
    return median(slopes) if slopes else math.nan


class RollingRobust:
    """A rolling window with its median and robust sigma, recomputed every ``refresh``
    additions: the reference level of a long window moves slowly, and sorting it on
    every record is most of a detector's cost."""

    def __init__(self, window: int, refresh: int = 4) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.refresh = refresh
        self._since = refresh
        self._stats = (math.nan, math.nan)

    def __len__(self) -> int:
        return len(self.values)

    def add(self, value: float) -> None:
        self.values.append(value)
        self._since += 1

    def stats(self) -> tuple[float, float]:
        """(median, robust sigma) of the window, at most ``refresh`` additions old."""
        if self._since >= self.refresh:
            xs = list(self.values)
            med = median(xs)
            self._stats = (med, MAD_TO_SIGMA * mad(xs, med))
            self._since = 0
        return self._stats
