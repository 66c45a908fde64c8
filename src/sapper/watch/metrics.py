"""The five metrics of seed §5.2 as a watch shows them: latest value and a sparkline.

Loss, gradient norm, learning rate, memory and throughput are what an engineer checks
in the first few hundred steps. Each keeps its latest value (with its step) and a
bounded window of recent values; the sparkline summarizes that window in a fixed number
of cells (the worst value of each cell, so a spike or a NaN is never averaged away).
Throughput is read as logged (tokens/s, samples/s) or derived from the tokens or samples
of a step and its time; memory prefers the peak, then reserved, then allocated.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sapper.runtime.detectors.base import fmt
from sapper.runtime.records import StepRecord

__all__ = ["BARS", "METRICS", "Metric", "MetricBoard", "sparkline"]

BARS = "▁▂▃▄▅▆▇█"
#: Shown for a cell holding a NaN or an infinity.
NONFINITE_BAR = "×"


def _memory(r: StepRecord) -> float | None:
    for value in (r.memory_peak_gib, r.memory_reserved_gib, r.memory_allocated_gib):
        if value is not None:
            return value
    return None


def _throughput(r: StepRecord) -> tuple[float, str] | None:
    if r.tokens_per_s is not None:
        return r.tokens_per_s, "tokens/s"
    if r.samples_per_s is not None:
        return r.samples_per_s, "samples/s"
    if r.step_time_s:
        if r.tokens is not None:
            return r.tokens / r.step_time_s, "tokens/s"
        if r.samples is not None:
            return r.samples / r.step_time_s, "samples/s"
    return None


def _plain(name: str) -> Callable[[StepRecord], tuple[float, str] | None]:
    def read(r: StepRecord) -> tuple[float, str] | None:
        value = getattr(r, name)
        return None if value is None else (value, "")

    return read


def _gib(r: StepRecord) -> tuple[float, str] | None:
    value = _memory(r)
    return None if value is None else (value, "GiB")


#: (label, reader) of the five metrics, in the order seed §5.2 lists them.
METRICS: tuple[tuple[str, Callable[[StepRecord], tuple[float, str] | None]], ...] = (
    ("loss", _plain("loss")),
    ("grad norm", _plain("grad_norm")),
    ("learning rate", _plain("lr")),
    ("memory", _gib),
    ("throughput", _throughput),
)


@dataclass
class Metric:
    """One metric's latest value and recent history."""

    label: str
    values: deque[float] = field(default_factory=lambda: deque(maxlen=600))
    step: int | None = None
    unit: str = ""
    #: Memory limit of the device when the log states it (for "31.8 / 79.6 GiB").
    limit: float | None = None

    @property
    def latest(self) -> float | None:
        return self.values[-1] if self.values else None

    def text(self) -> str:
        if self.latest is None:
            return "N/A"
        text = fmt(self.latest)
        if self.limit:
            text += f" / {fmt(self.limit)}"
        return f"{text} {self.unit}".rstrip()


class MetricBoard:
    """Latest values and history of the five metrics over a stream of records."""

    def __init__(self, history: int = 600) -> None:
        self.metrics = [Metric(label, deque(maxlen=history)) for label, _ in METRICS]
        self._readers = [reader for _, reader in METRICS]
        self.records = 0
        self.last_step: int | None = None

    def update(self, records: Iterable[StepRecord]) -> None:
        """Take a batch of records. Only the newest values fit the bounded history, so
        each metric reads the batch from its end until its history is full: a poll that
        brings thousands of records costs what the history holds, not what was written.
        (Every reader gives a unit always or never, so the newest value's unit is the
        one the batch leaves.)"""
        batch = records if isinstance(records, list) else list(records)
        if not batch:
            return
        self.records += len(batch)
        self.last_step = batch[-1].step
        for metric, read in zip(self.metrics, self._readers, strict=True):
            room = metric.values.maxlen
            newest: list[float] = []
            for rec in reversed(batch):
                got = read(rec)
                if got is None:
                    continue
                value, unit = got
                if not newest:
                    metric.step = rec.step
                    if unit:
                        metric.unit = unit
                newest.append(float(value))
                if room is not None and len(newest) >= room:
                    break
            metric.values.extend(reversed(newest))
        for rec in reversed(batch):
            if rec.memory_limit_gib:
                self.metrics[3].limit = rec.memory_limit_gib
                break

    def summary(self) -> str:
        """One line: every metric's latest value (``N/A`` when the log has none)."""
        return ", ".join(f"{m.label} {m.text()}" for m in self.metrics)


def sparkline(values: Iterable[float], width: int = 32) -> str:
    """``values`` in ``width`` cells of block characters (min to max of the finite ones);
    each cell shows its largest value, or ``×`` when it holds a NaN or an infinity."""
    data = list(values)
    if not data:
        return ""
    cells = min(width, len(data))
    size = len(data) / cells
    worst: list[float] = []
    for i in range(cells):
        chunk = data[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)]
        bad = [v for v in chunk if not math.isfinite(v)]
        worst.append(bad[0] if bad else max(chunk))
    finite = [v for v in worst if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    span = hi - lo
    out = []
    for v in worst:
        if not math.isfinite(v):
            out.append(NONFINITE_BAR)
        elif span <= 0:
            out.append(BARS[len(BARS) // 2])
        else:
            out.append(BARS[min(len(BARS) - 1, int((v - lo) / span * len(BARS)))])
    return "".join(out)
