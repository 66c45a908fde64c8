"""When the evidence of a cause began, read back from the log's own records.

A detector reports when it is sure: a memory leak after a window of readings that rise,
a short data cycle once the samples came round several times, a collapsing loss scale
after several halvings. The cause was at work before that; the user asks "since when",
and the answer decides which checkpoint is still clean. For the signs whose beginning
the records show, :func:`onset_of` walks back from the finding's step, within its own
attempt and at most ``MAX_WALK`` records, to where the signal departed from the run's
level:

- a loss scale (R030, R031): the first record below the peak its decline fell from;
- memory (R050, R051): the first reading above the low point of the rise that ends at
  the finding;
- repeated samples (R070, R072): the first step that read a sample read before;
- the schedule (R041, R043, R101): the run's first step, the schedule is wrong from it;
- a scheduler stepped per micro-batch (R042): the first step that shows it;
- memorisation (R110): the eval loss's best step, after which it rose; a slowdown
  (R060, R061): the start of its episode, as the finding says;
- a data wait (R062): the first reading of the run of readings above halfway between
  the wait early in the log and at its end.

Any other sign begins where it was found.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sapper.logs.analysis import Analysis
    from sapper.logs.base import LogData
    from sapper.rules.model import Finding
    from sapper.runtime.records import StepRecord

__all__ = ["onset_of", "series"]

#: Records walked back from a finding (a long log's onset is near its finding).
MAX_WALK = 20_000
#: A memory reading this much (relative) below the next still counts as the same rise.
MEMORY_SLACK = 0.01
#: Readings in a row that do not rise before a memory rise counts as begun after them.
FLAT_READINGS = 3
#: The memory a log may hold, most telling first.
MEMORY_FIELDS = ("memory_allocated_gib", "memory_reserved_gib", "rss_gib")


def _attempt_rows(analysis: Analysis, f: Finding) -> tuple[int, int]:
    attempt = int(f.data.get("attempt") or 1)
    for summary in analysis.attempts:
        if summary.attempt.number == attempt:
            return summary.attempt.start, summary.attempt.stop
    return 0, len(analysis.log.records)


def _rows(analysis: Analysis, f: Finding) -> tuple[int, int]:
    """The rows of the finding's attempt up to its step, the last ``MAX_WALK``."""
    log = analysis.log
    start, stop = _attempt_rows(analysis, f)
    columns = getattr(log, "columns", None)
    step = f.step or 0
    if columns is not None:  # steps ascend within an attempt (numpy: the columns hold it)
        import numpy as np

        end = start + int(np.searchsorted(columns.steps[start:stop], step, side="right"))
    else:
        end = bisect_right(log.records, step, start, stop, key=lambda r: r.step)
    return max(start, end - MAX_WALK), end


def series(log: LogData, name: str, start: int, stop: int) -> list[tuple[int, float]]:
    """``(step, value)`` of a record field over rows ``start:stop``, where logged: from
    the columns of a log read into columns (no record is built), else the records."""
    columns = getattr(log, "columns", None)
    if columns is not None:
        mask = columns.has(name)[start:stop]
        steps = columns.steps[start:stop][mask]
        values = columns.get(name)[start:stop][mask]
        return list(zip(steps.tolist(), values.tolist(), strict=True))
    return [
        (r.step, v) for r in log.records[start:stop] if (v := getattr(r, name, None)) is not None
    ]


def _scale_decline(analysis: Analysis, rows: tuple[int, int]) -> int | None:
    """The first record below the peak the decline that ends at the finding fell from
    (a dynamic scale rises and halves all run long: the last peak, not the highest)."""
    scales = series(analysis.log, "loss_scale", *rows)
    if len(scales) < 2:
        return None
    i = len(scales) - 1
    while i > 0 and scales[i - 1][1] >= scales[i][1]:
        i -= 1
    peak = scales[i][1]
    return next((step for step, scale in scales[i:] if scale < peak), None)


def _memory_rise(analysis: Analysis, rows: tuple[int, int]) -> int | None:
    """The first reading of the rise that ends at the finding: walking back, readings
    keep falling; up to ``FLAT_READINGS`` in a row that do not (noise, a pause in the
    leak) are crossed, more end the walk where the rise began."""
    readings: list[tuple[int, float]] = []
    for name in MEMORY_FIELDS:
        readings = series(analysis.log, name, *rows)
        if readings:
            break
    if len(readings) < 2:
        return None
    began, flat = len(readings) - 1, 0
    for i in range(len(readings) - 1, 0, -1):
        if readings[i - 1][1] < readings[i][1] * (1 - MEMORY_SLACK / 10):
            began, flat = i - 1, 0
        else:
            flat += 1
            if flat > FLAT_READINGS:
                break
    # readings[began] is the rise's low point, the last reading before memory grew.
    return readings[min(began + 1, len(readings) - 1)][0]


def _data_rise(analysis: Analysis, rows: tuple[int, int]) -> int | None:
    """The first reading of the rise in data wait that ends at the finding: the run of
    readings, walking back from the last, above halfway between the wait of the log's
    first quarter and its last readings'."""
    waits = series(analysis.log, "data_time_s", *rows)
    if len(waits) < 8:
        return None
    values = [v for _, v in waits]
    quarter = max(2, len(values) // 4)
    early = float(median(values[:quarter]))
    late = float(median(values[-quarter:]))
    if not late > early:
        return None
    line = (early + late) / 2
    i = len(waits) - 1
    below = 0
    began = None
    while i >= 0:
        if waits[i][1] > line:
            began, below = waits[i][0], 0
        else:
            below += 1
            if below > FLAT_READINGS:
                break
        i -= 1
    return began


def _records(analysis: Analysis, rows: tuple[int, int]) -> Sequence[StepRecord]:
    return analysis.log.records[rows[0] : rows[1]]


def _first_repeat(analysis: Analysis, rows: tuple[int, int]) -> int | None:
    seen: set[str] = set()
    for r in _records(analysis, rows):
        hashes = r.extra.get("sample_hashes")
        if not isinstance(hashes, list):
            continue
        if any(str(h) in seen for h in hashes):
            return r.step
        seen.update(map(str, hashes))
    return None


def _per_micro(analysis: Analysis, rows: tuple[int, int]) -> int | None:
    for r in _records(analysis, rows):
        calls = r.extra.get("scheduler_steps")
        if isinstance(calls, int) and calls > 1:
            return r.step
    return None


#: Signs of a schedule that is wrong from the attempt's first step.
FROM_START = frozenset({"R041", "R043", "R101"})

_WALKS: dict[str, Callable[[Analysis, tuple[int, int]], int | None]] = {
    "R030": _scale_decline, "R031": _scale_decline,
    "R050": _memory_rise, "R051": _memory_rise,
    "R070": _first_repeat, "R072": _first_repeat,
    "R042": _per_micro,
    "R062": _data_rise,
}


#: Findings that say themselves where their evidence began: the eval loss's best step
#: (memorisation starts there), a slowdown's or a data wait's episode start.
SAID = {"R110": "best_step", "R060": "episode_start", "R061": "episode_start"}


def _said(f: Finding) -> int | None:
    key = SAID.get(f.code)
    at = f.data.get(key) if key is not None else None
    return at if isinstance(at, int) and not isinstance(at, bool) else None


def onset_of(analysis: Analysis, f: Finding) -> int | None:
    """The step the evidence of ``f`` began, never after its own step; its step when
    the records do not say."""
    if f.step is None:
        return None
    if f.code in FROM_START:
        start, stop = _attempt_rows(analysis, f)
        first = analysis.log.records[start].step if stop > start else f.step
        return min(first, f.step)
    said = _said(f)
    if said is not None:
        return min(said, f.step)
    walk = _WALKS.get(f.code)
    if walk is None:
        return f.step
    began = walk(analysis, _rows(analysis, f))
    return f.step if began is None else min(began, f.step)
