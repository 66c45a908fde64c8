"""The throughput rules (R060-R063); twin of
:class:`sapper.runtime.detectors.throughput.ThroughputDetector`.

Step-time outliers against the robust level of recent step times (the streaming
window's snapshots), the data-wait share over a window of (wait, step) pairs, and the
rate (tokens/s, else samples/s, else steps/s, in the unit of the first rate seen)
against the expectation and against the first ``degrade_window`` rates. Window sums
are added in window order, one element at a time across all windows at once, so they
round exactly as Python's ``sum`` over the deque does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import Twin, finding, row_of, state_is
from sapper.logs.columnar.twins.rolling import (
    RobustSnapshots,
    cooldown_pick,
    range_reduce,
    window_medians,
)
from sapper.rules.model import Finding
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.stats import median
from sapper.runtime.detectors.throughput import (
    DATA_WAIT,
    STEP_OUTLIER,
    THROUGHPUT_DEGRADING,
    THROUGHPUT_LOW,
    ThroughputDetector,
    cpu_wait,
    own_rate,
)

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "expected",
    "below",
    "warmup_steps",
    "min_records",
    "degrade",
    "data_share",
    "outlier_k",
    "outlier_ratio",
    "outlier_cooldown",
    "first_step",
    "degrade_window",
    "early",
    "early_median",
    "rate_count",
    "early_unit",
    "rates",
    "times",
    "waits",
    "last_outlier",
    "smooth",
    "sustain_records",
    "sustain_s",
    "recent_rates",
    "sustain_share",
    "low_episode",
    "slow_episode",
    "wait_episode",
    "prev_step",
    "seconds",
    "records_seen",
    "wait_sum",
    "time_sum",
    "timed_records",
    "wait_records",
    "rate_unit",
    "run_start_steps",
    "first_rates",
    "loader_must_keep_up",
    "wait_base",
    "wait_base_times",
}
_UNITS = ("tokens/s", "samples/s", "steps/s")


def _accepts(det: ThroughputDetector) -> bool:
    return (
        state_is(det, _STATE)
        and not det.fired
        and det.first_step is None
        and det.rate_count == 0
        and (det.waits.maxlen or 0) >= 1
        and det.min_records >= 1
        and det.degrade_window >= 1
        and det.times.refresh >= 1
        and det.times.values.maxlen == max(det.rates.values.maxlen or 0, 50)
    )


def _cooldown(det: ThroughputDetector, code: str) -> int | None:
    return det.cooldowns.get(code, det.cooldown)


def run(det: ThroughputDetector, cols: Columns) -> list[Finding]:
    """Outliers vectorised; the episode rules (R060-R062) by the detector's own episode
    code on a scratch copy, fed only the records where an episode can start or is
    running; then the detector's own ``finish``."""
    if not len(cols):
        return []
    scratch, sub, seconds = _prepare(det, cols)
    if sub is None:
        return scratch.finish()
    out = _outliers(det, sub)
    out += _data_wait(scratch, sub, seconds)
    out += _rates(scratch, sub, seconds)
    return out + scratch.finish()


class _Seconds:
    """The wall time each row from ``start`` on stands for (``_seconds``: its step time ×
    the steps since the record before, any record; ``None`` without a valid step time),
    worked out for the few rows it is read at (episode events), not for every row."""

    def __init__(self, cols: Columns, start: int) -> None:
        self.t = cols.get("step_time_s")
        self.has = cols.has("step_time_s")
        self.steps = cols.steps
        self.start = start

    def __getitem__(self, row: int) -> float | None:
        i = row + self.start
        t = float(self.t[i])
        if not (self.has[i] and math.isfinite(t) and t > 0):
            return None
        # the span as a float, as the whole-column product took it
        span = float(max(1, int(self.steps[i]) - int(self.steps[i - 1]))) if i else 1.0
        return t * span


def _prepare(
    det: ThroughputDetector, cols: Columns
) -> tuple[ThroughputDetector, Columns | None, _Seconds]:
    """A scratch copy holding the per-stream counters, the rows past the warmup (a
    suffix: steps ascend) and the wall time each of them stands for."""
    scratch = copy.deepcopy(det)
    steps = cols.steps
    scratch.first_step = int(steps[0])
    scratch.prev_step = int(steps[-1])
    # the warmup is skipped only in a log that starts with the run (not in an excerpt)
    from_start = int(steps[0]) <= det.run_start_steps
    start = (
        int(np.searchsorted(steps, int(steps[0]) + det.warmup_steps, side="left"))
        if from_start
        else 0
    )
    scratch.records_seen = len(steps) - start
    seconds = _Seconds(cols, start)
    if start >= len(steps):
        return scratch, None, seconds
    sub = cols if start == 0 else cols.slice(start, len(steps))
    return scratch, sub, seconds


def _outliers(det: ThroughputDetector, cols: Columns) -> list[Finding]:
    t_all = cols.get("step_time_s")
    ok = cols.has("step_time_s") & np.isfinite(t_all) & (t_all > 0)
    if ok.all():  # every row timed (a run log): the columns as they are
        t, s = t_all, cols.steps
    else:
        rows = np.flatnonzero(ok)
        t, s = t_all[rows], cols.steps[rows]
    del ok
    window = det.times.values.maxlen or 0
    if len(t) <= det.min_records or window < det.min_records:
        return []
    snaps = RobustSnapshots(t, window, det.min_records, det.times.refresh)
    ratio = det.outlier_ratio
    if ratio >= 0:  # ratio·median grows with the median, which is at least the minimum
        calls, v = snaps.above_floor(lambda lo: ratio * lo)
    else:
        calls = snaps.calls
        v = t[calls]
    med = snaps.level_at(calls)
    cand = np.flatnonzero(v > ratio * med)
    if not len(cand):
        return []
    c_calls, c_med = calls[cand], med[cand]
    sigma = snaps.sigma_at(c_calls, c_med)
    a = c_med + det.outlier_k * sigma
    b = ratio * c_med
    limit = np.where(b > a, b, a)
    hit = np.flatnonzero(v[cand] > limit)
    out = []
    for j in cooldown_pick(s[c_calls[hit]], det.outlier_cooldown):
        h = int(hit[j])
        i = int(c_calls[h])
        value, step, m = float(t[i]), int(s[i]), float(c_med[h])
        out.append(
            finding(
                STEP_OUTLIER,
                f"step {step} took {fmt(value)} s, {fmt(value / m)}× the median {fmt(m)} s",
                step,
                value=value,
                threshold=float(limit[h]),
            )
        )
    return out


def _data_wait(scratch: ThroughputDetector, cols: Columns, seconds: _Seconds) -> list[Finding]:
    """R062 as the streaming detector runs it: its running sums are added and taken in
    record order, so they are kept here the same way (a loop over the rows with both
    times, usually none or few)."""
    d, t = cols.get("data_time_s"), cols.get("step_time_s")
    ok = (
        cols.has("data_time_s")
        & cols.has("step_time_s")
        & ~(t <= 0)
        & np.isfinite(d)
        & np.isfinite(t)
    )
    rows = np.flatnonzero(ok)
    out: list[Finding] = []
    waits = scratch.waits
    ep = scratch.wait_episode
    share_bar = scratch.data_share
    steps = cols.steps
    for row, dv, tv in zip(rows.tolist(), d[rows].tolist(), t[rows].tolist(), strict=True):
        scratch.wait_records += 1
        if len(waits) == waits.maxlen and waits:
            old_d, old_t = waits[0]
            scratch.wait_sum -= old_d
            scratch.time_sum -= old_t
        waits.append((dv, tv))
        scratch.wait_sum += dv
        scratch.time_sum += tv
        if len(waits) < scratch.min_records:
            continue
        share = scratch.wait_sum / scratch.time_sum if scratch.time_sum > 0 else 0.0
        base = scratch.wait_base
        if base is None:
            if len(waits) >= (waits.maxlen or 0):
                scratch.seconds = seconds[row]
                out += scratch._wait_baseline(int(steps[row]), share)
            continue
        bar = base + (share_bar if not ep.ongoing else 0.8 * share_bar)
        if share < bar and not ep.ongoing:
            continue
        step = int(steps[row])
        scratch.seconds = seconds[row]
        event = ep.observe(share >= bar, step, scratch.seconds, share)
        if event is None:
            continue
        out += scratch._episode(
            DATA_WAIT,
            ep,
            event,
            step,
            f"{fmt(100 * share)}% of the step time of the last {len(waits)} logged steps "
            f"was spent waiting for data, up from {fmt(100 * base)}% over the run's first "
            f"{len(waits)} (limit: {fmt(100 * share_bar)} points above it)",
            value=share,
            threshold=base + share_bar,
            early=base,
        )
    return out


def _rate_column(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """``_rate(record)`` per row: the value and the unit's index in ``_UNITS`` (-1 for
    no rate)."""
    n = len(cols)
    t = cols.get("step_time_s")
    t_true = cols.has("step_time_s") & (t != 0)  # ``and t``: a NaN is truthy
    value: np.ndarray | None = None
    unit = np.full(n, -1, dtype=np.int8)
    todo = np.ones(n, dtype=bool)
    # (the field it is read from, whether it is divided by the step time, its unit);
    # a field the log never has is no choice on any row: skipped, no column made
    choices = [
        ("tokens_per_s", False, 0),
        ("tokens", True, 0),
        ("samples_per_s", False, 1),
        ("samples", True, 1),
        (None, True, 2),
    ]
    for name, per_time, u in choices:
        if name is not None and name not in cols.present:
            continue
        mask = cols.has(name) if name is not None else t_true
        if per_time and name is not None:
            mask = mask & t_true
        with np.errstate(divide="ignore", invalid="ignore"):
            vals = cols.get(name) if name is not None else 1.0
            if per_time:
                vals = vals / t
        if value is None and mask.all():  # the first choice holds on every row
            unit[:] = u
            return vals, unit
        if value is None:
            value = np.full(n, np.nan)
        take = todo & mask
        value[take] = vals[take]
        unit[take] = u
        todo &= ~take
    return (value if value is not None else np.full(n, np.nan)), unit


def _own_rates(cols: Columns, value: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The valid rates over the CPU time their step got (``own_rate``, after the validity
    test as in the streaming update); only records with extras carry a CPU wait."""
    out = value
    for row in cols.full:
        if valid[row]:
            rec = cols.record(row)
            if cpu_wait(rec):
                if out is value:
                    out = value.copy()
                out[row] = own_rate(float(value[row]), rec)
    return out


def _episodes(
    scratch: ThroughputDetector,
    ep: Any,
    r: np.ndarray,
    window: int,
    first: int,
    start_bar: float,
    ongoing_bar: float,
    handle: Callable[[int, float, bool], list[Finding]],
) -> list[Finding]:
    """Walk the rate rows from ``first`` where an episode can start (the rolling median of
    the last ``window`` rates below ``start_bar``) or is running (below ``ongoing_bar``
    keeps it), calling ``handle(i, median, holds)`` for each; a window whose minimum is
    at or above the start bar cannot start one and is skipped without its median."""
    m = len(r)
    if first >= m:
        return []
    lo = range_reduce(r, first + 1, m + 1, window, "min")
    maybe = np.flatnonzero(~(lo >= start_bar)) + first
    out: list[Finding] = []

    def after(i: int) -> int:
        k = int(np.searchsorted(maybe, i, side="right"))
        return int(maybe[k]) if k < len(maybe) else m

    i = int(maybe[0]) if len(maybe) else m
    while i < m:
        now = float(window_medians(r, np.array([i + 1]), window)[0])
        if ep.ongoing:
            out += handle(i, now, now < ongoing_bar)
        elif now < start_bar:
            out += handle(i, now, True)
        i = i + 1 if ep.ongoing else after(i)
    return out


def _rates(scratch: ThroughputDetector, cols: Columns, seconds: _Seconds) -> list[Finding]:
    value, unit = _rate_column(cols)
    valid = (unit >= 0) & np.isfinite(value) & (value > 0)
    if not valid.any():
        return []
    value = _own_rates(cols, value, valid)
    u = int(unit[int(np.argmax(valid))])
    valid &= unit == u
    rows: np.ndarray | None = None  # every row (a run log's rates): no copies
    if valid.all():
        r, s = value, cols.steps
    else:
        rows = np.flatnonzero(valid)
        r, s = value[rows], cols.steps[rows]
    del valid, unit
    name = _UNITS[u]
    scratch.early_unit = scratch.rate_unit = name
    scratch.rate_count = len(r)
    first_n = min(len(r), scratch.degrade_window + scratch.smooth)
    scratch.first_rates = [(float(r[i]), seconds[row_of(rows, i)]) for i in range(first_n)]
    scratch.early = r[: scratch.degrade_window].tolist()
    out: list[Finding] = []
    expected = scratch.expected.get(name)
    w = scratch.rates.values.maxlen or 0
    if expected and w:

        def below(i: int, now: float, holds: bool) -> list[Finding]:
            ep = scratch.low_episode
            step = int(s[i])
            scratch.seconds = seconds[row_of(rows, i)]
            event = ep.observe(holds, step, scratch.seconds, now)
            if event is None:
                return []
            return scratch._episode(
                THROUGHPUT_LOW,
                ep,
                event,
                step,
                f"median throughput {fmt(now)} {name} over the last {min(i + 1, w)} logged "
                f"steps is {fmt(100 * now / expected)}% of the expected {fmt(expected)} {name}",
                value=now,
                threshold=scratch.below * expected,
            )

        out += _episodes(
            scratch,
            scratch.low_episode,
            r,
            w,
            max(0, scratch.min_records - 1) if w >= scratch.min_records else len(r),
            scratch.below * expected,
            0.5 * (1.0 + scratch.below) * expected,
            below,
        )
    n = scratch.degrade_window
    sm = scratch.recent_rates.values.maxlen or 0
    if len(r) >= n + scratch.smooth and sm:
        ref = median(scratch.early)
        scratch.early_median = ref

        def slow(i: int, now: float, holds: bool) -> list[Finding]:
            ep = scratch.slow_episode
            step = int(s[i])
            scratch.seconds = seconds[row_of(rows, i)]
            event = ep.observe(holds, step, scratch.seconds, now)
            if event is None:
                return []
            worst = ep.worst if ep.worst is not None else now
            shown = now if holds else worst
            return scratch._episode(
                THROUGHPUT_DEGRADING,
                ep,
                event,
                step,
                f"throughput fell from {fmt(ref)} to {fmt(shown)} {name} "
                f"({fmt(100 * (1 - shown / ref))}% slower than the first "
                f"{n} logged steps)",
                value=now,
                threshold=scratch.degrade * ref,
                early=ref,
            )

        out += _episodes(
            scratch,
            scratch.slow_episode,
            r,
            sm,
            n + scratch.smooth - 1,
            scratch.degrade * ref,
            0.5 * (1.0 + scratch.degrade) * ref,
            slow,
        )
    return out


def unevaluated(det: ThroughputDetector, cols: Columns, found: list[Finding]) -> list[str]:
    """The streaming detector's own lines, from the counters they read."""
    if not len(cols):
        return copy.deepcopy(det).unevaluated()
    scratch, sub, _ = _prepare(det, cols)
    if sub is not None:
        t = sub.get("step_time_s")
        times = int((sub.has("step_time_s") & np.isfinite(t) & (t > 0)).sum())
        maxlen = scratch.times.values.maxlen or 0
        scratch.times.values.extend([0.0] * min(times, maxlen))
        d = sub.get("data_time_s")
        scratch.wait_records = int(
            (
                sub.has("data_time_s")
                & sub.has("step_time_s")
                & ~(t <= 0)
                & np.isfinite(d)
                & np.isfinite(t)
            ).sum()
        )
        full = scratch.waits.maxlen or 0
        if full >= scratch.min_records and scratch.wait_records >= full:
            scratch.wait_base = 0.0  # the early level was taken (its value is not read)
        value, unit = _rate_column(sub)
        valid = (unit >= 0) & np.isfinite(value) & (value > 0)
        first = np.flatnonzero(valid)
        if len(first):
            scratch.rate_count = int((valid & (unit == unit[first[0]])).sum())
    return scratch.unevaluated()


TWIN = Twin(
    cls=ThroughputDetector,
    run=run,
    accepts=_accepts,
    unevaluated=unevaluated,
    modules=(
        "sapper.runtime.detectors.throughput",
        "sapper.runtime.detectors.stats",
        "sapper.runtime.detectors.base",
    ),
    scratch=22,
    cost=0.045,
)
