"""Why is it slow: where a slow run's step time goes, read from what its log has.

A slowdown (R061), a run below its plan (R060) or a data wait (R062) says *that* the run
is slow; the cause is one of a few places the step's time can go, each with its own
fix (seed §5.2: "far below → communication or data pipeline"):

- **data wait**: the loop waits for the next batch (``data_time_s``);
- **memory pressure**: near the device limit the caching allocator frees its cache and
  retries (``num_alloc_retries`` and the names people log it under), or memory sits at
  the limit;
- **a straggler rank**: one rank persistently slower than the others (X002 of the
  cross-rank analysis; every rank waits for it at each collective);
- **compute or communication**: what is left of the step once the above are taken out.
  A log without per-phase times cannot split these two; the plan's predicted step time
  (R060's threshold) says how far the run is from what the layout should reach.

Each component is measured over the slow stretch against the run's early level (a
slowdown) or against the whole step (a run slow from the start), and the components are
ranked by the share of the step time (or of its growth) they account for. A component
that accounts for at least ``CLEAR_SHARE`` of it is a verdict for its cause, as firm as a
restart that read the same samples; a smaller one that is the largest of all is a
verdict of its own weight; a log that has none of these fields gives no verdict (the
question stays open, with the test that would decide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sapper.diagnose.evidence import Evidence
from sapper.diagnose.onset import series
from sapper.logs.fields import ALLOC_RETRIES, normalize_name
from sapper.rules.model import Severity

if TYPE_CHECKING:
    from sapper.logs.analysis import Analysis

__all__ = ["MEASURE", "Bottleneck", "SlowVerdict", "bottlenecks", "slow_verdicts"]

#: Where a measured verdict comes from (an Evidence ``kind``).
MEASURE = "measure"
#: The slow findings this module explains.
SLOW = ("R061", "R060", "R062")
#: Share of the step time (or of its growth) above which a component is the answer.
CLEAR_SHARE = 0.5
#: Share below which a component is not worth naming at all.
MIN_SHARE = 0.15
#: Records read back for the extras a log keeps by name (allocator retries).
MAX_RECORDS = 20_000
#: Names of the allocator's retry counter as logs write it (normalised).
RETRY_NAMES = ALLOC_RETRIES

#: The cause each component points at in the causal map.
CAUSE_OF = {"data wait": "data-stall", "memory pressure": "memory-pressure",
            "straggler rank": "hardware"}


@dataclass(frozen=True)
class Bottleneck:
    """One place the step time goes, with its share of the time (or of its growth)."""

    name: str
    share: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "share": round(self.share, 3), "detail": self.detail,
                "cause": CAUSE_OF.get(self.name)}


@dataclass(frozen=True)
class SlowVerdict:
    """A measured verdict for a cause (weighed as a restart verdict is)."""

    cause: str
    evidence: Evidence
    verified: bool


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if math.isfinite(x))
    return xs[len(xs) // 2] if xs else None


def _split(values: list[tuple[int, float]], since: int | None) -> tuple[list[float], list[float]]:
    """Values before the slow stretch and in it: before/after ``since``, else the first
    and the last quarter of the log."""
    if since is not None:
        early = [v for s, v in values if s < since]
        late = [v for s, v in values if s >= since]
        if early and late:
            return early, late
    q = max(1, len(values) // 4)
    return [v for _, v in values[:q]], [v for _, v in values[-q:]]


def _retries(analysis: Analysis) -> list[tuple[int, float]]:
    records = analysis.log.records
    start = max(0, len(records) - MAX_RECORDS)
    out: list[tuple[int, float]] = []
    for rec in records[start:]:
        for key, value in rec.extra.items():
            if normalize_name(str(key)) in RETRY_NAMES and isinstance(value, (int, float)):
                out.append((rec.step, float(value)))
                break
    return out


def bottlenecks(analysis: Analysis, since: int | None) -> list[Bottleneck]:
    """The components of a slow run's step time this log can show, largest first."""
    log = analysis.log
    n = len(log.records)
    steps = series(log, "step_time_s", max(0, n - 4 * MAX_RECORDS), n)
    data = series(log, "data_time_s", max(0, n - 4 * MAX_RECORDS), n)
    out: list[Bottleneck] = []
    early_t, late_t = _split(steps, since)
    t0, t1 = _median(early_t), _median(late_t)
    grew = t0 is not None and t1 is not None and t1 > t0 * 1.05
    base = (t1 - t0) if grew else t1  # type: ignore[operator]
    if data and base:
        early_d, late_d = _split(data, since)
        d0, d1 = _median(early_d) or 0.0, _median(late_d) or 0.0
        part = (d1 - d0) if grew else d1
        if part > 0:
            what = (f"the data wait grew {d0:.3g} s → {d1:.3g} s of a step time that grew "
                    f"{t0:.3g} s → {t1:.3g} s" if grew else
                    f"the data wait is {d1:.3g} s of a {t1:.3g} s step")
            out.append(Bottleneck("data wait", min(1.0, part / base), what))
    retries = _retries(analysis)
    if len(retries) >= 2:
        early_r, late_r = _split(retries, since)
        r0, r1 = max(early_r, default=0.0), max(late_r, default=0.0)
        rose = r1 > r0
        if rose or (not grew and r1 > 0):
            share = 1.0 - sum(b.share for b in out)
            out.append(Bottleneck(
                "memory pressure", max(0.0, share),
                f"the allocator's retries rose {r0:.0f} → {r1:.0f} over the slow stretch"
                if rose else f"the allocator retried {r1:.0f} times"))
    if any(f.code == "X002" and f.severity != Severity.INFO for f in analysis.findings):
        out.append(Bottleneck("straggler rank", 1.0 - sum(b.share for b in out),
                              "one rank is persistently slower than the others (X002)"))
    if base and (data or len(retries) >= 2):
        left = 1.0 - sum(b.share for b in out)
        if left > 0:
            out.append(Bottleneck("compute or communication", left,
                                  "the rest of the step (the log does not split the two)"
                                  + _against_plan(analysis)))
    return sorted((b for b in out if b.share >= MIN_SHARE), key=lambda b: -b.share)


def _against_plan(analysis: Analysis) -> str:
    """What the plan predicted, where R060 compared the run with it."""
    for f in analysis.findings:
        if f.code == "R060" and f.value and f.threshold and f.severity != Severity.INFO:
            return (f"; the run reaches {f.value:.4g}, below the floor of {f.threshold:.4g} "
                    "set from the throughput the plan expects (R060)")
    return ""


def _slow_finding(analysis: Analysis) -> tuple[str, int | None, int | None] | None:
    """The first slow finding at warning: its code, step and episode start."""
    for code in SLOW:
        for f in sorted(analysis.findings, key=lambda f: f.step or 0):
            if f.code == code and f.severity != Severity.INFO:
                start = f.data.get("episode_start")
                return code, f.step, start if isinstance(start, int) else None
    return None


def slow_verdicts(analyses: list[Analysis]) -> tuple[list[SlowVerdict], list[Bottleneck]]:
    """The measured verdicts for a slow run, and its ranked bottlenecks (empty when no
    log is slow or none shows where the time goes)."""
    verdicts: list[SlowVerdict] = []
    ranked: list[Bottleneck] = []
    for a in analyses:
        slow = _slow_finding(a)
        if slow is None and not any(f.code == "X002" for f in a.findings):
            continue
        code, step, since = slow if slow is not None else ("X002", None, None)
        found = bottlenecks(a, since)
        if not found:
            continue
        ranked = found
        top = found[0]
        cause = CAUSE_OF.get(top.name)
        if cause is None:
            continue
        msg = (f"where the slow steps' time goes: {top.name} {100 * top.share:.0f}% "
               f"({top.detail})")
        verdicts.append(SlowVerdict(cause, Evidence(
            code, since if since is not None else step, a.log.path, msg, Severity.WARNING,
            MEASURE), top.share >= CLEAR_SHARE))
        break
    return verdicts, ranked
