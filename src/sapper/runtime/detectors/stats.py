"""Robust statistics shared by the detectors: median/MAD, Theil–Sen slope.

Training curves are noisy and heavy-tailed; a mean and standard deviation are dragged by
the very spikes a detector hunts. The median and the median absolute deviation (MAD) are
not, so thresholds are written as ``median + k · 1.4826 · MAD`` (1.4826 makes the MAD a
standard deviation for normal noise).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence

__all__ = [
    "RollingRobust",
    "SortedWindow",
    "finite",
    "mad",
    "median",
    "robust_sigma",
    "sorted_median",
    "theil_sen_slope",
]

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


class SortedWindow:
    """The last ``size`` values in arrival order and in sorted order, so the median is a
    read instead of a sort: each addition costs a binary search and a short list move.
    Values must not be NaN (a NaN cannot be found again to be removed)."""

    __slots__ = ("sorted", "values")

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.sorted: list[float] = []

    def __len__(self) -> int:
        return len(self.values)

    def add(self, value: float) -> None:
        values, ordered = self.values, self.sorted
        if len(values) == values.maxlen:
            if not ordered:  # a window of size 0 keeps nothing
                return
            del ordered[bisect_left(ordered, values[0])]
        values.append(value)
        insort(ordered, value)

    def median(self) -> float:
        """Same value as ``median(values)``: the middle of the sorted order."""
        return sorted_median(self.sorted)


def sorted_median(xs: Sequence[float]) -> float:
    """The median of an already sorted sequence."""
    n = len(xs)
    if n == 0:
        return math.nan
    mid = n // 2
    return xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])


class RollingRobust(SortedWindow):
    """A rolling window with its median and robust sigma, as of the last refresh, every
    ``refresh`` additions: the reference level of a long window moves slowly.

    The window is kept sorted (:class:`SortedWindow`), so the median is read, not
    sorted; the robust sigma needs a second pass over the window and is computed only
    when a caller asks for it (most records fail a detector's cheap pre-test first),
    from a copy of the window taken at the refresh, so it is the same number a full
    recomputation at the refresh would give. Values must be finite.
    """

    __slots__ = ("_median", "_sigma", "_since", "_snapshot", "refresh")

    def __init__(self, window: int, refresh: int = 4) -> None:
        super().__init__(window)
        self.refresh = refresh
        self._since = refresh
        self._median = math.nan
        self._snapshot: list[float] = []
        self._sigma: float | None = math.nan

    def add(self, value: float) -> None:
        values, ordered = self.values, self.sorted
        self._since += 1
        if len(values) == values.maxlen:
            if not ordered:
                return
            del ordered[bisect_left(ordered, values[0])]
        values.append(value)
        insort(ordered, value)

    def level(self) -> float:
        """The median of the window, at most ``refresh`` additions old."""
        if self._since >= self.refresh:
            self._snapshot = self.sorted.copy()
            self._median = sorted_median(self._snapshot)
            self._sigma = None
            self._since = 0
        return self._median

    def sigma(self) -> float:
        """The robust sigma (1.4826·MAD) of the window as of the same refresh as
        :meth:`level`; call :meth:`level` first."""
        if self._sigma is None:
            med = self._median
            self._sigma = MAD_TO_SIGMA * median([abs(v - med) for v in self._snapshot])
        return self._sigma

    def stats(self) -> tuple[float, float]:
        """(median, robust sigma) of the window, at most ``refresh`` additions old."""
        med = self.level()
        return med, self.sigma()
