"""Throughput (seed §5.1 item 7, §5.2): below expectation, degrading, waiting for data,
step-time outliers.

Step time is wall time from one step to the next, data wait included; the data wait is
the time the loop spent between the end of one step and the start of the next forward
(fetching the batch). The first ``warmup_steps`` are skipped: allocation, compilation
and caches make them slow on every healthy run.
"""

from __future__ import annotations

import math
from collections import deque

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import RollingRobust, SortedWindow, median
from sapper.runtime.records import StepRecord

__all__ = [
    "DATA_WAIT",
    "STEP_OUTLIER",
    "THROUGHPUT_DEGRADING",
    "THROUGHPUT_LOW",
    "ThroughputDetector",
]

THROUGHPUT_LOW = register(
    Rule(
        code="R060",
        name="throughput-below-plan",
        check="throughput",
        severity=Severity.WARNING,
        title="Throughput is far below what the plan expects",
        why="""\
A run much slower than its estimate is losing time to communication that crosses slow
links (TP across nodes), a starved data pipeline, host-device syncs in the loop,
recomputation nobody asked for or a fallback kernel; the budget runs out before the
tokens do.""",
        signs="""\
tokens/s (or MFU) well below the estimate from the first hundred steps on; GPU
utilisation below ~90%.""",
        fix="""\
Profile one step (torch.profiler): communication → keep TP inside the node; data → more
loader workers, pinned memory, prefetch; syncs → remove .item() from the hot loop.""",
        seed="§4.4, §5.2",
    )
)

THROUGHPUT_DEGRADING = register(
    Rule(
        code="R061",
        name="throughput-degrading",
        check="throughput",
        severity=Severity.WARNING,
        title="Throughput degrades over the run",
        why="""\
A step that gets slower with time points at growth somewhere: memory fragmentation and
allocator retries near the limit, a Python-side list or log that grows every step, a
thermally throttled or failing GPU, a slower node in a collective.""",
        signs="""\
tokens/s falling steadily from its early level; step time creeping up; allocator retries.""",
        fix="""\
Compare early and late profiles; check torch.cuda.memory_stats()['num_alloc_retries'],
GPU clocks and temperatures, and per-rank step times.""",
        seed="§5.2",
    )
)

DATA_WAIT = register(
    Rule(
        code="R062",
        name="data-loader-bottleneck",
        check="throughput",
        severity=Severity.WARNING,
        title="A large share of each step is spent waiting for data",
        why="""\
While the loop waits for the next batch the accelerator idles; the data pipeline, not
the model, sets the speed (checklist item 7).""",
        signs="""\
Data-wait time a large fraction of the step time; GPU utilisation dropping in bursts.""",
        fix="""\
Raise DataLoader num_workers, use pin_memory and persistent_workers, prefetch, move
tokenisation offline (pre-tokenised shards), read from local disk.""",
        seed="§5.1, §5.2",
    )
)

STEP_OUTLIER = register(
    Rule(
        code="R063",
        name="step-time-outlier",
        check="throughput",
        severity=Severity.INFO,
        title="A step took far longer than the others",
        why="""\
Isolated slow steps are checkpoint saves, evaluation, garbage collection or a straggler
rank; they are harmless when rare and expected, a sign of contention when frequent.""",
        signs="""\
A step time many robust standard deviations above the median step time.""",
        fix="""\
Check what ran at that step (checkpoint, eval, gc); if unexpected, look for a straggler
node or shared-filesystem stalls.""",
        seed="§5.2",
    )
)


def _rate(record: StepRecord) -> tuple[float, str] | None:
    if record.tokens_per_s is not None:
        return record.tokens_per_s, "tokens/s"
    t = record.step_time_s
    if record.tokens is not None and t:
        return record.tokens / t, "tokens/s"
    if record.samples_per_s is not None:
        return record.samples_per_s, "samples/s"
    if record.samples is not None and t:
        return record.samples / t, "samples/s"
    if t:
        return 1.0 / t, "steps/s"
    return None


class ThroughputDetector(RuleDetector):
    """R060-R063 over step times, data-wait times and tokens/samples per second."""

    name = "throughput"
    rules = (THROUGHPUT_LOW, THROUGHPUT_DEGRADING, DATA_WAIT, STEP_OUTLIER)
    cooldown = 500

    def __init__(
        self,
        *,
        expected_tokens_per_s: float | None = None,
        expected_samples_per_s: float | None = None,
        below: float = 0.7,
        warmup_steps: int = 5,
        window: int = 20,
        min_records: int = 8,
        degrade: float = 0.7,
        degrade_window: int = 50,
        data_share: float = 0.25,
        outlier_k: float = 10.0,
        outlier_ratio: float = 3.0,
        outlier_cooldown: int = 50,
    ) -> None:
        super().__init__()
        self.expected = {"tokens/s": expected_tokens_per_s, "samples/s": expected_samples_per_s}
        self.below = below
        self.warmup_steps = warmup_steps
        self.min_records = min_records
        self.degrade = degrade
        self.data_share = data_share
        self.outlier_k = outlier_k
        self.outlier_ratio = outlier_ratio
        self.outlier_cooldown = outlier_cooldown
        self.first_step: int | None = None
        self.degrade_window = degrade_window
        self.early: list[float] = []
        self.late = SortedWindow(degrade_window)
        self.early_median: float | None = None
        self.rate_count = 0
        self.early_unit: str | None = None
        self.rates = SortedWindow(window)
        self.times = RollingRobust(max(window, 50))
        self.waits: deque[tuple[float, float]] = deque(maxlen=window)
        self.last_outlier: int | None = None

    def update(self, record: StepRecord) -> list[Finding]:
        if self.first_step is None:
            self.first_step = record.step
        if record.step - self.first_step < self.warmup_steps:
            return []
        out = self._outlier(record)
        if record.data_time_s is not None:
            out += self._data_wait(record)
        rate = _rate(record)
        if rate is None or not math.isfinite(rate[0]) or rate[0] <= 0:
            return out
        value, unit = rate
        if self.early_unit is None:
            self.early_unit = unit
        if unit != self.early_unit:
            return out
        self.rates.add(value)
        self.late.add(value)
        self.rate_count += 1
        if len(self.early) < self.degrade_window:
            self.early.append(value)
        if self.expected.get(unit):
            out += self._below(record.step, unit)
        if self.rate_count >= 3 * self.degrade_window:
            out += self._degrading(record.step, unit)
        return out

    def _below(self, step: int, unit: str) -> list[Finding]:
        expected = self.expected.get(unit)
        if not expected or len(self.rates) < self.min_records:
            return []
        now = self.rates.median()
        if now >= self.below * expected:
            return []
        return self.fire(
            THROUGHPUT_LOW,
            step,
            f"median throughput {fmt(now)} {unit} over the last {len(self.rates)} logged "
            f"steps is {fmt(100 * now / expected)}% of the expected {fmt(expected)} {unit}",
            value=now,
            threshold=self.below * expected,
        )

    def _degrading(self, step: int, unit: str) -> list[Finding]:
        """The median of the last ``degrade_window`` rates against the first ones, once
        the two windows no longer overlap (a slow drift, not a noisy minute)."""
        n = self.degrade_window
        if self.rate_count < 3 * n:
            return []
        if self.early_median is None:  # the early window is full and fixed by now
            self.early_median = median(self.early)
        ref, now = self.early_median, self.late.median()
        if now >= self.degrade * ref:
            return []
        return self.fire(
            THROUGHPUT_DEGRADING,
            step,
            f"throughput fell from {fmt(ref)} to {fmt(now)} {unit} "
            f"({fmt(100 * (1 - now / ref))}% slower than the first {n} logged steps)",
            value=now,
            threshold=self.degrade * ref,
            early=ref,
        )

    def _data_wait(self, record: StepRecord) -> list[Finding]:
        d, t = record.data_time_s, record.step_time_s
        if d is None or t is None or t <= 0 or not (math.isfinite(d) and math.isfinite(t)):
            return []
        self.waits.append((d, t))
        if len(self.waits) < self.min_records:
            return []
        share = sum(w for w, _ in self.waits) / sum(s for _, s in self.waits)
        if share < self.data_share:
            return []
        return self.fire(
            DATA_WAIT,
            record.step,
            f"{fmt(100 * share)}% of the step time of the last {len(self.waits)} logged steps "
            f"was spent waiting for data (threshold {fmt(100 * self.data_share)}%)",
            value=share,
            threshold=self.data_share,
        )

    def _outlier(self, record: StepRecord) -> list[Finding]:
        t = record.step_time_s
        if t is None or not math.isfinite(t) or t <= 0:
            return []
        enough = len(self.times) >= self.min_records
        med = self.times.level() if enough else 0.0
        self.times.add(t)
        if not enough or t <= self.outlier_ratio * med:  # below the smallest possible limit
            return []
        limit = max(med + self.outlier_k * self.times.sigma(), self.outlier_ratio * med)
        if t <= limit:
            return []
        last = self.last_outlier
        if last is not None and record.step - last < self.outlier_cooldown:
            return []
        self.last_outlier = record.step
        self.fired.pop(STEP_OUTLIER.code, None)
        return self.fire(
            STEP_OUTLIER,
            record.step,
            f"step {record.step} took {fmt(t)} s, {fmt(t / med)}× the median {fmt(med)} s",
            value=t,
            threshold=limit,
        )
