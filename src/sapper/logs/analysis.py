"""Run the runtime detectors over a log that already exists (``sapper analyze``).

The detectors are the live monitor's own objects (``default_detectors``), fed record by
record exactly as during training, so a finding means the same thing live and offline.
Findings the live monitor already stored in a sapper run log are kept (some need hooks
inside the loop: the first non-finite module, GradScaler misuse) and merged with the
replayed ones, one per rule and step. A restarted log holds several attempts
(:class:`~sapper.logs.base.Attempt`): each is a run of its own, fed to fresh copies of the
detectors, and the summary says whether an attempt was rolled back after a finding that
explains it (a spike, a NaN, an overflow shortly before its end) or just restarted. The
typical logging interval and the gaps in the log are measured within each attempt and
reported, so a finding on a log written every 100 steps is read as such.
"""

from __future__ import annotations

import copy
import statistics
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from sapper.logs.base import Attempt, LogData
from sapper.rules.model import Finding, Severity
from sapper.rules.registry import select_rules
from sapper.runtime.detector import Detector, DetectorSet, unevaluated_codes
from sapper.runtime.records import StepRecord

__all__ = ["Analysis", "AttemptSummary", "analyze_log", "attempts_of", "log_interval"]

#: A gap is this many typical intervals without a record.
GAP_FACTOR = 10
#: Notes on one log shown (the terminal, JSON and the report); the rest are counted.
MAX_NOTES = 50
#: An attempt that ends within this many logging intervals (or at least this many steps, see
#: ``ROLLBACK_MIN_STEPS``) after a trouble finding was rolled back because of it (so was
#: one whose trouble lies in the steps the next attempt logs again).
ROLLBACK_INTERVALS = 10
ROLLBACK_MIN_STEPS = 100
#: Records of the history an attempt resumes from that its fresh detectors see first.
WARM_RECORDS = 2000
#: Attempts analyzed in one log: steps that go back more often than this are not
#: rollbacks but interleaved runs (or a damaged file), and each attempt costs a fresh set
#: of detectors warmed on ``WARM_RECORDS`` records.
MAX_ATTEMPTS = 100
#: An attempt shorter than this, in a log read as records, runs record by record
#: without asking the columnar engine (no larger than its ``MIN_RECORDS``, below which
#: it streams too): a small log is analyzed without importing numpy and the twins.
STREAMING_RECORDS = 20_000
#: Step intervals measured in Python below this many steps, with numpy above.
PLAIN_INTERVAL_STEPS = 20_000
#: The columnar engine's module: consulted once loaded, its ``MIN_RECORDS`` may be set.
_ENGINE = "sapper.logs.columnar.twins.engine"
#: Findings that make a run roll back: what a restart right after them answers.
TROUBLE: dict[str, str] = {
    "R001": "a non-finite loss",
    "R002": "a loss spike",
    "R010": "a non-finite gradient norm",
    "R013": "a gradient-norm surge",
    "R020": "non-finite values",
    "R030": "a loss-scale collapse",
    "R031": "a run of skipped steps",
}


@dataclass
class AttemptSummary:
    """One attempt, and what ended it when the log goes on with another."""

    attempt: Attempt
    #: The trouble finding shortly before the attempt's end (see ``analyze_log``).
    ended_by: Finding | None = None
    #: The first step of the next attempt (``None`` for the last attempt).
    resumed_at: int | None = None

    @property
    def records(self) -> int:
        return self.attempt.stop - self.attempt.start

    def sentence(self) -> str | None:
        """"rolled back at step 1200 (attempt 2 resumes from step 1100) after a loss
        spike at step 1187", or "restarted at step N ..."; ``None`` for the last attempt."""
        if self.resumed_at is None:
            return None
        a = self.attempt
        resume = f"(attempt {a.number + 1} resumes from step {self.resumed_at:,})"
        if self.ended_by is None:
            return f"restarted at step {a.last_step:,} {resume}"
        what = TROUBLE.get(self.ended_by.code, self.ended_by.code)
        return (
            f"rolled back at step {a.last_step:,} {resume} after {what} at step "
            f"{self.ended_by.step:,} ({self.ended_by.code})"
        )

    def to_json(self) -> dict[str, Any]:
        a = self.attempt
        out: dict[str, Any] = {
            "number": a.number,
            "first_step": a.first_step,
            "last_step": a.last_step,
            "records": self.records,
        }
        if self.ended_by is not None:
            out["ended_by"] = {
                "code": self.ended_by.code,
                "step": self.ended_by.step,
                "message": self.ended_by.message,
            }
        return out


@dataclass
class Analysis:
    """The findings on one log and what the analyzer learned about the log itself."""

    log: LogData
    findings: list[Finding]
    #: The typical number of steps between two records (1 = every step).
    interval: int | None = None
    #: Step ranges with no record, longer than ``GAP_FACTOR`` intervals.
    gaps: list[tuple[int, int]] = field(default_factory=list)
    #: Detectors that raised (a bug in sapper), with the error; the others still ran.
    failed: dict[str, str] = field(default_factory=dict)
    #: The log's attempts (one unless it was restarted), with what ended each.
    attempts: list[AttemptSummary] = field(default_factory=list)
    #: Rules a detector could not evaluate on this log, naming the missing input.
    unevaluated: list[str] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        notes = [s for a in self.attempts if (s := a.sentence())]
        notes += self.log.notes
        if len(notes) > MAX_NOTES:  # a hostile log can make thousands
            notes[MAX_NOTES:] = [f"... and {len(notes) - MAX_NOTES} more notes on the log"]
        for start, end in self.gaps[:5]:
            notes.append(f"no records between steps {start} and {end}")
        if len(self.gaps) > 5:
            notes.append(f"... and {len(self.gaps) - 5} more gaps")
        for name, error in self.failed.items():
            notes.append(f"detector {name} failed and was skipped ({error}); a bug in sapper")
        return notes

    def count(self, severity: Severity) -> int:
        return sum(f.severity == severity for f in self.findings)

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.log.path,
            "format": self.log.format,
            "records": len(self.log.records),
            "first_step": self.log.first_step,
            "last_step": self.log.last_step,
            "interval": self.interval,
            "gaps": [list(g) for g in self.gaps],
            "attempts": [a.to_json() for a in self.attempts],
            "notes": self.notes,
            "not_evaluated": self.unevaluated,
        }


def log_interval(steps: Sequence[int]) -> tuple[int | None, list[tuple[int, int]]]:
    """The median step difference and the gaps far longer than it (steps ascending)."""
    return attempts_interval([steps])


def attempts_interval(
    runs: Sequence[Sequence[int]],
) -> tuple[int | None, list[tuple[int, int]]]:
    """The median step difference within each attempt and the gaps far longer than it:
    the step going back between two attempts is neither an interval nor a gap."""
    runs = [steps for steps in runs if len(steps) > 1]
    if sum(len(steps) for steps in runs) < PLAIN_INTERVAL_STEPS:
        return _plain_interval(runs)
    import numpy as np

    diffs = [np.diff(np.asarray(steps, dtype=np.int64)) for steps in runs if len(steps) > 1]
    if not diffs:
        return None, []
    interval = max(1, int(np.median(np.concatenate(diffs))))
    limit = max(GAP_FACTOR * interval, interval + 1)
    gaps: list[tuple[int, int]] = []
    for steps, d in zip((s for s in runs if len(s) > 1), diffs, strict=True):
        gaps.extend((int(steps[i]), int(steps[i + 1])) for i in np.nonzero(d > limit)[0])
    return interval, gaps


def _plain_interval(
    runs: Sequence[Sequence[int]],
) -> tuple[int | None, list[tuple[int, int]]]:
    """:func:`attempts_interval` of a short log in plain Python (the same numbers)."""
    diffs = [
        [int(b) - int(a) for a, b in pairwise(steps)] for steps in runs
    ]
    every = [d for run in diffs for d in run]
    if not every:
        return None, []
    interval = max(1, int(statistics.median(every)))
    limit = max(GAP_FACTOR * interval, interval + 1)
    gaps = [
        (int(steps[i]), int(steps[i + 1]))
        for steps, run in zip(runs, diffs, strict=True)
        for i, d in enumerate(run)
        if d > limit
    ]
    return interval, gaps


def _streams(log: LogData, attempts: Sequence[Attempt]) -> bool:
    """Whether every attempt of ``log`` runs record by record whatever the columnar
    engine would say: the log was read as records and each attempt is short."""
    if getattr(log, "columns", None) is not None:
        return False
    engine = sys.modules.get(_ENGINE)
    floor = min(STREAMING_RECORDS, int(getattr(engine, "MIN_RECORDS", STREAMING_RECORDS)))
    return all(a.stop - a.start < floor for a in attempts)


def _asked(lines: list[str], select: Iterable[str], ignore: Iterable[str]) -> list[str]:
    """The "not evaluated" lines of the rules ``--select``/``--ignore`` keep (a line that
    names no code is kept)."""
    select, ignore = list(select), list(ignore)
    return [
        u
        for u in lines
        if not unevaluated_codes(u) or select_rules(unevaluated_codes(u), select, ignore)
    ]


def _key(f: Finding) -> tuple[Any, ...]:
    """One finding per rule, step and rank, in each attempt and eval set."""
    return (f.code, f.step, f.rank, f.data.get("attempt"), f.data.get("eval_set"))


def attempts_of(log: LogData) -> list[Attempt]:
    """The log's attempts; one over all records when the reader named none."""
    if log.attempts:
        return log.attempts
    if not log.records:
        return []
    steps = [r.step for r in log.records]
    return [Attempt(1, 0, len(log.records), steps[0], max(steps))]


def analyze_log(
    log: LogData,
    detectors: Iterable[Detector],
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    *,
    progress: Callable[[int], None] | None = None,
) -> Analysis:
    """Feed every record of ``log`` to ``detectors``; keep the codes select/ignore allow.

    Each attempt of a restarted log is a run of its own: it gets fresh copies of the
    detectors (same options, no state), and its findings name it in ``data["attempt"]``.
    The copies first see, without reporting, the last ``WARM_RECORDS`` records of the
    history the attempt resumes from (the earlier attempts' steps before its first step):
    a run resumed at step 1,100 is not at its start, and a spike right after the resume is
    measured against the run's level, as it would have been without the restart.

    A long attempt runs through columns (``sapper.logs.columnar.twins``: vectorised twins
    proven to give the same findings, the other detectors fed only the rows they read);
    ``progress(n)`` is told as detectors finish there.
    """
    templates = list(detectors)
    attempts = attempts_of(log)
    many = len(attempts) > 1
    unevaluated: list[str] = []
    if len(attempts) > MAX_ATTEMPTS:
        unevaluated.append(
            f"attempts {MAX_ATTEMPTS + 1}–{len(attempts)} not analyzed: the steps go back "
            f"{len(attempts) - 1} times, more than {MAX_ATTEMPTS - 1} restarts (several runs "
            "interleaved in one file? give each run its own file)"
        )
        attempts = attempts[:MAX_ATTEMPTS]
    found: list[Finding] = []
    failed: dict[str, str] = {}
    #: what could not be evaluated -> the attempts it holds for (said once for all)
    missed: dict[str, list[int]] = {}
    lineage: Sequence[StepRecord] = []  # the history the next attempt's checkpoint carries
    history = _Rows(log) if many and getattr(log, "columns", None) is not None else None
    streams = _streams(log, attempts)
    if not streams:
        from sapper.logs.columnar.twins.engine import run_attempt
    for i, attempt in enumerate(attempts):
        dets = copy.deepcopy(templates) if many else templates
        warm = history.last(WARM_RECORDS) if history is not None else lineage[-WARM_RECORDS:]
        fast = None if streams else run_attempt(log, attempt, dets, warm, progress=progress)
        records: Sequence[StepRecord] | None = None
        if fast is not None:
            got, bad, lines = fast.found, fast.failed, fast.unevaluated
        else:
            dset = DetectorSet(dets)
            for rec in warm:
                dset.update(rec)  # context only: these steps' findings belong to earlier attempts
            records = log.records[attempt.start : attempt.stop]
            got = dset.run(records)
            bad, lines = dict(dset.failed), dset.unevaluated()
        for f in got:
            found.append(_tagged(f, attempt.number) if many else f)
        if i + 1 < len(attempts):
            # the history ascends in step: what the next attempt resumes from is a prefix
            resume = attempts[i + 1].first_step
            if history is not None:
                history.resume(attempt, resume)
            else:
                if records is None:
                    records = log.records[attempt.start : attempt.stop]
                lineage = list(lineage[: bisect_left(lineage, resume, key=_step)])
                lineage += records[: bisect_left(records, resume, key=_step)]
        for line in lines:
            missed.setdefault(line, []).append(attempt.number)
        failed.update(bad)
    unevaluated += [
        f"{_numbers(numbers)}: {line}" if many else line for line, numbers in missed.items()
    ]
    # The live monitor's own findings (a sapper run log) win over their replay.
    stored = {_key(f)[:4] for f in log.findings}
    merged: dict[tuple[Any, ...], Finding] = {}
    for f in [*log.findings, *(f for f in found if _key(f)[:4] not in stored)]:
        merged.setdefault(_key(f), f)
    findings = [
        f if f.source else f.model_copy(update={"source": log.path}) for f in merged.values()
    ]
    kept = select_rules({f.code for f in findings}, select, ignore)
    findings = sorted(
        (f for f in findings if f.code in kept),
        key=lambda f: (
            f.data.get("attempt") or 0,
            f.step if f.step is not None else -1,
            -f.severity.rank,
            f.code,
        ),
    )
    columns = getattr(log, "columns", None)
    interval, gaps = attempts_interval(
        [columns.steps[a.start : a.stop] for a in attempts]
        if columns is not None
        else [[r.step for r in log.records[a.start : a.stop]] for a in attempts]
    )
    result = Analysis(log, findings, interval, gaps, failed)
    result.attempts = _ends(attempts, found, interval)
    result.unevaluated = _asked(unevaluated, select, ignore)
    return result


class _Rows:
    """The history a resumed attempt starts from, as row numbers of a log read into
    columns (its steps ascend within each attempt): no record is built for it."""

    def __init__(self, log: LogData) -> None:
        import numpy as np

        self.columns = getattr(log, "columns", None)
        self.rows = np.zeros(0, dtype=np.int64)

    def last(self, n: int) -> Sequence[StepRecord]:
        from sapper.logs.columnar import RowRecords

        return RowRecords(self.columns, self.rows[-n:]) if len(self.rows) else []

    def resume(self, attempt: Attempt, step: int) -> None:
        """The history once ``attempt`` ends and the run resumes from ``step``."""
        import numpy as np

        steps = self.columns.steps
        kept = self.rows[: int(np.searchsorted(steps[self.rows], step, side="left"))]
        own = steps[attempt.start : attempt.stop]
        upto = attempt.start + int(np.searchsorted(own, step, side="left"))
        self.rows = np.concatenate([kept, np.arange(attempt.start, upto, dtype=np.int64)])


def _numbers(attempts: list[int]) -> str:
    """"attempt 2", "attempts 1–3, 5" for ascending attempt numbers."""
    spans: list[list[int]] = []
    for n in attempts:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)
    return f"attempt{'s' if len(attempts) > 1 else ''} {text}"


def _step(rec: StepRecord) -> int:
    return rec.step


def _tagged(f: Finding, number: int) -> Finding:
    return f.model_copy(update={"data": {**f.data, "attempt": number}})


def _ends(
    attempts: list[Attempt], found: list[Finding], interval: int | None
) -> list[AttemptSummary]:
    """Each attempt with what ended it: the last trouble finding before its end.

    An attempt was rolled back because of a loss spike, a non-finite loss or gradient
    norm, a gradient-norm surge, a loss-scale collapse or a run of skipped steps when that
    finding lies in the steps the next attempt logs again (at or after the step it resumes
    from: the steps thrown away; the first such finding is named), or within
    ``ROLLBACK_INTERVALS`` logging intervals (at least ``ROLLBACK_MIN_STEPS`` steps) before
    the attempt's end (the latest is named); any other restart is just a restart."""
    window = max(ROLLBACK_INTERVALS * (interval or 1), ROLLBACK_MIN_STEPS)
    out: list[AttemptSummary] = []
    many = len(attempts) > 1
    for i, a in enumerate(attempts):
        summary = AttemptSummary(a)
        if i + 1 < len(attempts):
            resumed = attempts[i + 1].first_step
            trouble = [
                (f.step, f.severity.rank, f)
                for f in found
                if f.code in TROUBLE
                and f.step is not None
                and (f.data.get("attempt") == a.number or not many)
                and f.step <= a.last_step
            ]
            thrown = [t for t in trouble if t[0] >= resumed]
            late = [t for t in trouble if t[0] >= a.last_step - window]
            if thrown:  # the first trouble in the steps thrown away started it
                summary.ended_by = min(thrown, key=lambda t: (t[0], -t[1]))[2]
            elif late:
                summary.ended_by = max(late, key=lambda t: (t[0], t[1]))[2]
            summary.resumed_at = attempts[i + 1].first_step
        out.append(summary)
    return out
