"""X009: ranks that reach sapper's exchange at different training steps."""

from __future__ import annotations

from collections import Counter

from sapper.distributed.detectors._common import fmt_ranks, table_of
from sapper.distributed.rules import RANKS_OUT_OF_STEP
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["RANKS_OUT_OF_STEP", "StepSkewDetector"]


class StepSkewDetector(Detector):
    """Fires once when the ranks' step numbers at one exchange disagree."""

    rules = (RANKS_OUT_OF_STEP,)

    def __init__(self) -> None:
        self.fired = False

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None or self.fired:
            return []
        steps = {r: int(s) for r, s in enumerate(table.col("step")) if s is not None}
        counts = Counter(steps.values())
        if len(counts) < 2:
            return []
        self.fired = True
        common = counts.most_common(1)[0][0]
        odd = sorted(r for r, s in steps.items() if s != common)
        detail = ", ".join(f"rank {r} at step {steps[r]}" for r in odd[:8])
        msg = (
            f"{fmt_ranks(odd)} reached the exchange at another step than the "
            f"{counts[common]} rank(s) at step {common}: {detail}"
        )
        return [
            RANKS_OUT_OF_STEP.finding(
                msg,
                step=common,
                rank=odd[0],
                value=float(max(abs(steps[r] - common) for r in odd)),
                ranks=odd,
            )
        ]
