"""Across restarts: what a blow-up did after the run was resumed from a checkpoint.

The large public runs decided between causes this way by hand (BLOOM's and OPT's
chronicles): resume from a checkpoint before the event and watch the same steps again.

- It comes back **at the same step**: the resumed run reads the same batches in the same
  order, so the data at that position is the suspect (a bad batch).
- It comes back **at another step** (a new seed, other data order) at about the same
  learning rate: the optimisation is unstable at that LR, not one batch.
- It **does not come back** although the resumed run went past that step with the same
  data: a transient fault (hardware, a bit flip), not something the run will hit again.

A resumed attempt that stopped before reaching the step tells nothing and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sapper.diagnose.evidence import RESTART, Evidence
from sapper.logs.analysis import TROUBLE
from sapper.rules.model import Finding, Severity

if TYPE_CHECKING:
    from sapper.logs.analysis import Analysis, AttemptSummary

__all__ = ["RestartVerdict", "restart_verdicts"]

#: Steps either side of the original event within which a recurrence is "the same step",
#: in logging intervals (at least ``MIN_WINDOW`` steps).
WINDOW_INTERVALS = 3
MIN_WINDOW = 10
#: Two learning rates this close (relative) are "the same LR level".
SAME_LR = 0.1


@dataclass(frozen=True)
class RestartVerdict:
    """What one restart says: the cause it points at and the evidence."""

    cause: str
    evidence: Evidence


def _attempt_of(f: Finding) -> int:
    return int(f.data.get("attempt") or 1)


def _lr_at(analysis: Analysis, summary: AttemptSummary, step: int) -> float | None:
    a = summary.attempt
    best = None
    for rec in analysis.log.records[a.start : a.stop]:
        if rec.lr is not None and rec.step <= step:
            best = rec.lr
    return best


def _verdict(
    analysis: Analysis, prev: AttemptSummary, nxt: AttemptSummary, window: int
) -> RestartVerdict | None:
    event = prev.ended_by
    if event is None or event.step is None:
        return None
    s = event.step
    later = [
        f for f in analysis.findings
        if _attempt_of(f) == nxt.attempt.number and f.code in TROUBLE and f.step is not None
    ]
    where = f"{analysis.log.path} (attempts {prev.attempt.number}-{nxt.attempt.number})"
    what = TROUBLE.get(event.code, event.code)
    resumed = f"after resuming from step {nxt.attempt.first_step:,}"
    same = [f for f in later if abs(f.step - s) <= window]  # type: ignore[operator]
    if same:
        again = min(same, key=lambda f: abs(f.step - s))  # type: ignore[operator]
        msg = (f"{what} at step {s:,} came back at step {again.step:,} {resumed}: the same "
               "batches at the same position (unless the data order was changed)")
        return RestartVerdict("bad-data", Evidence(
            event.code, s, where, msg, Severity.WARNING, RESTART))
    if later:
        again = later[0]
        lr_then, lr_now = _lr_at(analysis, prev, s), _lr_at(analysis, nxt, again.step or 0)
        level = ""
        if lr_then and lr_now and abs(lr_now - lr_then) <= SAME_LR * lr_then:
            level = f" at the same learning rate ({lr_now:.3g})"
        msg = (f"{what} at step {s:,} came back {resumed} at another step, "
               f"{again.step:,}{level}: not one batch, the optimisation")
        return RestartVerdict("lr-too-high", Evidence(
            event.code, again.step, where, msg, Severity.WARNING, RESTART))
    if nxt.attempt.last_step >= s + window:
        msg = (f"{what} at step {s:,} did not come back {resumed}, though the run went on "
               f"to step {nxt.attempt.last_step:,}: a transient fault")
        return RestartVerdict("hardware", Evidence(
            event.code, s, where, msg, Severity.WARNING, RESTART))
    return None


def restart_verdicts(analyses: list[Analysis]) -> list[RestartVerdict]:
    """One verdict per restart that followed a blow-up and says something."""
    out: list[RestartVerdict] = []
    for a in analyses:
        window = max(MIN_WINDOW, WINDOW_INTERVALS * (a.interval or 1))
        for prev, nxt in zip(a.attempts, a.attempts[1:], strict=False):
            verdict = _verdict(a, prev, nxt, window)
            if verdict is not None:
                out.append(verdict)
    return out
