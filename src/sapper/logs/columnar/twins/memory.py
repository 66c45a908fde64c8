"""The memory rules (R050-R051); twin of
:class:`sapper.runtime.detectors.memory.MemoryDetector`.

Near the limit: the first reading of peak, reserved, allocated or RSS per row against
the row's limit (said once). Growth: a rolling share of rising readings picks the few
windows worth the full test, which then runs as the streaming detector runs it, on
that window (it too is said once, so the scan stops at the first finding).
"""

from __future__ import annotations

import copy
import weakref

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import Twin, finding, state_is
from sapper.logs.columnar.twins.rolling import cooldown_pick, rolling_sum
from sapper.rules.model import Finding
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.memory import MEMORY_GROWTH, MEMORY_NEAR_LIMIT, MemoryDetector

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "limit_gib",
    "near",
    "warmup_steps",
    "growth_min_points",
    "growth_min_steps",
    "growth_min_gib",
    "growth_min_rel",
    "growth_rising_share",
    "series",
    "rises",
    "rise_count",
    "first_step",
    "readings",
    "limit_known",
}
_USED = ("memory_peak_gib", "memory_reserved_gib", "memory_allocated_gib", "rss_gib")


def _accepts(det: MemoryDetector) -> bool:
    return (
        state_is(det, _STATE)
        and not det.fired
        and det.first_step is None
        and not det.series
        and (det.series.maxlen or 0) >= 2
        and det.growth_min_points >= 2
        and det.rises.maxlen == det.series.maxlen - 1
    )


def _limits(det: MemoryDetector, cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """``record.memory_limit_gib or self.limit_gib`` per row, and whether it is truthy."""
    own = cols.get("memory_limit_gib")
    own_set = cols.has("memory_limit_gib") & (own != 0)
    if own_set.all():  # every row says its limit (a run log): the column as it is
        return own, own_set
    default = det.limit_gib
    d_ok = default is not None and bool(default)
    d_val = float(default) if default is not None else np.nan
    return np.where(own_set, own, d_val), own_set | d_ok


#: What ``unevaluated`` reads, kept by the last ``run`` of each detector with the columns
#: it ran on: (their id, readings, a limit seen, the trend window's rows), so the call
#: right after ``run`` does not go over the columns again.
_LAST: weakref.WeakKeyDictionary[MemoryDetector, tuple[int, int, bool, np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def run(det: MemoryDetector, cols: Columns) -> list[Finding]:
    _LAST.pop(det, None)
    if not len(cols):
        return []
    limit, has_limit = _limits(det, cols)
    out = _near(det, cols, limit, has_limit)
    out += _growth(det, cols, limit, has_limit)
    return out


def _readings(det: MemoryDetector, cols: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reading per row (the allocated memory, else the RSS), where it is a finite
    number, and where the trend test keeps it (past the warmup)."""
    value = cols.get("memory_allocated_gib")
    has = cols.has("memory_allocated_gib")
    if "rss_gib" in cols.present:
        value = np.where(has, value, cols.get("rss_gib"))
        has = has | cols.has("rss_gib")
    reading = has & np.isfinite(value)
    keep = reading & ~np.less(cols.steps, int(cols.steps[0]) + det.warmup_steps)
    return value, reading, keep


def _near(
    det: MemoryDetector, cols: Columns, limit: np.ndarray, has_limit: np.ndarray
) -> list[Finding]:
    n = len(cols)
    used: np.ndarray | None = None
    found = np.zeros(n, dtype=bool)
    for name in _USED:
        if name not in cols.present:  # a reading the log never has: no row takes it
            continue
        v = cols.get(name)
        ok = cols.has(name) & np.isfinite(v) & ~found
        if used is None and ok.all():  # every row's first reading (a run log)
            used, found = v, ok
            break
        if used is None:
            used = np.full(n, np.nan)
        used[ok] = v[ok]
        found |= ok
    if used is None:
        return []
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = used / limit
    # ``used / limit < near`` returns; a NaN ratio (NaN limit) does not.
    cand = np.flatnonzero(has_limit & found & ~(ratio < det.near))
    out = []
    for j in cooldown_pick(
        cols.steps[cand], det.cooldowns.get(MEMORY_NEAR_LIMIT.code, det.cooldown)
    ):
        i = int(cand[j])
        u, lim = float(used[i]), float(limit[i])
        out.append(
            finding(
                MEMORY_NEAR_LIMIT,
                f"memory {fmt(u)} GiB is {fmt(100 * u / lim)}% of the {fmt(lim)} GiB "
                f"limit (warning above {fmt(100 * det.near)}%)",
                int(cols.steps[i]),
                value=u,
                threshold=det.near * lim,
            )
        )
    return out


def _growth(
    det: MemoryDetector, cols: Columns, limit: np.ndarray, has_limit: np.ndarray
) -> list[Finding]:
    value, reading, keep = _readings(det, cols)
    rows = np.flatnonzero(keep)
    _LAST[det] = (
        id(cols),
        int(reading.sum()),
        bool(has_limit.any()),
        rows[-(det.series.maxlen or 0) :],
    )
    if len(rows) < det.growth_min_points:
        return []
    if rows[-1] - rows[0] + 1 == len(rows):  # the rows past the warmup: slices, no copies
        v, s = value[rows[0] : rows[-1] + 1], cols.steps[rows[0] : rows[-1] + 1]
    else:
        v, s = value[rows], cols.steps[rows]
    w = det.series.maxlen or 0
    rises = np.zeros(len(v), dtype=bool)
    np.greater(v[1:], v[:-1], out=rises[1:])
    count = rolling_sum(rises, w - 1)  # the rises within the window ending here
    del rises
    # Each row's window starts ``size - 1`` rows back: the first ``w - 1`` rows' windows
    # start at row 0 and grow, every later one is ``w`` long and starts ``w - 1`` back.
    head = min(len(v), max(w - 1, 0))
    sizes = np.arange(1, head + 1)
    ok = np.empty(len(v), dtype=bool)
    ok[:head] = _growth_candidates(det, v[:head], v[0], s[:head], s[0], count[:head], sizes)
    if head < len(v):
        back = len(v) - head
        ok[head:] = _growth_candidates(
            det, v[head:], v[:back], s[head:], s[:back], count[head:], w
        )
    cooldown = det.cooldowns.get(MEMORY_GROWTH.code, det.cooldown)
    scratch = MemoryDetector(
        limit_gib=det.limit_gib,
        near=det.near,
        warmup_steps=det.warmup_steps,
        window=w,
        growth_min_points=det.growth_min_points,
        growth_min_steps=det.growth_min_steps,
        growth_min_gib=det.growth_min_gib,
        growth_min_rel=det.growth_min_rel,
        growth_rising_share=det.growth_rising_share,
    )
    out: list[Finding] = []
    last: int | None = None
    for i in np.flatnonzero(ok).tolist():
        step = int(s[i])
        if last is not None and (cooldown is None or step - last < cooldown):
            continue
        lo = max(0, i - w + 1)
        scratch.series.clear()
        scratch.series.extend(zip(s[lo : i + 1].tolist(), v[lo : i + 1].tolist(), strict=True))
        scratch.rise_count = int(count[i])
        scratch.fired.clear()
        lim = float(limit[rows[i]]) if has_limit[rows[i]] else None
        found = scratch._growth(step, lim)
        if found:
            out.extend(found)
            last = step
            if cooldown is None:
                break
    return out


def _growth_candidates(
    det: MemoryDetector,
    v: np.ndarray,
    v0: np.ndarray | float,
    s: np.ndarray,
    s0: np.ndarray | int,
    count: np.ndarray,
    size: np.ndarray | int,
) -> np.ndarray:
    """The rows worth the full growth test among rows whose readings ``v`` and steps
    ``s`` end windows of ``size`` rows starting at readings ``v0`` and steps ``s0``,
    ``count`` rises in each: enough points over enough steps, rising often enough,
    grown enough in GiB and relative to the start. What is left needs the Theil–Sen
    slope and runs as the streaming test."""
    ok = np.greater_equal(size, det.growth_min_points) & (s - s0 >= det.growth_min_steps)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = count / np.maximum(np.subtract(size, 1), 1)
    ok &= ~(np.greater_equal(size, 2) & (share < det.growth_rising_share))
    del share
    growth = v - v0
    ok &= ~(growth < det.growth_min_gib) & ~(growth < det.growth_min_rel * v0)
    return ok


def unevaluated(det: MemoryDetector, cols: Columns, found: list[Finding]) -> list[str]:
    """The streaming detector's own lines, from the counters they read: the readings, a
    limit seen, the trend window's length, whether R050 fired."""
    scratch = copy.deepcopy(det)
    if len(cols):
        last = _LAST.pop(det, None)
        if last is not None and last[0] == id(cols):
            _, scratch.readings, scratch.limit_known, rows = last
            value = cols.get("memory_allocated_gib")
            if "rss_gib" in cols.present:
                value = value[rows]
                value = np.where(
                    cols.has("memory_allocated_gib")[rows], value, cols.get("rss_gib")[rows]
                )
            else:
                value = value[rows]
        else:
            _, has_limit = _limits(det, cols)
            value, reading, kept = _readings(det, cols)
            scratch.readings = int(reading.sum())
            scratch.limit_known = bool(has_limit.any())
            rows = np.flatnonzero(kept)[-(scratch.series.maxlen or 0) :]
            value = value[rows]
        scratch.series.extend(zip(cols.steps[rows].tolist(), value.tolist(), strict=True))
    for f in found:
        scratch.fired[f.code] = f.step if f.step is not None else 0
    return scratch.unevaluated()


TWIN = Twin(
    cls=MemoryDetector,
    run=run,
    accepts=_accepts,
    unevaluated=unevaluated,
    modules=(
        "sapper.runtime.detectors.memory",
        "sapper.runtime.detectors.stats",
        "sapper.runtime.detectors.base",
    ),
    scratch=40,
    cost=0.03,
)
