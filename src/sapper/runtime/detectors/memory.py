"""Memory (seed §3.1, §5.2): close to the device limit; steady growth (a leak).

The series is the allocator's ``allocated`` on CUDA, else the process RSS (CPU runs and
logs that only have it). A leak is a growth that is both steady (most consecutive
readings rise, a Theil–Sen slope above zero) and large in total; allocator warm-up in
the first steps is skipped, and plateaus (equal readings) do not count as growth.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import theil_sen_slope
from sapper.runtime.records import StepRecord

__all__ = ["MEMORY_GROWTH", "MEMORY_NEAR_LIMIT", "MemoryDetector"]

MEMORY_NEAR_LIMIT = register(
    Rule(
        code="R050",
        name="memory-near-limit",
        check="memory",
        severity=Severity.WARNING,
        title="Memory use is close to the device limit",
        why="""\
Peak memory varies between steps (longer sequences, a different MoE routing, an eval
step, fragmentation): a run at 95% of the device now is an out-of-memory crash later,
often hours in, at a checkpoint save or a long batch.

Frameworks: any; CUDA allocator readings or the process RSS, against the device limit.""",
        signs="""\
The allocator's peak (or reserved) memory above ~90% of the device; cudaMalloc retries in
torch.cuda.memory_stats(); growing fragmentation (reserved ≫ allocated).""",
        fix="""\
Find the dominant part (torch.cuda.memory_summary()): model states → ZeRO / sharding;
activations → checkpointing, a smaller micro-batch; leave ~10% headroom.""",
        seed="§3.1, §5.2",
    )
)

MEMORY_GROWTH = register(
    Rule(
        code="R051",
        name="memory-growth",
        check="memory",
        severity=Severity.WARNING,
        title="Memory grows steadily from step to step (a leak)",
        why="""\
Training memory is periodic: each step allocates and frees the same activations. A
steady growth means something keeps references across steps: a loss accumulated without
.item()/.detach() (it keeps every step's graph), tensors appended to a list for logging,
a cache that never evicts. It ends in an out-of-memory crash.

Frameworks: any; CUDA allocator readings or the process RSS.""",
        signs="""\
Allocated memory (or the process RSS) rising on most readings after the first steps,
at a roughly constant slope.""",
        fix="""\
Detach what you keep (total_loss += loss.detach(), or .item() at log time); clear
lists of tensors; look for growing caches (torch.cuda.memory_snapshot() shows who holds
the memory).""",
        seed="§3.1, §5.2",
    )
)


class MemoryDetector(RuleDetector):
    """R050-R051 over ``memory_*_gib`` / ``rss_gib`` and ``memory_limit_gib``."""

    name = "memory"
    rules = (MEMORY_NEAR_LIMIT, MEMORY_GROWTH)
    cooldown = None

    def __init__(
        self,
        *,
        limit_gib: float | None = None,
        near: float = 0.92,
        warmup_steps: int = 20,
        window: int = 64,
        growth_min_points: int = 8,
        growth_min_steps: int = 20,
        growth_min_gib: float = 0.1,
        growth_min_rel: float = 0.02,
        growth_rising_share: float = 0.75,
    ) -> None:
        super().__init__()
        self.limit_gib = limit_gib
        self.near = near
        self.warmup_steps = warmup_steps
        self.growth_min_points = growth_min_points
        self.growth_min_steps = growth_min_steps
        self.growth_min_gib = growth_min_gib
        self.growth_min_rel = growth_min_rel
        self.growth_rising_share = growth_rising_share
        self.series: deque[tuple[int, float]] = deque(maxlen=window)
        # Whether each reading in the window rose over the one before, with a running
        # count: the rising share is O(1) per record, the window is scanned only when high.
        self.rises: deque[bool] = deque(maxlen=max(0, window - 1))
        self.rise_count = 0
        self.first_step: int | None = None
        self.readings = 0
        self.limit_known = False

    def update(self, record: StepRecord) -> list[Finding]:
        if self.first_step is None:
            self.first_step = record.step
        limit = record.memory_limit_gib or self.limit_gib
        self.limit_known = self.limit_known or bool(limit)
        out = self._near(record, limit)
        value = record.memory_allocated_gib
        if value is None:
            value = record.rss_gib
        if value is None or not math.isfinite(value):
            return out
        self.readings += 1
        if record.step - self.first_step < self.warmup_steps:
            return out
        series = self.series
        if series and self.rises.maxlen:
            rises = self.rises
            if len(rises) == rises.maxlen:
                self.rise_count -= rises[0]
            rise = value > series[-1][1]
            rises.append(rise)
            self.rise_count += rise
        series.append((record.step, value))
        out += self._growth(record.step, limit)
        return out

    def unevaluated(self) -> list[str]:
        """What R050-R051 could not look at: no memory reading, no device limit (R050),
        too few readings for a trend (R051)."""
        if self.readings == 0 and "R050" not in self.fired:
            return ["R050-R051 memory: not evaluated — the log has no memory field"]
        out = []
        if not self.limit_known:
            out.append(
                "R050 memory near limit: not evaluated — no device memory limit "
                "(memory_limit_gib in the log, or the plan's gpu)"
            )
        if len(self.series) < self.growth_min_points:
            out.append(
                f"R051 memory growth: not evaluated — {len(self.series)} memory reading(s) "
                f"past the first steps, needs {self.growth_min_points}"
            )
        return out

    def _near(self, record: StepRecord, limit: float | None) -> list[Finding]:
        if not limit:
            return []
        used = None
        for v in (
            record.memory_peak_gib,
            record.memory_reserved_gib,
            record.memory_allocated_gib,
            record.rss_gib,
        ):
            if v is not None and math.isfinite(v):
                used = v
                break
        if used is None or used / limit < self.near:
            return []
        return self.fire(
            MEMORY_NEAR_LIMIT,
            record.step,
            f"memory {fmt(used)} GiB is {fmt(100 * used / limit)}% of the {fmt(limit)} GiB "
            f"limit (warning above {fmt(100 * self.near)}%)",
            value=used,
            threshold=self.near * limit,
        )

    def _growth(self, step: int, limit: float | None) -> list[Finding]:
        series = self.series
        n = len(series)
        if n < self.growth_min_points or series[-1][0] - series[0][0] < self.growth_min_steps:
            return []
        if n >= 2 and self.rise_count / (n - 1) < self.growth_rising_share:
            return []
        pts = list(series)
        values = [v for _, v in pts]
        rising = sum(1 for a, b in itertools.pairwise(values) if b > a)
        share = rising / (len(values) - 1)
        growth = values[-1] - values[0]
        if (
            share < self.growth_rising_share
            or growth < self.growth_min_gib
            or growth < self.growth_min_rel * values[0]
        ):
            return []
        slope = theil_sen_slope([s for s, _ in pts], values)
        if not (slope > 0):
            return []
        eta = ""
        reached = step + (limit - values[-1]) / slope if limit and values[-1] < limit else None
        if reached is not None and math.isfinite(reached):  # a slope of 1e-300 never does
            eta = f"; at this rate the {fmt(limit)} GiB limit is reached near step "
            eta += str(int(reached))
        return self.fire(
            MEMORY_GROWTH,
            step,
            f"memory grew from {fmt(values[0])} to {fmt(values[-1])} GiB between steps "
            f"{pts[0][0]} and {step} ({fmt(slope * 1024)} MiB/step, rising on "
            f"{fmt(100 * share)}% of readings){eta}",
            value=slope,
            threshold=0.0,
            growth_gib=growth,
        )
