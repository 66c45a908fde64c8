"""X009: ranks that reach sapper's exchange at different training steps."""

from __future__ import annotations

from collections import Counter

from sapper.distributed.detectors._common import fmt_ranks, table_of
from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["RANKS_OUT_OF_STEP", "StepSkewDetector"]

RANKS_OUT_OF_STEP = register(
    Rule(
        code="X009",
        name="ranks-out-of-step",
        check="distributed",
        severity=Severity.WARNING,
        title="Ranks count optimizer steps differently",
        why="""\
Every rank must take the same optimizer steps. A rank whose step counter runs ahead or
behind has skipped or repeated a step (a per-rank early exit, an uneven number of batches
per rank, gradient accumulation counted differently): with collectives in the step it
soon deadlocks on a mismatched all-reduce; without them the ranks silently train
different models.""",
        signs="""\
Ranks log different step numbers at the same moment; the job hangs at the end of an
epoch when one rank runs out of batches first (uneven shards, drop_last=False).""",
        fix="""\
Give every rank the same number of batches (DistributedSampler with drop_last=True, or
pad the last shard); count steps the same way on every rank; under an uneven loader use
DDP's join() context manager.""",
        seed="§5.1 (6), §5.1 (7)",
    )
)


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
