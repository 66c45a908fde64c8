"""X001: a non-finite loss or gradient on any rank, naming the rank where it started."""

from __future__ import annotations

import math
import statistics
from typing import Any

from sapper.distributed.detectors._common import fmt_ranks, table_of
from sapper.distributed.rules import NONFINITE_ON_RANK
from sapper.distributed.table import RankTable
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["NONFINITE_ON_RANK", "NonFiniteRankDetector"]

#: A rank's value this many times the median of the others is its own outbreak.
OUTLIER_RATIO = 1e3
#: Per-rank "first non-finite step" columns, strongest first, with the finding's words.
_FIRST = (
    ("local_grad_nonfinite_step", "its local gradient norm before the all-reduce was"),
    ("output_nonfinite_step", "its model output was"),
)
#: Per-rank magnitudes (before the first non-finite value): an outlier is evidence too.
_EVIDENCE = (
    ("local_grad_norm", "its local gradient norm before the all-reduce peaked at"),
    ("loss_peak", "its loss was"),
    ("output_absmax", "its largest |output| was"),
)


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
        step, _, what = hits[origin[0]]
        tied = len(origin)
        others = sorted(set(hits) - set(origin))
        origin, evidence = _attribute(table, origin, step)
        self.reported = origin
        if len(origin) < tied:  # the all-reduce made them equal; their own numbers did not
            msg = (
                f"{fmt_ranks(origin)} first: {what} became non-finite at step {step} on "
                f"{tied} ranks at once (the gradient all-reduce spreads one rank's overflow)"
            )
        else:
            msg = f"{fmt_ranks(origin)}: {what} became non-finite at step {step}"
        if evidence:
            msg += "; " + evidence
        if others:
            later = min(hits[r][0] for r in others)
            msg += (
                f"; then {fmt_ranks(others)} (from step {later}), spread by the gradient all-reduce"
            )
        elif tied == len(origin):
            msg += f"; the other {table.world_size - len(origin)} rank(s) stayed finite"
        data: dict[str, Any] = {
            "ranks": sorted(hits),
            "first_step": {str(r): v[0] for r, v in sorted(hits.items())},
            "what": {str(r): v[2] for r, v in sorted(hits.items())},
            "origin": origin,
            "evidence": _evidence_data(table, origin),
        }
        return [
            NONFINITE_ON_RANK.finding(
                msg, step=step, rank=origin[0], value=float(len(hits)), **data
            )
        ]


def _others_median(col: list[float | None], rank: int, ranks: range) -> float | None:
    vals = sorted(
        v for r in ranks if r != rank and (v := col[r]) is not None and math.isfinite(v)
    )
    return statistics.median(vals) if vals else None


def _stands_out(v: float | None, median: float | None) -> bool:
    """Non-finite, or ``OUTLIER_RATIO`` times the other ranks' (finite) median."""
    if v is None:
        return False
    if not math.isfinite(v):
        return median is not None
    return median is not None and abs(v) > OUTLIER_RATIO * max(abs(median), 1e-30)


def _earliest(col: list[float | None], among: list[int], step: int) -> list[int]:
    """The ranks of ``among`` that went non-finite in ``col`` (a step column) first, by
    ``step``, when some others of them did so later or not at all."""
    at = {r: int(v) for r in among if (v := col[r]) is not None and 0 <= v <= step}
    if not at:
        return []
    first = min(at.values())
    early = [r for r in among if at.get(r) == first]
    return early if len(early) < len(among) else []


def _attribute(table: RankTable, origin: list[int], step: int) -> tuple[list[int], str]:
    """Among ``origin`` (ranks non-finite at the same first step), the ranks whose own
    numbers — taken before the all-reduce — went first or stand out, and the words."""
    ranks = range(table.world_size)
    picked = origin
    for name, _ in _FIRST:
        early = _earliest(table.col(name), origin, step)
        if early:
            picked = early
            break
    else:
        for name, _ in _EVIDENCE:
            col = table.col(name)
            odd = [r for r in origin if _stands_out(col[r], _others_median(col, r, ranks))]
            if 0 < len(odd) < len(origin):
                picked = odd
                break
    return picked, _evidence_text(table, picked, step)


def _evidence_text(table: RankTable, picked: list[int], step: int) -> str:
    if len(picked) != 1:
        return ""
    r = picked[0]
    ranks = range(table.world_size)
    others = [o for o in ranks if o != r]
    parts = []
    for name, words in _FIRST:
        col = table.col(name)
        mine = col[r]
        if mine is None or not 0 <= mine <= step:
            continue
        later = sorted({int(v) for o in others if (v := col[o]) is not None and v > mine})
        never = [o for o in others if col[o] is not None and col[o] < 0]
        if not later and not never:
            continue
        rest = f"the others' from step {later[0]}" if later else "the others' finite"
        parts.append(f"{words} non-finite at step {int(mine)} ({rest})")
    for name, words in _EVIDENCE:
        col = table.col(name)
        median = _others_median(col, r, ranks)
        if _stands_out(col[r], median):
            parts.append(f"{words} {col[r]:.3g} vs a median {median:.3g} on the others")
    return "; ".join(parts)


def _evidence_data(table: RankTable, ranks: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _ in (*_FIRST, *_EVIDENCE):
        col = table.col(name)
        if any(v is not None for v in col):
            out[name] = {str(r): col[r] for r in range(table.world_size) if col[r] is not None}
    return out
