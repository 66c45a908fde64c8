"""Across restarts: what a blow-up did after the run was resumed from a checkpoint.

The large public runs decided between causes this way by hand (BLOOM's and OPT's
chronicles): resume from a checkpoint before the event and watch the same steps again.

- It comes back **at the same step**: the resumed run reads the same batches in the same
  order, so the data at that position is the suspect (a bad batch).
- It comes back **at another step** (a new seed, other data order) at about the same
  learning rate: the optimisation is unstable at that LR, not one batch.
- It **does not come back** although the resumed run went past that step with the same
  data: a transient fault (hardware, a bit flip), not something the run will hit again.
  With other data (a skipped batch) that tells nothing: the batch or a transient.

A resumed attempt that stopped before reaching the step tells nothing and says so.

Whether the resumed run read the same data is known where the log says which samples
each step read (a sapper run log's ``sample_hashes``): the same samples at the last step
both attempts logged them, at or before the event, make the first and the last verdict
firmer (``VERIFIED``); other samples there make "the same batches" false, so a
recurrence at the same step is then not read as a bad batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sapper.diagnose.evidence import RESTART, Evidence
from sapper.diagnose.onset import series
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
    """What one restart says: the cause it points at and the evidence; ``verified`` when
    the log shows the resumed run read the same samples up to the event."""

    cause: str
    evidence: Evidence
    verified: bool = False


def _hashes(analysis: Analysis, summary: AttemptSummary, step: int) -> dict[int, tuple]:
    a = summary.attempt
    out: dict[int, tuple] = {}
    for rec in analysis.log.records[a.start : a.stop]:
        hashes = rec.extra.get("sample_hashes") if rec.step <= step else None
        if isinstance(hashes, list) and hashes:
            out[rec.step] = tuple(map(str, hashes))
    return out


def _same_data(
    analysis: Analysis, prev: AttemptSummary, nxt: AttemptSummary, step: int
) -> bool | None:
    """Did both attempts read the same samples at the last step both logged them, at or
    before ``step``? ``None`` when the log does not say."""
    before, after = _hashes(analysis, prev, step), _hashes(analysis, nxt, step)
    common = sorted(before.keys() & after.keys())
    if not common:
        return None
    return before[common[-1]] == after[common[-1]]


def _attempt_of(f: Finding) -> int:
    return int(f.data.get("attempt") or 1)


def _lr_at(analysis: Analysis, summary: AttemptSummary, step: int) -> float | None:
    a = summary.attempt
    lrs = [lr for s, lr in series(analysis.log, "lr", a.start, a.stop) if s <= step]
    return lrs[-1] if lrs else None


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
    data = _same_data(analysis, prev, nxt, s)
    checked = " (the same samples, by the log's sample hashes)" if data else ""
    same = [f for f in later if abs(f.step - s) <= window]  # type: ignore[operator]
    if same and data is not False:
        again = min(same, key=lambda f: abs(f.step - s))  # type: ignore[operator]
        msg = (f"{what} at step {s:,} came back at step {again.step:,} {resumed}: the same "
               + ("batches at the same position" + checked if data else
                  "batches at the same position (unless the data order was changed)"))
        return RestartVerdict("bad-data", Evidence(
            event.code, s, where, msg, Severity.WARNING, RESTART), bool(data))
    if later:
        again = later[0]
        lr_then, lr_now = _lr_at(analysis, prev, s), _lr_at(analysis, nxt, again.step or 0)
        level = ""
        if lr_then and lr_now and abs(lr_now - lr_then) <= SAME_LR * lr_then:
            level = f" at the same learning rate ({lr_now:.3g})"
        where_now = (f"at step {again.step:,} with other samples" if same else
                     f"at another step, {again.step:,}")
        msg = (f"{what} at step {s:,} came back {resumed} {where_now}{level}: not one "
               "batch, the optimisation")
        return RestartVerdict("lr-too-high", Evidence(
            event.code, again.step, where, msg, Severity.WARNING, RESTART))
    if nxt.attempt.last_step >= s + window and data is not False:
        msg = (f"{what} at step {s:,} did not come back {resumed}, though the run went on "
               f"to step {nxt.attempt.last_step:,}{checked}: a transient fault")
        return RestartVerdict("hardware", Evidence(
            event.code, s, where, msg, Severity.WARNING, RESTART), bool(data))
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
