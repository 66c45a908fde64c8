"""X002: a rank that is persistently slower than the others (seed §4.1, §5.2 throughput)."""

from __future__ import annotations

import statistics
from typing import Any

from sapper.distributed.detectors._common import table_of
from sapper.distributed.rules import STRAGGLER_RANK
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["STRAGGLER_RANK", "StragglerDetector"]

#: Metrics compared across ranks, with the words the finding uses.
_METRICS = (
    ("data_time_s", "data wait"),
    ("forward_time_s", "forward time"),
    ("step_time_s", "step time"),
)


class StragglerDetector(Detector):
    """The slowest rank of a metric, against the median of the *other* ranks: fires when
    it is ``min_ratio`` times slower, the excess is at least ``min_share`` of a step (and
    ``min_excess_s``), and the same rank stays slowest for ``persist`` exchanges."""

    rules = (STRAGGLER_RANK,)

    def __init__(
        self,
        min_ratio: float = 1.5,
        min_share: float = 0.05,
        min_excess_s: float = 0.001,
        persist: int = 3,
    ) -> None:
        self.min_ratio = min_ratio
        self.min_share = min_share
        self.min_excess_s = min_excess_s
        self.persist = persist
        #: metric -> [rank, consecutive windows, first step]
        self.streak: dict[str, list[int]] = {}
        #: (metric, rank) already reported (until its streak breaks).
        self.reported: list[str] = []

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None or table.world_size < 2:
            return []
        steps = [v for v in table.col("step_time_s") if v is not None]
        ref_step = statistics.median(steps) if steps else None
        out = []
        for metric, words in _METRICS:
            vals = {r: v for r, v in enumerate(table.col(metric)) if v is not None}
            hit = self._slowest(vals, ref_step)
            streak = self.streak.get(metric)
            if hit is None:
                self.streak.pop(metric, None)
                self.reported = [k for k in self.reported if not k.startswith(metric + ":")]
                continue
            rank = hit[0]
            if streak is None or streak[0] != rank:
                self.reported = [k for k in self.reported if not k.startswith(metric + ":")]
                streak = [
                    rank,
                    0,
                    table.prev_step + 1 if table.prev_step is not None else table.step,
                ]
                self.streak[metric] = streak
            streak[1] += 1
            key = f"{metric}:{rank}"
            if streak[1] >= self.persist and key not in self.reported:
                self.reported.append(key)
                out.append(
                    self._finding(metric, words, hit, streak, ref_step, table.step, len(vals))
                )
        return out

    def _slowest(
        self, vals: dict[int, float], ref_step: float | None
    ) -> tuple[int, float, float] | None:
        if len(vals) < 2:
            return None
        rank = max(vals, key=lambda r: vals[r])
        slow = vals[rank]
        median = statistics.median(v for r, v in vals.items() if r != rank)
        excess = slow - median
        ref = ref_step if ref_step else slow
        ratio = slow / median if median > 0 else float("inf")
        if ratio < self.min_ratio or excess < max(self.min_excess_s, self.min_share * ref):
            return None
        return rank, slow, median

    def _finding(
        self,
        metric: str,
        words: str,
        hit: tuple[int, float, float],
        streak: list[int],
        ref_step: float | None,
        step: int,
        n: int,
    ) -> Finding:
        rank, slow, median = hit
        ratio = slow / median if median > 0 else float("inf")
        excess = slow - median
        times = f"{ratio:.1f}×" if ratio != float("inf") else "far"
        msg = (
            f"rank {rank} is a straggler in {words}: {slow:.4g} s per step vs a median of "
            f"{median:.4g} s on the other {n - 1} rank(s) ({times} slower, +{excess:.3g} s), "
            f"at {streak[1]} exchanges in a row (steps {streak[2]}–{step})"
        )
        data: dict[str, Any] = {
            "metric": metric,
            "seconds": slow,
            "median_s": median,
            "excess_s": excess,
            "windows": streak[1],
        }
        if ref_step and metric != "step_time_s":
            share = min(excess / ref_step, 1.0)
            msg += f"; the others wait about {share:.0%} of each {ref_step:.3g} s step for it"
            data["share_of_step"] = share
        return STRAGGLER_RANK.finding(
            msg,
            step=step,
            rank=rank,
            value=ratio if ratio != float("inf") else None,
            threshold=self.min_ratio,
            **data,
        )
