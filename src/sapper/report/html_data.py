"""The numbers behind the HTML run report: series per chart, decimated so spikes survive.

A million-step run cannot ship every point to a browser, and averaging would hide the
one spike that matters. Each series is cut into equal buckets of records and every
bucket keeps its minimum and its maximum, in step order (so the drawn line still passes
through every extreme). Non-finite values are not points on a curve: their step ranges
are kept separately and drawn as marks. Missing values (sparse logs) are simply absent.

A restarted log (a rollback and resume) repeats step numbers: each attempt is its own
:class:`Segment` with its own series, so the replayed steps are drawn next to the ones
they replaced instead of folding back into one zig-zag line. The point budget is shared
between the attempts by their record counts, so restarts do not grow the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from sapper.errors import InputError, printable
from sapper.logs.analysis import MAX_ATTEMPTS
from sapper.logs.base import Attempt, to_float
from sapper.runtime.records import StepRecord

__all__ = [
    "MAX_POINTS",
    "ChartData",
    "Columns",
    "Segment",
    "Series",
    "decimate",
    "extra_table",
    "mask_ranges",
    "nonfinite_ranges",
    "page_text",
    "segments",
]

#: Points per series in the page (min and max of MAX_POINTS / 2 buckets).
MAX_POINTS = 4000
#: Ranges of non-finite or skipped steps kept per series.
MAX_RANGES = 400
#: Points per series an attempt keeps at least, however short it is.
MIN_ATTEMPT_POINTS = 200


class Columns:
    """The records as numpy columns, read once per field.

    A million records are walked with ``operator.attrgetter`` (a C loop) and compared
    with ``None`` by numpy, so a missing value (a sparse log) and a NaN (a value the
    detectors must see) stay distinct without a Python loop per record.
    """

    def __init__(self, records: Sequence[StepRecord]) -> None:
        self.records = records
        try:
            self.steps = np.fromiter(
                map(attrgetter("step"), records), dtype=np.int64, count=len(records)
            )
        except (OverflowError, TypeError, ValueError):
            raise InputError(
                "a step number is not an integer in the int64 range",
                expected="step numbers from 0 to 2^63-1",
            ) from None
        self._raw: dict[str, np.ndarray] = {}
        self._present: dict[str, np.ndarray] = {}

    def raw(self, name: str) -> np.ndarray:
        """The field as an object array (``None`` where a record has no value)."""
        if name not in self._raw:
            column = np.empty(len(self.records), dtype=object)
            column[:] = list(map(attrgetter(name), self.records))
            self._raw[name] = column
        return self._raw[name]

    def present(self, name: str) -> np.ndarray:
        if name not in self._present:
            self._present[name] = ~np.equal(self.raw(name), None)
        return self._present[name]

    def floats(self, name: str) -> np.ndarray:
        """The field as floats; missing values are NaN too (use :meth:`present`). A value
        that is no number (a reader handed on a string or an object) is NaN as well and
        an int past the float range is ±inf, rather than an error in the report."""
        return _as_floats(self.raw(name))

    def get(
        self, name: str, start: int = 0, stop: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Steps and values of the records in ``[start, stop)`` that have the field
        (NaN and Inf kept)."""
        window = slice(start, stop)
        mask = self.present(name)[window]
        # only this attempt's values are converted: a log with many restarts stays linear
        values = _as_floats(self.raw(name)[window][mask])
        return self.steps[window][mask], values

    def last(self, name: str) -> float | None:
        idx = np.nonzero(self.present(name))[0]
        return None if len(idx) == 0 else float(self.floats(name)[idx[-1]])

    def constant(self, name: str) -> float | None:
        """The value if every record that has one has the same; else None."""
        values = np.unique(self.floats(name)[self.present(name)])
        return float(values[0]) if len(values) == 1 else None


def page_text(tree: Any) -> Any:
    """The report's data with every string made safe to show: control, escape and bidi
    characters escaped by :func:`sapper.errors.printable` (line breaks kept, the page
    shows the rules' texts over several lines). The page puts text in with
    ``textContent`` only, so markup in a log is shown, never parsed; this keeps an
    U+202E in a tag name from reversing the text around it, and a NUL or an ESC from
    reaching a copy-paste. Iterative, so no nesting depth costs a recursion."""
    root: list[Any] = [tree]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        value = parent[key]
        if isinstance(value, str):
            parent[key] = printable(value, keep="\n")
        elif isinstance(value, dict):
            copy = {printable(str(k)): v for k, v in value.items()}
            parent[key] = copy
            stack.extend((copy, k) for k in copy)
        elif isinstance(value, (list, tuple)):
            items = list(value)
            parent[key] = items
            stack.extend((items, i) for i in range(len(items)))
    return root[0]


@dataclass(frozen=True)
class Segment:
    """One attempt's records, ``records[start:stop]`` (steps ascending), and the points
    each of its series may keep. ``number`` is 0 when the log holds a single attempt."""

    number: int
    start: int
    stop: int
    first_step: int
    budget: int = MAX_POINTS

    def label(self, name: str) -> str:
        """The series name in the legend: plain for a single attempt."""
        if self.number == 0:
            return name
        if self.number == 1:
            return f"{name} · attempt 1"
        return f"{name} · attempt {self.number} (from step {self.first_step})"


def segments(records: Sequence[StepRecord], attempts: Sequence[Attempt]) -> list[Segment]:
    """The attempts as segments; no attempts (older readers) or one = one segment. Only
    the attempts ``sapper analyze`` analyzes are drawn (``MAX_ATTEMPTS``): a file whose
    steps go back thousands of times would otherwise be thousands of series."""
    if len(attempts) <= 1 or not records:
        first = records[0].step if records else 0
        return [Segment(0, 0, len(records), first)]
    attempts = attempts[:MAX_ATTEMPTS]
    total = max(1, sum(max(0, a.stop - a.start) for a in attempts))
    floor = max(2, min(MIN_ATTEMPT_POINTS, 2 * MAX_POINTS // len(attempts)))
    return [
        Segment(
            a.number,
            a.start,
            a.stop,
            a.first_step,
            max(floor, MAX_POINTS * (a.stop - a.start) // total),
        )
        for a in attempts
    ]


def _as_floats(raw: np.ndarray) -> np.ndarray:
    """An object column as floats: NaN for a missing value or one that is no number (a
    string, an object), ±inf for an int past the float range, never an error."""
    try:
        return np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(raw), dtype=np.float64)
        for i, value in enumerate(raw):
            number = None if value is None else to_float(value)
            out[i] = np.nan if number is None else number
        return out


def _number(value: Any) -> float | None:
    """A float from a value a log put in ``extra`` (JSON numbers, "nan"/"inf" strings);
    None for anything else (booleans, text, nested data). An int past the float range
    is ±inf, a digit string of thousands of characters no number (``to_float``)."""
    return None if isinstance(value, bool) else to_float(value)


def extra_table(
    records: Sequence[StepRecord], name: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``extra[name]`` as columns. For a mapping such as ``{"wiki": 2.1}`` (named eval
    sets, per-layer gradient norms): per key, its values over all records (NaN where a
    record lacks it) and which records have it. Keys keep their order of first
    appearance; values that are not numbers are skipped, so a hostile log cannot break
    the page."""
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    n = len(records)
    for i, extra in enumerate(map(attrgetter("extra"), records)):
        if not extra or not isinstance(extra, dict):
            continue
        table = extra.get(name)
        if not isinstance(table, dict):
            continue
        for key, value in table.items():
            number = _number(value)
            if number is None:
                continue
            key = str(key)
            if key not in values:
                values[key] = np.full(n, np.nan)
                present[key] = np.zeros(n, dtype=bool)
            values[key][i] = number
            present[key][i] = True
    return {key: (values[key], present[key]) for key in values}


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
    #: Series of one group share a colour family (a metric's attempts); default: ``key``.
    group: str = ""
    #: The attempt this series belongs to; 0 when the log holds a single attempt.
    attempt: int = 0
    #: Fewer points than finite values: the curve is the min/max of buckets.
    decimated: bool = False

    @classmethod
    def build(
        cls,
        name: str,
        key: str,
        steps: np.ndarray,
        values: np.ndarray,
        all_steps: np.ndarray,
        kind: str = "line",
        *,
        max_points: int = MAX_POINTS,
        group: str = "",
        attempt: int = 0,
    ) -> Series | None:
        """A decimated series from the records that have a value (``steps``/``values``);
        ``all_steps`` are the steps of every record of the same attempt (ascending)."""
        if len(steps) == 0:
            return None
        finite = np.isfinite(values)
        xs, ys = decimate(steps[finite], values[finite], max_points)
        return cls(
            name,
            key,
            xs.tolist(),
            ys.tolist(),
            kind,
            nonfinite_ranges(all_steps, steps, values),
            len(steps),
            group or key,
            attempt,
            int(finite.sum()) > len(xs),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "kind": self.kind,
            "group": self.group or self.key,
            "attempt": self.attempt,
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
