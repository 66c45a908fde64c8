"""X009: ranks that reach sapper's exchange at different training steps."""

from __future__ import annotations

from sapper.distributed.detectors._common import fmt_ranks, table_of
from sapper.distributed.rules import RANKS_OUT_OF_STEP
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["RANKS_OUT_OF_STEP", "StepSkewDetector"]


class StepSkewDetector(Detector):
    """Fires once when the ranks' step numbers at one exchange disagree: the job's max
    and min step differ. The step most ranks hold is the common one; the finding names
    the rank at the other extreme (and how many share it), from the reduced statistics,
    so it reads the same at 4 ranks and at 16,384."""

    rules = (RANKS_OUT_OF_STEP,)

    def __init__(self) -> None:
        self.fired = False

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None or self.fired:
            return []
        s = table.job().col("step")
        if not s.finite or s.max == s.min:
            return []
        self.fired = True
        at_max = s.n_max >= s.n_min
        common, odd_step = (s.max, s.min) if at_max else (s.min, s.max)
        n_common = s.n_max if at_max else s.n_min
        odd_rank = s.argmin if at_max else s.argmax
        n_odd = s.finite - n_common
        others = f" and {n_odd - 1} other rank(s)" if n_odd > 1 else ""
        msg = (
            f"{fmt_ranks([odd_rank])}{others} reached the exchange at another step than the "
            f"{n_common} rank(s) at step {int(common)}: rank {odd_rank} at step {int(odd_step)}"
        )
        return [
            RANKS_OUT_OF_STEP.finding(
                msg,
                step=int(common),
                rank=odd_rank,
                value=float(abs(s.max - s.min)),
                ranks=[odd_rank],
                off_step=n_odd,
            )
        ]
