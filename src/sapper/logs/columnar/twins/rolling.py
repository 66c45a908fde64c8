"""The streaming detectors' statistics over whole arrays, to the last bit.

Every function here reproduces one streaming construct exactly, not approximately: the
median is the middle of the sorted values (the mean of the two middle ones, computed as
``0.5 * (a + b)`` like :func:`sapper.runtime.detectors.stats.sorted_median`), the robust
sigma is taken on the snapshot :class:`~sapper.runtime.detectors.stats.RollingRobust`
takes every ``refresh`` additions, and a cooldown is applied greedily in step order over
the few candidate steps. Windows are processed in chunks, so memory stays bounded on a
ten-million-step log.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sapper.runtime.detectors.stats import MAD_TO_SIGMA

__all__ = [
    "CHUNK",
    "RobustSnapshots",
    "cooldown_pick",
    "exact_log",
    "medians_of_rows",
    "range_reduce",
    "rolling_sum",
    "window_medians",
    "window_reduce",
]

#: Windows handled at once (rows × window float64s stay a few tens of MB).
CHUNK = 1 << 14


def medians_of_rows(rows: np.ndarray) -> np.ndarray:
    """The median of each row of a 2-D array, as ``sorted_median`` computes it."""
    n, w = rows.shape
    if w == 0:
        return np.full(n, np.nan)
    mid = w // 2
    if w % 2:
        part = np.partition(rows, mid, axis=1)
        return part[:, mid].copy()
    part = np.partition(rows, (mid - 1, mid), axis=1)
    return 0.5 * (part[:, mid - 1] + part[:, mid])


def window_medians(x: np.ndarray, ends: np.ndarray, window: int) -> np.ndarray:
    """The median of ``x[max(0, e - window):e]`` for each ``e`` in ``ends``."""
    out = np.empty(len(ends))
    if not len(ends):
        return out
    short = ends < window
    for j in np.flatnonzero(short):
        e = int(ends[j])
        out[j] = medians_of_rows(x[None, :e])[0] if e else np.nan
    full = np.flatnonzero(~short)
    if len(full) and len(x) >= window:
        view = sliding_window_view(x, window)
        for lo in range(0, len(full), CHUNK):
            idx = full[lo : lo + CHUNK]
            out[idx] = medians_of_rows(view[ends[idx] - window])
    return out


def window_reduce(x: np.ndarray, ends: np.ndarray, window: int, how: str) -> np.ndarray:
    """``min`` or ``max`` of ``x[max(0, e - window):e]`` per end (NaN for an empty
    window): cheap bounds that spare most medians. ``x`` must hold no NaN."""
    out = np.full(len(ends), np.nan)
    if not len(ends) or window <= 0:
        return out
    acc = np.minimum if how == "min" else np.maximum
    short = ends < window
    if short.any():
        running = acc.accumulate(x[: max(1, min(len(x), window))])
        pick = short & (ends > 0)
        out[pick] = running[ends[pick] - 1]
    full = np.flatnonzero(~short)
    if len(full) and len(x) >= window:
        if len(full) * window < len(x):  # few windows: each one read directly
            view = sliding_window_view(x, window)
            fn = np.min if how == "min" else np.max
            for lo in range(0, len(full), CHUNK):
                idx = full[lo : lo + CHUNK]
                out[idx] = fn(view[ends[idx] - window], axis=1)
        else:
            out[full] = _sliding(x, window, acc)[ends[full] - window]
    return out


def range_reduce(x: np.ndarray, start: int, stop: int, window: int, how: str) -> np.ndarray:
    """:func:`window_reduce` at every end from ``start`` to ``stop`` (exclusive), without
    an array of the ends; where every window is full and most values are read, a slice
    of the one rolling pass."""
    if window > 0 and window <= start < stop <= len(x) + 1 and (stop - start) * window >= len(x):
        acc = np.minimum if how == "min" else np.maximum
        return _sliding(x, window, acc)[start - window : stop - window]
    return window_reduce(x, np.arange(start, stop), window, how)


#: Up to this window the sliding minimum or maximum is taken by doubling spans.
_DOUBLING_MAX = 256


def _doubling(x: np.ndarray, window: int, acc: np.ufunc) -> np.ndarray:
    """``acc`` over every window ``x[s:s + window]`` by doubling spans: ``acc`` of
    neighbours gives every span of 2, of those every span of 4, and so on up to half the
    window or more; two such spans, overlapping, cover each window. log2(window) + 1
    whole-array passes of numpy's own loop (a window of 50: six, some 8 ms per million
    values, a third of polars' rolling pass)."""
    n = len(x)
    cur, span = x, 1
    while 2 * span <= window:
        cur = acc(cur[:-span], cur[span:])  # cur[i]: acc of x[i:i + 2 span]
        span *= 2
    if span < window:
        cur = acc(cur[: n - window + 1], cur[window - span : n - span + 1])
    return cur


def _sliding(x: np.ndarray, window: int, acc: np.ufunc) -> np.ndarray:
    """``acc`` over every window ``x[s:s + window]``: by doubling spans for the short
    windows the detectors use, else in O(n) by polars' rolling minimum or maximum (one
    pass in its own code, two to three times faster than the blocks below) when the
    reader has imported it, else van Herk / Gil-Werman, running values from the start
    and from the end of fixed blocks of ``window``. A minimum or maximum is one of the
    values, so all give the same numbers."""
    n = len(x)
    if 1 <= window <= min(n, _DOUBLING_MAX):
        return _doubling(x, window, acc)
    pl = sys.modules.get("polars")
    if pl is not None and n >= window > 1 and x.dtype == np.float64:
        series = pl.Series(x)
        rolled = series.rolling_min(window) if acc is np.minimum else series.rolling_max(window)
        return rolled.slice(window - 1).to_numpy()  # no nulls left: no copy to NaN
    blocks = -(-n // window)
    fill = np.inf if acc is np.minimum else -np.inf
    padded = np.concatenate([x, np.full(blocks * window - n, fill)]).reshape(blocks, window)
    head = acc.accumulate(padded, axis=1).ravel()
    tail = acc.accumulate(padded[:, ::-1], axis=1)[:, ::-1].ravel()
    starts = np.arange(n - window + 1)
    return acc(tail[starts], head[starts + window - 1])


#: Below this many values the natural logs are taken one by one (no polars series).
_LOG_SERIES = 4096
#: Values whose logs are taken one by one too, spread over a long array, to check that
#: polars' logarithm is the one ``math.log`` calls.
_LOG_PROBES = 257


def exact_log(x: np.ndarray) -> np.ndarray:
    """``math.log`` of each of ``x`` (positive), to the last bit. numpy's own
    logarithm (vectorised, not the C library's) differs from it in the last bit of some
    values; polars computes each with the C library's ``log``, as ``math.log`` does, at
    a tenth of the cost of calling ``math.log`` a million times from Python. Where
    polars is loaded and a spread of values agrees bit for bit, its result is taken;
    else (and for short arrays) each value goes through ``math.log``."""
    pl = sys.modules.get("polars")
    if pl is not None and len(x) >= _LOG_SERIES and x.dtype == np.float64:
        out = pl.Series(x).log().to_numpy()
        probe = np.linspace(0, len(x) - 1, _LOG_PROBES).astype(np.int64)
        want = np.fromiter(map(math.log, x[probe].tolist()), np.float64, count=len(probe))
        if out.dtype == np.float64 and np.array_equal(
            out[probe].view(np.int64), want.view(np.int64)
        ):
            return out
    return np.fromiter(map(math.log, x.tolist()), dtype=np.float64, count=len(x))


def window_mads(x: np.ndarray, ends: np.ndarray, window: int, centers: np.ndarray) -> np.ndarray:
    """``MAD_TO_SIGMA * median(|x[e-window:e] - c|)`` per end ``e`` and center ``c``."""
    out = np.empty(len(ends))
    if not len(ends):
        return out
    for j in range(len(ends)):
        e = int(ends[j])
        seg = x[max(0, e - window) : e]
        dev = np.abs(seg - centers[j])
        out[j] = MAD_TO_SIGMA * medians_of_rows(dev[None, :])[0] if len(seg) else np.nan
    return out


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for ascending values, without a sort."""
    if not len(values):
        return values, np.zeros(0, dtype=np.int64)
    new = np.empty(len(values), dtype=bool)
    new[0] = True
    np.not_equal(values[1:], values[:-1], out=new[1:])
    return values[new], np.cumsum(new) - 1


class RobustSnapshots:
    """:class:`RollingRobust` as the detectors use it: ``level()`` is called before the
    i-th addition for every i from ``first`` on, so the snapshot read at i was taken at
    ``first + refresh * ((i - first) // refresh)`` over the ``window`` values before it.
    Medians are computed only for the snapshots asked for."""

    def __init__(self, x: np.ndarray, window: int, first: int, refresh: int) -> None:
        self.x = x
        self.window = window
        self.first = first
        self.refresh = refresh

    @property
    def calls(self) -> np.ndarray:
        """Every call, in order (the values from ``first`` on)."""
        m = len(self.x)
        return np.arange(self.first, m) if self.first < m else np.zeros(0, dtype=np.int64)

    def above_floor(
        self, bound: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The calls whose value is not below ``bound(floor)`` (less a hair of margin for
        rounding), ``floor`` being the minimum of the snapshot's window read there, and
        their values: the few calls a rule growing with the median can fire at (the
        median is at least that minimum). ``bound`` is elementwise. The floors and
        bounds are taken once per snapshot (every ``refresh`` calls share one) and
        compared with the calls' values block by block, so no array of a value per
        call is made but the answer."""
        m, first, r = len(self.x), self.first, self.refresh
        if first >= m:
            return np.zeros(0, dtype=np.int64), self.x[:0]
        k = m - first
        snaps = first + r * np.arange(-(-k // r))
        b = bound(window_reduce(self.x, snaps, self.window, "min"))
        limit = b - 1e-9 * np.abs(b)
        v = self.x[first:]
        below = np.empty(k, dtype=bool)
        whole = k // r
        np.less(
            v[: whole * r].reshape(whole, r),
            limit[:whole, None],
            out=below[: whole * r].reshape(whole, r),
        )
        if whole * r < k:
            np.less(v[whole * r :], limit[whole], out=below[whole * r :])
        kept = np.flatnonzero(~below)
        return kept + first, v[kept]

    def snapshot(self, calls: np.ndarray) -> np.ndarray:
        """Where the snapshot read at each call was taken (its window ends there)."""
        return self.first + self.refresh * ((calls - self.first) // self.refresh)

    def level_at(self, calls: np.ndarray) -> np.ndarray:
        """The median read at each of ``calls`` (ascending)."""
        uniq, inv = _runs(self.snapshot(calls))
        return window_medians(self.x, uniq, self.window)[inv]

    def sigma_at(self, calls: np.ndarray, medians: np.ndarray) -> np.ndarray:
        """The robust sigma read at ``calls`` (few: the candidates), around their
        ``medians`` (from :meth:`level_at`)."""
        return window_mads(self.x, self.snapshot(calls), self.window, medians)


def rolling_sum(flags: np.ndarray, window: int) -> np.ndarray:
    """Sum of the last ``window`` entries up to and including each index."""
    c = np.cumsum(flags, dtype=np.int64)
    if window <= 0:
        return np.zeros(len(flags), dtype=np.int64)
    out = c.copy()
    out[window:] -= c[:-window]
    return out


def cooldown_pick(steps: np.ndarray, cooldown: int | None, last: int | None = None) -> list[int]:
    """Indices into ``steps`` (ascending candidate steps) that fire under
    :meth:`RuleDetector.can_fire`: the first, then each one ``cooldown`` steps after the
    last that fired (``None``: only the first)."""
    picked: list[int] = []
    i, n = 0, len(steps)
    if last is not None:
        if cooldown is None:
            return []
        i = int(np.searchsorted(steps, last + cooldown, side="left"))
    while i < n:
        picked.append(i)
        if cooldown is None:
            break
        i = int(
            np.searchsorted(steps, int(steps[i]) + cooldown, side="left"),
        )
        if i <= picked[-1]:
            i = picked[-1] + 1
    return picked
