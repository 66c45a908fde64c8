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
- a scheduler stepped per micro-batch (R042): the first step that shows it.

Any other sign begins where it was found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sapper.logs.analysis import Analysis
    from sapper.rules.model import Finding
    from sapper.runtime.records import StepRecord

__all__ = ["onset_of"]

#: Records walked back from a finding (a long log's onset is near its finding).
MAX_WALK = 20_000
#: A memory reading this much (relative) below the next still counts as the same rise.
MEMORY_SLACK = 0.01
#: Readings in a row that do not rise before a memory rise counts as begun after them.
FLAT_READINGS = 3


def _window(analysis: Analysis, f: Finding) -> Sequence[StepRecord]:
    """The records of the finding's attempt up to its step, the last ``MAX_WALK``."""
    records = analysis.log.records
    attempt = int(f.data.get("attempt") or 1)
    start, stop = 0, len(records)
    for summary in analysis.attempts:
        if summary.attempt.number == attempt:
            start, stop = summary.attempt.start, summary.attempt.stop
    part = records[start:stop]
    end = len(part)
    while end and part[end - 1].step > (f.step or 0):
        end -= 1
    return part[max(0, end - MAX_WALK) : end]


def _scale_decline(recs: Sequence[StepRecord]) -> int | None:
    """The first record below the peak the decline that ends at the finding fell from
    (a dynamic scale rises and halves all run long: the last peak, not the highest)."""
    scales = [(r.step, r.loss_scale) for r in recs if r.loss_scale is not None]
    if len(scales) < 2:
        return None
    i = len(scales) - 1
    while i > 0 and scales[i - 1][1] >= scales[i][1]:
        i -= 1
    peak = scales[i][1]
    return next((step for step, scale in scales[i:] if scale < peak), None)


def _memory(r: StepRecord) -> float | None:
    for value in (r.memory_allocated_gib, r.memory_reserved_gib, r.rss_gib):
        if value is not None:
            return value
    return None


def _memory_rise(recs: Sequence[StepRecord]) -> int | None:
    """The first reading of the rise that ends at the finding: walking back, readings
    keep falling; up to ``FLAT_READINGS`` in a row that do not (noise, a pause in the
    leak) are crossed, more end the walk where the rise began."""
    readings = [(r.step, m) for r in recs if (m := _memory(r)) is not None]
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


def _first_repeat(recs: Sequence[StepRecord]) -> int | None:
    seen: set[str] = set()
    for r in recs:
        hashes = r.extra.get("sample_hashes")
        if not isinstance(hashes, list):
            continue
        if any(str(h) in seen for h in hashes):
            return r.step
        seen.update(map(str, hashes))
    return None


def _first_step(recs: Sequence[StepRecord]) -> int | None:
    return recs[0].step if recs else None


def _per_micro(recs: Sequence[StepRecord]) -> int | None:
    for r in recs:
        calls = r.extra.get("scheduler_steps")
        if isinstance(calls, int) and calls > 1:
            return r.step
    return None


_WALKS: dict[str, Callable[[Sequence[StepRecord]], int | None]] = {
    "R030": _scale_decline, "R031": _scale_decline,
    "R050": _memory_rise, "R051": _memory_rise,
    "R070": _first_repeat, "R072": _first_repeat,
    "R041": _first_step, "R043": _first_step, "R101": _first_step,
    "R042": _per_micro,
}


def onset_of(analysis: Analysis, f: Finding) -> int | None:
    """The step the evidence of ``f`` began, never after its own step; its step when
    the records do not say."""
    walk = _WALKS.get(f.code)
    if walk is None or f.step is None:
        return f.step
    began = walk(_window(analysis, f))
    return f.step if began is None else min(began, f.step)
