"""The detectors' incremental statistics against a straightforward recomputation.

The loss, gradient-norm, throughput and memory detectors keep sorted windows, a lazily
computed robust sigma and running counts so that a record costs O(log n). These tests
recompute every statistic from scratch with ``statistics.median`` on random streams with
spikes, oscillation bursts and leaks, and require the same findings, message for message.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import deque

import pytest

from sapper.runtime.detector import DetectorSet
from sapper.runtime.detectors.gradnorm import GradNormDetector
from sapper.runtime.detectors.loss import LossDetector
from sapper.runtime.detectors.memory import MemoryDetector
from sapper.runtime.detectors.stats import (
    MAD_TO_SIGMA,
    RollingRobust,
    SortedWindow,
    theil_sen_slope,
)
from sapper.runtime.detectors.throughput import ThroughputDetector
from sapper.runtime.records import StepRecord


def spiky(rng: random.Random, n: int) -> list[float]:
    """Noise with ties, a drift, and rare spikes both ways."""
    out = []
    for i in range(n):
        v = round(2.0 + math.exp(-i / 200) + rng.gauss(0, 0.05), 3)
        if rng.random() < 0.03:
            v *= rng.choice([0.2, 1.15, 1.25, 1.5, 3.0, 20.0])
        out.append(v)
    return out


@pytest.mark.parametrize("size", [1, 2, 5, 50])
def test_sorted_window_median_is_the_window_median(size: int) -> None:
    rng = random.Random(size)
    window = SortedWindow(size)
    recent: deque[float] = deque(maxlen=size)
    for v in spiky(rng, 600):
        window.add(v)
        recent.append(v)
        assert len(window) == len(recent)
        assert window.median() == statistics.median(recent)
        assert window.sorted == sorted(recent)


@pytest.mark.parametrize(("size", "refresh"), [(10, 1), (50, 4), (7, 3)])
def test_rolling_robust_is_the_recomputed_median_and_mad(size: int, refresh: int) -> None:
    rng = random.Random(refresh)
    robust = RollingRobust(size, refresh=refresh)
    recent: deque[float] = deque(maxlen=size)
    since, expected = refresh, (math.nan, math.nan)
    for v in spiky(rng, 800):
        robust.add(v)
        recent.append(v)
        since += 1
        if rng.random() < 0.5:  # detectors ask only on some records
            continue
        if since >= refresh:
            med = statistics.median(recent)
            expected = (med, MAD_TO_SIGMA * statistics.median(abs(x - med) for x in recent))
            since = 0
        assert robust.level() == expected[0]
        if rng.random() < 0.5:
            assert robust.sigma() == expected[1]
        assert robust.stats() == expected


class NaiveRolling:
    """What RollingRobust replaced: sort the whole window at every refresh."""

    def __init__(self, window: int, refresh: int = 4) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.refresh, self.since = refresh, refresh
        self.cached = (math.nan, math.nan)

    def __len__(self) -> int:
        return len(self.values)

    def add(self, value: float) -> None:
        self.values.append(value)
        self.since += 1

    def stats(self) -> tuple[float, float]:
        if self.since >= self.refresh:
            med = statistics.median(self.values)
            self.cached = (med, MAD_TO_SIGMA * statistics.median(abs(v - med) for v in self.values))
            self.since = 0
        return self.cached

    def level(self) -> float:
        return self.stats()[0]

    def sigma(self) -> float:
        return self.cached[1]


class NaiveWindow(deque):
    def add(self, value: float) -> None:
        self.append(value)

    def median(self) -> float:
        return statistics.median(self)


class NaiveLoss(LossDetector):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.reference = NaiveRolling(self.window)

    def _spike(self, loss: float, step: int) -> list:
        if len(self.reference) < self.min_history:
            return []
        med, sigma = self.reference.stats()
        k = self.spike_k * (2.0 if step < self.warmup_steps else 1.0)
        margin = max(k * sigma, self.spike_rel * abs(med))
        if loss <= med + margin:
            return []
        return self.fire(self.rules[1], step, f"spike {med} {sigma}", value=loss)

    def _oscillation(self, step: int) -> list:
        xs = list(self.recent)[-self.osc_window :]
        diffs = [b - a for a, b in itertools.pairwise(xs)]
        flips = sum(1 for a, b in itertools.pairwise(diffs) if a * b < 0)
        flip_share = flips / max(1, len(diffs) - 1)
        level = abs(statistics.median(xs))
        amplitude = statistics.median([abs(d) for d in diffs]) / level if level else 0.0
        if flip_share < self.osc_flips or amplitude < self.osc_amplitude:
            return []
        return self.fire(
            self.rules[3], step, f"{len(xs)} {flip_share} {amplitude} {level}", value=amplitude
        )


class NaiveGradNorm(GradNormDetector):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.log_norms = NaiveRolling(self.surge_window)

    def _surge(self, gn: float, log_gn: float, step: int, record: StepRecord) -> list:
        med, sigma = self.log_norms.stats()
        k = self.surge_k * (2.0 if step < self.warmup_steps else 1.0)
        if math.log(gn) <= med + max(k * sigma, math.log(self.surge_ratio)):
            return []
        return self.fire(self.rules[3], step, f"surge {med} {sigma}", value=gn)

    def _tiny(self, step: int) -> list:
        if len(self.norms) < self.tiny_window:
            return []
        med = statistics.median(self.norms)
        if med >= self.tiny:
            return []
        return self.fire(self.rules[2], step, f"tiny {med}", value=med)

    def _saturation(self, record: StepRecord, gn: float, step: int) -> list:
        threshold = record.clip_threshold or self.clip_threshold
        if not threshold or threshold <= 0:
            return []
        if step - (self.first_step or 0) < max(self.skip_first, self.warmup_steps):
            return []
        self.clipped.append(gn > threshold)
        self.clip_ratios.append(gn / threshold)
        if len(self.clipped) < self.saturate_window:
            return []
        share = sum(self.clipped) / len(self.clipped)
        if share < self.saturate_share or statistics.median(self.clip_ratios) < self.saturate_ratio:
            return []
        return self.fire(self.rules[1], step, f"clipped {share}", value=share)


class NaiveThroughput(ThroughputDetector):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.times = NaiveRolling(self.times.values.maxlen)
        self.rates = NaiveWindow(maxlen=self.rates.values.maxlen)
        self.recent_rates = NaiveWindow(maxlen=self.smooth)

    def _outlier(self, record: StepRecord) -> list:
        t = record.step_time_s
        if t is None or not math.isfinite(t) or t <= 0:
            return []
        enough = len(self.times) >= self.min_records
        med, sigma = self.times.stats() if enough else (0.0, 0.0)
        self.times.add(t)
        if not enough or t <= max(med + self.outlier_k * sigma, self.outlier_ratio * med):
            return []
        if self.last_outlier is not None and record.step - self.last_outlier < 50:
            return []
        self.last_outlier = record.step
        return self.fire(self.rules[3], record.step, f"outlier {med} {sigma}", value=t)

    def _slow_now(self) -> tuple[bool, float, float]:
        ref, now = statistics.median(self.early), statistics.median(self.recent_rates)
        bar = self.degrade if not self.slow_episode.ongoing else 0.5 * (1.0 + self.degrade)
        return now < bar * ref, ref, now


class NaiveMemory(MemoryDetector):
    def _growth(self, step: int, limit: float | None) -> list:
        pts = list(self.series)
        if len(pts) < self.growth_min_points or pts[-1][0] - pts[0][0] < self.growth_min_steps:
            return []
        values = [v for _, v in pts]
        share = sum(b > a for a, b in itertools.pairwise(values)) / (len(values) - 1)
        growth = values[-1] - values[0]
        if (
            share < self.growth_rising_share
            or growth < self.growth_min_gib
            or growth < self.growth_min_rel * values[0]
        ):
            return []
        slope = theil_sen_slope([s for s, _ in pts], values)
        if not slope > 0:
            return []
        return self.fire(self.rules[1], step, f"growth {share}", value=slope)


def stream(seed: int, n: int = 2500) -> list[StepRecord]:
    rng = random.Random(seed)
    losses = spiky(rng, n)
    out, mem = [], 10.0
    for i, loss in enumerate(losses):
        if 500 < i < 700:  # an oscillating stretch
            loss *= 1.6 if i % 2 else 0.6
        if rng.random() < 0.003:
            loss = math.nan
        gn = abs(0.5 + rng.gauss(0, 0.1)) * (2e-3 if 900 < i < 1000 else 1.0)
        if rng.random() < 0.02:
            gn *= rng.choice([4.0, 30.0, 0.0])
        if 1200 < i < 1500:  # clipping saturates: 90% of the norms above 2× the threshold
            gn *= 5.0
            mem += rng.choice([0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.0, -0.01])
        t = 0.2 + rng.random() * 0.01 + (i / 3000 if i > 1600 else 0.0)
        if rng.random() < 0.01:
            t *= rng.choice([2.0, 5.0, 30.0])
        out.append(StepRecord(step=i, loss=loss, grad_norm=gn, clip_threshold=1.0,
                              memory_allocated_gib=round(mem, 4), step_time_s=t,
                              tokens=4096, tokens_per_s=4096 / t))
    return out


def _keys(found: list) -> list[tuple[str, int | None]]:
    return [(f.code, f.step) for f in found]


@pytest.mark.parametrize("seed", range(4))
def test_detectors_find_what_a_full_recomputation_finds(seed: int) -> None:
    records = stream(seed)
    kw_loss = {"window": 30 + 10 * seed, "warmup_steps": 50 * seed}
    kw_grad = {"surge_window": 20 + 10 * seed, "warmup_steps": 50 * seed}
    kw_tp = {"window": 10 + 5 * seed, "expected_tokens_per_s": 25000.0}
    pairs = [
        (LossDetector(**kw_loss), NaiveLoss(**kw_loss)),
        (GradNormDetector(**kw_grad), NaiveGradNorm(**kw_grad)),
        (ThroughputDetector(**kw_tp), NaiveThroughput(**kw_tp)),
        (MemoryDetector(window=32 + 16 * seed), NaiveMemory(window=32 + 16 * seed)),
    ]
    for fast, naive in pairs:
        fast.cooldown = naive.cooldown = 0  # every record that crosses a threshold fires
        got, want = DetectorSet([fast]).run(records), DetectorSet([naive]).run(records)
        assert want, type(fast).__name__  # the stream exercises every detector
        assert _keys(got) == _keys(want), type(fast).__name__
        for g, w in zip(got, want, strict=True):
            assert g.value == w.value or (math.isnan(g.value) and math.isnan(w.value))


DETECTORS = [LossDetector, GradNormDetector, ThroughputDetector, MemoryDetector]


@pytest.mark.parametrize("cls", DETECTORS)
def test_running_counts_travel_with_the_state(cls: type) -> None:
    """A detector restored from ``state_dict`` mid-stream finds what an uninterrupted one
    finds: the running counts are part of the state."""
    records = stream(7)
    whole = cls()
    whole.cooldown = 0
    want = DetectorSet([whole]).run(records)
    first = cls()
    first.cooldown = 0
    got = [f for r in records[:1300] for f in first.update(r)]
    resumed = cls()
    resumed.load_state_dict(first.state_dict())
    got += DetectorSet([resumed]).run(records[1300:])
    assert _keys(got) == _keys(want)
