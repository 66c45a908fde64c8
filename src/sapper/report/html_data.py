"""The numbers behind the HTML run report: series per chart, decimated so spikes survive.

A million-step run cannot ship every point to a browser, and averaging would hide the
one spike that matters. Each series is cut into equal buckets of records and every
bucket keeps its minimum and its maximum, in step order (so the drawn line still passes
through every extreme). Non-finite values are not points on a curve: their step ranges
are kept separately and drawn as marks. Missing values (sparse logs) are simply absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from sapper.runtime.records import StepRecord

__all__ = [
    "MAX_POINTS",
    "ChartData",
    "Columns",
    "Series",
    "decimate",
    "mask_ranges",
    "nonfinite_ranges",
]

#: Points per series in the page (min and max of MAX_POINTS / 2 buckets).
MAX_POINTS = 4000
#: Ranges of non-finite or skipped steps kept per series.
MAX_RANGES = 400


class Columns:
    """The records as numpy columns, read once per field.

    A million records are walked with ``operator.attrgetter`` (a C loop) and compared
    with ``None`` by numpy, so a missing value (a sparse log) and a NaN (a value the
    detectors must see) stay distinct without a Python loop per record.
    """

    def __init__(self, records: Sequence[StepRecord]) -> None:
        self.records = records
        self.steps = np.fromiter(
            map(attrgetter("step"), records), dtype=np.int64, count=len(records)
        )
        self._raw: dict[str, np.ndarray] = {}

    def raw(self, name: str) -> np.ndarray:
        """The field as an object array (``None`` where a record has no value)."""
        if name not in self._raw:
            column = np.empty(len(self.records), dtype=object)
            column[:] = list(map(attrgetter(name), self.records))
            self._raw[name] = column
        return self._raw[name]

    def present(self, name: str) -> np.ndarray:
        return ~np.equal(self.raw(name), None)

    def floats(self, name: str) -> np.ndarray:
        """The field as floats; missing values are NaN too (use :meth:`present`)."""
        return np.asarray(self.raw(name), dtype=np.float64)

    def get(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps and values of the records that have the field (NaN and Inf kept)."""
        mask = self.present(name)
        return self.steps[mask], self.floats(name)[mask]

    def last(self, name: str) -> float | None:
        idx = np.nonzero(self.present(name))[0]
        return None if len(idx) == 0 else float(self.raw(name)[idx[-1]])

    def constant(self, name: str) -> float | None:
        """The value if every record that has one has the same; else None."""
        values = np.unique(self.floats(name)[self.present(name)])
        return float(values[0]) if len(values) == 1 else None


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
    if len(all_steps) > 1 and bool(np.any(np.diff(all_steps) < 0)):
        pos = _positions(all_steps, marked)  # a restarted log: steps repeat per attempt
    else:
        pos = np.searchsorted(all_steps, marked)
    breaks = np.nonzero(np.diff(pos) != 1)[0]
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(marked) - 1]])
    ranges = [[int(marked[a]), int(marked[b])] for a, b in zip(starts, ends, strict=True)]
    return _merge_ranges(ranges, MAX_RANGES)


def _positions(all_steps: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Where each of ``marked`` (a subsequence of ``all_steps``, in record order) lies in
    ``all_steps`` when the steps are not sorted (a log of several attempts)."""
    pos = np.empty(len(marked), dtype=np.int64)
    j = 0
    steps = all_steps.tolist()
    for i, step in enumerate(marked.tolist()):
        while j < len(steps) - 1 and steps[j] != step:
            j += 1
        pos[i] = j
        j += 1
    return pos


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
        steps: np.ndarray,
        values: np.ndarray,
        all_steps: np.ndarray,
        kind: str = "line",
    ) -> Series | None:
        """A decimated series from the records that have a value (``steps``/``values``)."""
        if len(steps) == 0:
            return None
        finite = np.isfinite(values)
        xs, ys = decimate(steps[finite], values[finite])
        return cls(
            name,
            key,
            xs.tolist(),
            ys.tolist(),
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
