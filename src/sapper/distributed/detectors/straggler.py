"""X002: a rank that is persistently slower than the others (seed §4.1, §5.2 throughput)."""

from __future__ import annotations

from typing import Any

from sapper.distributed.detectors._common import table_of
from sapper.distributed.rules import STRAGGLER_RANK
from sapper.distributed.stats import ColumnStats
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
    """The slowest rank of a metric (the reduced argmax) against the mean of the *other*
    ranks: fires when it is ``min_ratio`` times slower, the excess is at least
    ``min_share`` of the job's mean step and ``min_excess_s``, and the same rank is the
    slowest for ``persist`` exchanges in a row. On a shared machine a healthy rank is
    the slowest now and then, by a ratio that looks large on a millisecond forward; it
    is neither the same rank every time nor a fifth of the step."""

    rules = (STRAGGLER_RANK,)

    def __init__(
        self,
        min_ratio: float = 1.5,
        min_share: float = 0.2,
        min_excess_s: float = 0.005,
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
        job = table.job()
        ref_step = job.col("step_time_s").mean
        out = []
        for metric, words in _METRICS:
            c = job.col(metric)
            hit = self._slowest(c, ref_step)
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
                    self._finding(metric, words, hit, streak, ref_step, table.step, c.finite)
                )
        return out

    def _slowest(self, c: ColumnStats, ref_step: float | None) -> tuple[int, float, float] | None:
        others = c.mean_without_max()
        if others is None or c.n_max > 1 or c.argmax < 0:
            return None
        slow = c.max
        excess = slow - others
        ref = ref_step if ref_step else slow
        ratio = slow / others if others > 0 else float("inf")
        if ratio < self.min_ratio or excess < max(self.min_excess_s, self.min_share * ref):
            return None
        return c.argmax, slow, others

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
            f"rank {rank} is a straggler in {words}: {slow:.4g} s per step vs a mean of "
            f"{median:.4g} s on the other {n - 1} rank(s) ({times} slower, +{excess:.3g} s), "
            f"at {streak[1]} exchanges in a row (steps {streak[2]}–{step})"
        )
        data: dict[str, Any] = {
            "metric": metric,
            "seconds": slow,
            "mean_others_s": median,
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
