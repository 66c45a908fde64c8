"""The numbers behind the HTML run report: series per chart, decimated so spikes survive.

A million-step run cannot ship every point to a browser, and averaging would hide the
one spike that matters. Each series is cut into equal buckets of records and every
bucket keeps its minimum and its maximum, in step order (so the drawn line still passes
through every extreme). Non-finite values are not points on a curve: their step ranges
are kept separately and drawn as marks. Missing values (sparse logs) are simply absent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapper.runtime.records import StepRecord

__all__ = [
    "MAX_POINTS",
    "ChartData",
    "Series",
    "decimate",
    "mask_ranges",
    "nonfinite_ranges",
    "series_of",
]

#: Points per series in the page (min and max of MAX_POINTS / 2 buckets).
MAX_POINTS = 4000
#: Ranges of non-finite or skipped steps kept per series.
MAX_RANGES = 400


def series_of(
    records: Sequence[StepRecord], get: Callable[[StepRecord], float | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of the records where ``get`` has a value (NaN kept)."""
    pairs = [(r.step, v) for r in records if (v := get(r)) is not None]
    if not pairs:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    steps, values = zip(*pairs, strict=True)
    return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)


def decimate(
    steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: the min and max of each bucket, in step order."""
    n = len(values)
    if n <= max_points:
        return steps, values
    buckets = max(1, max_points // 2)
    width = -(-n // buckets)
    rows = -(-n // width)
    pad = rows * width - n
    lo = np.concatenate([values, np.full(pad, np.inf)]).reshape(rows, width)
    hi = np.concatenate([values, np.full(pad, -np.inf)]).reshape(rows, width)
    base = np.arange(rows) * width
    i_min = base + lo.argmin(axis=1)
    i_max = base + hi.argmax(axis=1)
    first = np.minimum(i_min, i_max)
    second = np.maximum(i_min, i_max)
    idx = np.empty(2 * rows, dtype=np.int64)
    idx[0::2], idx[1::2] = first, second
    keep = np.ones(len(idx), dtype=bool)
    keep[1::2] = second != first
    idx = idx[keep]
    return steps[idx], values[idx]


def _merge_ranges(ranges: list[list[int]], max_ranges: int) -> list[list[int]]:
    if len(ranges) <= max_ranges:
        return ranges
    per = -(-len(ranges) // max_ranges)
    return [[ranges[i][0], ranges[min(i + per, len(ranges)) - 1][1]]
            for i in range(0, len(ranges), per)]


def nonfinite_ranges(
    all_steps: np.ndarray, steps: np.ndarray, values: np.ndarray
) -> list[list[int]]:
    """Step ranges whose value is NaN or Inf, as runs over the log's own records."""
    bad = ~np.isfinite(values)
    if not bad.any():
        return []
    return mask_ranges(all_steps, steps[bad])


def mask_ranges(all_steps: np.ndarray, marked: np.ndarray) -> list[list[int]]:
    """Ranges of ``marked`` steps (sorted, a subset of ``all_steps``) as
    ``[first, last]``; consecutive when no unmarked record lies between them. A run that
    diverged stays NaN for every later step: that is one range, not thousands."""
    if len(marked) == 0:
        return []
    pos = np.searchsorted(all_steps, marked)
    breaks = np.nonzero(np.diff(pos) != 1)[0]
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(marked) - 1]])
    ranges = [[int(marked[a]), int(marked[b])] for a, b in zip(starts, ends, strict=True)]
    return _merge_ranges(ranges, MAX_RANGES)


@dataclass
class Series:
    """One curve: decimated finite points plus the ranges where it was not finite."""

    name: str
    key: str
    x: list[int]
    y: list[float]
    kind: str = "line"
    nonfinite: list[list[int]] = field(default_factory=list)
    #: Records with a value before decimation.
    count: int = 0

    @classmethod
    def build(
        cls,
        name: str,
        key: str,
        records: Sequence[StepRecord],
        all_steps: np.ndarray,
        get: Callable[[StepRecord], float | None],
        kind: str = "line",
    ) -> Series | None:
        steps, values = series_of(records, get)
        if len(steps) == 0:
            return None
        finite = np.isfinite(values)
        xs, ys = decimate(steps[finite], values[finite])
        return cls(
            name,
            key,
            [int(v) for v in xs],
            [float(v) for v in ys],
            kind,
            nonfinite_ranges(all_steps, steps, values),
            len(steps),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "kind": self.kind,
            "x": self.x,
            "y": [_round(v) for v in self.y],
            "nonfinite": self.nonfinite,
            "count": self.count,
        }


def _round(v: float) -> float:
    """Six significant digits: the page needs shape, not the last bit (and stays small)."""
    return float(f"{v:.6g}")


@dataclass
class ChartData:
    """One chart of the report: its series, reference lines, step bands and markers."""

    id: str
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    #: Horizontal reference lines: ``{"name", "y"}`` (clip threshold, memory limit ...).
    lines: list[dict[str, Any]] = field(default_factory=list)
    #: Shaded step ranges: ``{"name", "ranges"}`` (skipped steps).
    bands: list[dict[str, Any]] = field(default_factory=list)
    #: Indices into the report's findings list, drawn at their step.
    markers: list[int] = field(default_factory=list)
    log_scale: bool = False
    #: Why the chart is empty, when it is.
    empty: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "unit": self.unit,
            "series": [s.to_json() for s in self.series],
            "lines": self.lines,
            "bands": self.bands,
            "markers": self.markers,
            "log": self.log_scale,
            "empty": self.empty,
        }
