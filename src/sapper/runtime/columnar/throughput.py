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

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.rules.model import Finding
from sapper.runtime.columnar.base import Twin, finding
from sapper.runtime.columnar.rolling import (
    RobustSnapshots,
    cooldown_pick,
    window_medians,
    window_reduce,
)
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.stats import median
from sapper.runtime.detectors.throughput import (
    DATA_WAIT,
    STEP_OUTLIER,
    THROUGHPUT_DEGRADING,
    THROUGHPUT_LOW,
    ThroughputDetector,
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
    "late",
    "early_median",
    "rate_count",
    "early_unit",
    "rates",
    "times",
    "waits",
    "last_outlier",
}
_UNITS = ("tokens/s", "samples/s", "steps/s")


def _accepts(det: ThroughputDetector) -> bool:
    return (
        set(vars(det)) == _STATE
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
    if not len(cols):
        return []
    live = np.flatnonzero(~(cols.steps - int(cols.steps[0]) < det.warmup_steps))
    if not len(live):
        return []
    sub = cols if len(live) == len(cols) else _rows(cols, live)
    return _outliers(det, sub) + _data_wait(det, sub) + _rates(det, sub)


def _rows(cols: Columns, rows: np.ndarray) -> Columns:
    return Columns(
        steps=cols.steps[rows],
        values={k: v[rows] for k, v in cols.values.items()},
        present={k: v[rows] for k, v in cols.present.items()},
    )


def _outliers(det: ThroughputDetector, cols: Columns) -> list[Finding]:
    t_all = cols.get("step_time_s")
    rows = np.flatnonzero(cols.has("step_time_s") & np.isfinite(t_all) & (t_all > 0))
    t, s = t_all[rows], cols.steps[rows]
    window = det.times.values.maxlen or 0
    if len(t) <= det.min_records or window < det.min_records:
        return []
    snaps = RobustSnapshots(t, window, det.min_records, det.times.refresh)
    calls = snaps.calls
    v = t[calls]
    ratio = det.outlier_ratio
    if ratio >= 0:  # ratio·median grows with the median, which is at least the minimum
        lo = snaps.floor_at(calls)
        bound = ratio * lo
        keep = ~(v < bound - 1e-9 * np.abs(bound))
        calls, v = calls[keep], v[keep]
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


def _window_sums(x: np.ndarray, ends: np.ndarray, window: int) -> np.ndarray:
    """``sum(x[e - window + 1 : e + 1])`` per end, added left to right from 0 as the
    built-in ``sum`` adds (a window cut by the start adds leading zeros, which is exact)."""
    pad = np.concatenate([np.zeros(window - 1), x])
    acc = np.zeros(len(ends))
    for k in range(window):
        acc = acc + pad[ends + k]
    return acc


def _data_wait(det: ThroughputDetector, cols: Columns) -> list[Finding]:
    d, t = cols.get("data_time_s"), cols.get("step_time_s")
    ok = (
        cols.has("data_time_s")
        & cols.has("step_time_s")
        & ~(t <= 0)
        & np.isfinite(d)
        & np.isfinite(t)
    )
    rows = np.flatnonzero(ok)
    w = det.waits.maxlen or 0
    if len(rows) < det.min_records or w < det.min_records:
        return []
    dv, tv, s = d[rows], t[rows], cols.steps[rows]
    ends = np.arange(det.min_records - 1, len(rows))
    size = np.minimum(ends + 1, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = _window_sums(dv, ends, w) / _window_sums(tv, ends, w)
    cand = np.flatnonzero(~(share < det.data_share))
    out = []
    for j in cooldown_pick(s[ends[cand]], _cooldown(det, DATA_WAIT.code)):
        c = int(cand[j])
        sh, step = float(share[c]), int(s[ends[c]])
        out.append(
            finding(
                DATA_WAIT,
                f"{fmt(100 * sh)}% of the step time of the last {int(size[c])} logged steps "
                f"was spent waiting for data (threshold {fmt(100 * det.data_share)}%)",
                step,
                value=sh,
                threshold=det.data_share,
            )
        )
    return out


def _rate_column(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """``_rate(record)`` per row: the value and the unit's index in ``_UNITS`` (-1 for
    no rate)."""
    n = len(cols)
    t = cols.get("step_time_s")
    t_true = cols.has("step_time_s") & (t != 0)  # ``and t``: a NaN is truthy
    value = np.full(n, np.nan)
    unit = np.full(n, -1, dtype=np.int64)
    todo = np.ones(n, dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        choices = [
            (cols.has("tokens_per_s"), cols.get("tokens_per_s"), 0),
            (cols.has("tokens") & t_true, cols.get("tokens") / t, 0),
            (cols.has("samples_per_s"), cols.get("samples_per_s"), 1),
            (cols.has("samples") & t_true, cols.get("samples") / t, 1),
            (t_true, 1.0 / t, 2),
        ]
    for mask, vals, u in choices:
        take = todo & mask
        value[take] = vals[take]
        unit[take] = u
        todo &= ~take
    return value, unit


def _below_floor(r: np.ndarray, ends: np.ndarray, window: int, limit: float) -> np.ndarray:
    """The window ends whose median may be below ``limit``: a window whose minimum is
    at or above it has its median there too."""
    lo = window_reduce(r, ends + 1, window, "min")
    return ends[~(lo >= limit)]


def _rates(det: ThroughputDetector, cols: Columns) -> list[Finding]:
    value, unit = _rate_column(cols)
    valid = (unit >= 0) & np.isfinite(value) & (value > 0)
    first = np.flatnonzero(valid)
    if not len(first):
        return []
    u = int(unit[first[0]])
    rows = np.flatnonzero(valid & (unit == u))
    name = _UNITS[u]
    r, s = value[rows], cols.steps[rows]
    out = []
    expected = det.expected.get(name)
    w = det.rates.values.maxlen or 0
    if expected and len(r) >= det.min_records and w >= det.min_records:
        ends = _below_floor(r, np.arange(det.min_records - 1, len(r)), w, det.below * expected)
        now = window_medians(r, ends + 1, w)
        cand = np.flatnonzero(~(now >= det.below * expected))
        for j in cooldown_pick(s[ends[cand]], _cooldown(det, THROUGHPUT_LOW.code)):
            c = int(cand[j])
            m, step = float(now[c]), int(s[ends[c]])
            out.append(
                finding(
                    THROUGHPUT_LOW,
                    f"median throughput {fmt(m)} {name} over the last "
                    f"{min(int(ends[c]) + 1, w)} logged steps is {fmt(100 * m / expected)}% of "
                    f"the expected {fmt(expected)} {name}",
                    step,
                    value=m,
                    threshold=det.below * expected,
                )
            )
    n = det.degrade_window
    if len(r) >= 3 * n:
        ref = median(r[:n].tolist())
        ends = _below_floor(r, np.arange(3 * n - 1, len(r)), n, det.degrade * ref)
        now = window_medians(r, ends + 1, n)
        cand = np.flatnonzero(~(now >= det.degrade * ref))
        for j in cooldown_pick(s[ends[cand]], _cooldown(det, THROUGHPUT_DEGRADING.code)):
            c = int(cand[j])
            m, step = float(now[c]), int(s[ends[c]])
            out.append(
                finding(
                    THROUGHPUT_DEGRADING,
                    f"throughput fell from {fmt(ref)} to {fmt(m)} {name} "
                    f"({fmt(100 * (1 - m / ref))}% slower than the first {n} logged steps)",
                    step,
                    value=m,
                    threshold=det.degrade * ref,
                    early=ref,
                )
            )
    return out


TWIN = Twin(
    cls=ThroughputDetector,
    run=run,
    accepts=_accepts,
    modules=(
        "sapper.runtime.detectors.throughput",
        "sapper.runtime.detectors.stats",
        "sapper.runtime.detectors.base",
    ),
)
