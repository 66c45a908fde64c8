"""The sliding minimum and maximum the vectorised detectors bound their medians with:
polars' rolling window (taken when the reader has imported polars) and the numpy
blocks (taken otherwise) give the same numbers as a direct minimum or maximum of every
window, so a twin's findings do not depend on which one ran."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sapper.logs.columnar.twins import rolling

pl = pytest.importorskip("polars")


def _direct(x: np.ndarray, window: int, acc: np.ufunc) -> np.ndarray:
    view = np.lib.stride_tricks.sliding_window_view(x, window)
    return (np.min if acc is np.minimum else np.max)(view, axis=1)


def _values(seed: int, n: int) -> np.ndarray:
    """Noise with ties, zeros of both signs and infinities (never NaN: the callers
    drop them first)."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=n), int(rng.integers(0, 3)))
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 1e300, -1e300])
    at = rng.random(n) < 0.05
    x[at] = rng.choice(specials, size=int(at.sum()))
    return x


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window", [1, 2, 3, 7, 29, 50, 256, 333])
def test_polars_and_numpy_sliding_agree(
    seed: int, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _values(seed, 2_000 + seed * 37)
    for acc in (np.minimum, np.maximum):
        want = _direct(x, window, acc)
        assert np.array_equal(rolling._doubling(x, window, acc), want)
        monkeypatch.setattr(rolling, "_DOUBLING_MAX", 0)  # polars' pass, then the blocks
        monkeypatch.setitem(sys.modules, "polars", pl)
        fast = rolling._sliding(x, window, acc)
        monkeypatch.delitem(sys.modules, "polars")
        slow = rolling._sliding(x, window, acc)
        monkeypatch.setitem(sys.modules, "polars", pl)
        assert np.array_equal(fast, want)
        assert np.array_equal(slow, want)


@pytest.mark.parametrize("how", ["min", "max"])
def test_window_reduce_matches_each_window(how: str) -> None:
    """Short windows at the start, full ones after, and ends past a window's length."""
    x = _values(11, 5_000)
    ends = np.arange(0, len(x) + 1, 3)
    got = rolling.window_reduce(x, ends, 40, how)
    fn = np.min if how == "min" else np.max
    want = np.array([fn(x[max(0, e - 40) : e]) if e else np.nan for e in ends])
    assert np.array_equal(got, want, equal_nan=True)


def _math_logs(x: np.ndarray) -> np.ndarray:
    import math

    return np.array([math.log(v) for v in x.tolist()], dtype=np.float64)


@pytest.mark.parametrize("n", [10, 5000, 200_000])
def test_exact_log_is_math_log_to_the_last_bit(n: int) -> None:
    """The gradient-norm twin takes the log norms from polars when it can: every value,
    not only the probed ones, is the one ``math.log`` gives (numpy's own logarithm
    is not, for some of these)."""
    rng = np.random.default_rng(n)
    x = np.exp(rng.uniform(-700, 700, n))
    x[: min(n, 4)] = [5e-324, 1e-310, 1.0, 1.7976931348623157e308][: min(n, 4)]
    got = rolling.exact_log(x)
    assert np.array_equal(got.view(np.int64), _math_logs(x).view(np.int64))


def test_exact_log_without_polars_or_when_it_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.abs(np.random.default_rng(5).normal(0.5, 0.2, 10_000)) + 1e-9
    want = _math_logs(x).view(np.int64)
    monkeypatch.delitem(sys.modules, "polars")
    assert np.array_equal(rolling.exact_log(x).view(np.int64), want)
    monkeypatch.setitem(sys.modules, "polars", pl)

    class _Off:  # a polars whose logarithm is off by one bit
        @staticmethod
        def Series(values: np.ndarray) -> object:
            class _S:
                def log(self) -> _S:
                    return self

                def to_numpy(self) -> np.ndarray:
                    return np.nextafter(np.log(values), np.inf)

            return _S()

    monkeypatch.setitem(sys.modules, "polars", _Off)
    assert np.array_equal(rolling.exact_log(x).view(np.int64), want)


@pytest.mark.parametrize("how", ["min", "max"])
@pytest.mark.parametrize("window", [1, 9, 50])
@pytest.mark.parametrize(("start", "stop"), [(0, 1), (3, 700), (9, 2001), (60, 2001), (1990, 2001)])
def test_range_reduce_is_window_reduce_over_the_range(
    how: str, window: int, start: int, stop: int
) -> None:
    x = _values(5, 2000)
    ends = np.arange(start, stop)
    want = rolling.window_reduce(x, ends, window, how)
    got = rolling.range_reduce(x, start, stop, window, how)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("refresh", [1, 4, 7])
@pytest.mark.parametrize("first", [1, 10, 1999, 2500])
def test_calls_above_the_floor_are_those_the_per_call_floor_keeps(refresh: int, first: int) -> None:
    """The floors and bounds taken once per snapshot keep exactly the calls that the
    floor read at each call keeps."""
    x = np.abs(_values(first, 2000)) + 0.5
    snaps = rolling.RobustSnapshots(x, 50, first, refresh)
    calls = snaps.calls
    uniq = np.unique(snaps.snapshot(calls))
    floor = rolling.window_reduce(x, uniq, 50, "min")[np.searchsorted(uniq, snaps.snapshot(calls))]
    bound = floor + 0.1 * np.abs(floor)
    keep = ~(x[calls] < bound - 1e-9 * np.abs(bound))
    got_calls, got_values = snaps.above_floor(lambda lo: lo + 0.1 * np.abs(lo))
    assert np.array_equal(got_calls, calls[keep])
    assert np.array_equal(got_values, x[calls][keep])
    if first < 100:  # many calls: the floor rules most out, not all
        assert 0 < len(got_calls) < len(calls)


@pytest.mark.parametrize("n", [1, 2, 5, 64, 65])
def test_doubling_over_windows_as_long_as_the_values(n: int) -> None:
    x = _values(n, n)
    for window in {1, max(1, n // 2), n}:
        for acc in (np.minimum, np.maximum):
            assert np.array_equal(rolling._doubling(x, window, acc), _direct(x, window, acc))
