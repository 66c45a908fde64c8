"""X003: data-parallel replicas whose parameters are no longer identical."""

from __future__ import annotations

import math
from collections import Counter

from sapper.distributed.detectors._common import fmt_ranks, table_of
from sapper.distributed.rules import REPLICAS_DIVERGED
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["REPLICAS_DIVERGED", "ReplicaDivergenceDetector"]


def _key(v: float) -> str:
    return "nan" if math.isnan(v) else repr(v)


class ReplicaDivergenceDetector(Detector):
    """Compares the parameter fingerprints within each replica group (ranks at the same
    step only); the ranks outside the majority value are named, once."""

    rules = (REPLICAS_DIVERGED,)

    def __init__(self) -> None:
        self.reported: list[int] = []
        #: Last exchange step at which every group agreed.
        self.last_agreed: int | None = None

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None:
            return []
        sums = table.col("checksum")
        steps = table.col("step")
        out: list[Finding] = []
        all_agree = True
        for group in table.param_groups:
            vals = {
                r: sums[r]
                for r in group
                if r < len(sums) and sums[r] is not None and steps[r] == table.step
            }
            if len(vals) < 2:
                continue
            counts = Counter(_key(v) for v in vals.values())
            if len(counts) == 1:
                continue
            all_agree = False
            top, n_top = counts.most_common(1)[0]
            majority = n_top * 2 > len(vals)
            if majority:
                odd = sorted(r for r, v in vals.items() if _key(v) != top)
                ref = float(top)
            else:
                odd = sorted(vals)
                ref = vals[odd[0]]
            new = [r for r in odd if r not in self.reported]
            if not new:
                continue
            self.reported.extend(new)
            params = table.detail.get("replica_params") or {}
            out.append(self._finding(table.step, group, odd, vals, ref, majority, params))
        if all_agree:
            self.last_agreed = table.step
        return out

    def _finding(
        self,
        step: int,
        group: list[int],
        odd: list[int],
        vals: dict[int, float],
        ref: float,
        majority: bool,
        params: dict[str, list[str]],
    ) -> Finding:
        since = f" (they agreed at step {self.last_agreed})" if self.last_agreed is not None else ""
        if majority:
            msg = (
                f"{fmt_ranks(odd)} diverged from the other replicas of "
                f"{fmt_ranks(group)} by step {step}{since}: their full-tensor parameter "
                f"checksums differ (any one changed bit shows)"
            )
        else:
            msg = (
                f"replicas {fmt_ranks(odd)} hold different parameters at step {step}"
                f"{since}, with no majority to say which is right: their full-tensor "
                f"parameter checksums differ"
            )
        named = {str(r): params[str(r)] for r in odd if params.get(str(r))}
        if named:
            against = "the majority" if majority else f"rank {odd[0]}"
            msg += f"; parameters that differ from {against}: " + "; ".join(
                f"rank {r}: {', '.join(ps[:3])}"
                + (f" (+{len(ps) - 3} more)" if len(ps) > 3 else "")
                for r, ps in named.items()
            )
        return REPLICAS_DIVERGED.finding(
            msg,
            step=step,
            rank=odd[0] if majority else None,
            value=float(len(odd)),
            ranks=odd,
            group=group,
            last_agreed_step=self.last_agreed,
            params=named,
        )
