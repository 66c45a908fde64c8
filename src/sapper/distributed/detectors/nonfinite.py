"""X001: a non-finite loss or gradient on any rank, naming the rank where it started."""

from __future__ import annotations

from typing import Any

from sapper.distributed.detectors._common import fmt_ranks, table_of
from sapper.distributed.rules import NONFINITE_ON_RANK
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["NONFINITE_ON_RANK", "NonFiniteRankDetector"]


class NonFiniteRankDetector(Detector):
    """Fires when any rank saw a non-finite loss or gradient norm in the window; the
    finding names the earliest rank(s) (a loss before a gradient at the same step: DDP
    spreads a gradient NaN, a loss NaN is the rank's own). An outbreak is reported once,
    at its start; a clean window re-arms it."""

    rules = (NONFINITE_ON_RANK,)

    def __init__(self) -> None:
        self.reported: list[int] = []  # origin ranks of the last report

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None:
            return []
        loss_at = table.col("nonfinite_loss_step")
        grad_at = table.col("nonfinite_grad_step")
        hits: dict[int, tuple[int, int, str]] = {}  # rank -> (step, order, what)
        for r in range(table.world_size):
            la, ga = loss_at[r], grad_at[r]
            if la is not None and la >= 0:
                hits[r] = (int(la), 0, "loss")
            if ga is not None and ga >= 0 and (r not in hits or int(ga) < hits[r][0]):
                hits[r] = (int(ga), 1, "gradient norm")
        if not hits:
            self.reported = []  # clean window: a new outbreak is reported again
            return []
        if self.reported:  # the same outbreak goes on: reported at its start
            return []
        first = min(v[:2] for v in hits.values())
        origin = sorted(r for r, v in hits.items() if v[:2] == first)
        self.reported = origin
        step, _, what = hits[origin[0]]
        others = sorted(set(hits) - set(origin))
        msg = f"{fmt_ranks(origin)}: {what} became non-finite at step {step}"
        if others:
            later = min(hits[r][0] for r in others)
            msg += (
                f"; then {fmt_ranks(others)} (from step {later}), spread by the gradient all-reduce"
            )
        else:
            msg += f"; the other {table.world_size - len(origin)} rank(s) stayed finite"
        data: dict[str, Any] = {
            "ranks": sorted(hits),
            "first_step": {str(r): v[0] for r, v in sorted(hits.items())},
            "what": {str(r): v[2] for r, v in sorted(hits.items())},
        }
        return [
            NONFINITE_ON_RANK.finding(
                msg, step=step, rank=origin[0], value=float(len(hits)), **data
            )
        ]
