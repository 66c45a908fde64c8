"""Run the runtime detectors over a log that already exists (``sapper analyze``).

The detectors are the live monitor's own objects (``default_detectors``), fed record by
record exactly as during training, so a finding means the same thing live and offline.
Findings the live monitor already stored in a sapper run log are kept (some need hooks
inside the loop: the first non-finite module, GradScaler misuse) and merged with the
replayed ones, one per rule and step. The typical logging interval and the gaps in the
log are measured and reported, so a finding on a log written every 100 steps is read
as such.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sapper.logs.base import LogData
from sapper.rules.model import Finding, Severity
from sapper.rules.registry import select_rules
from sapper.runtime.detector import Detector, DetectorSet, unevaluated_codes

__all__ = ["Analysis", "analyze_log", "log_interval"]

#: A gap is this many typical intervals without a record.
GAP_FACTOR = 10


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
    #: Rules the detectors could not evaluate on this log, naming the missing input.
    unevaluated: list[str] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        notes = list(self.log.notes)
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
            "notes": self.notes,
            "not_evaluated": self.unevaluated,
        }


def log_interval(steps: Sequence[int]) -> tuple[int | None, list[tuple[int, int]]]:
    """The median step difference and the gaps far longer than it."""
    if len(steps) < 2:
        return None, []
    import numpy as np

    diffs = np.diff(np.asarray(steps, dtype=np.int64))
    interval = max(1, int(np.median(diffs)))
    limit = max(GAP_FACTOR * interval, interval + 1)
    idx = np.nonzero(diffs > limit)[0]
    gaps = [(int(steps[i]), int(steps[i + 1])) for i in idx]
    return interval, gaps


def _asked(lines: list[str], select: Iterable[str], ignore: Iterable[str]) -> list[str]:
    """The "not evaluated" lines of the rules ``--select``/``--ignore`` keep (a line that
    names no code is kept)."""
    select, ignore = list(select), list(ignore)
    return [
        u
        for u in lines
        if not unevaluated_codes(u) or select_rules(unevaluated_codes(u), select, ignore)
    ]


def _key(f: Finding) -> tuple[str, int | None, int | None]:
    return (f.code, f.step, f.rank)


def analyze_log(
    log: LogData,
    detectors: Iterable[Detector],
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    *,
    progress: Callable[[int], None] | None = None,
) -> Analysis:
    """Feed every record of ``log`` to ``detectors``; keep the codes select/ignore allow.

    A long log runs through its columns (``sapper.runtime.columnar``: vectorised twins
    proven to give the same findings, the other detectors fed only the rows they read);
    ``progress(n)`` is told as detectors finish there."""
    from sapper.runtime.columnar.engine import run_log

    dset = DetectorSet(detectors)
    fast = run_log(log, dset.detectors, progress=progress)
    if fast is not None:
        found, failed, lines = fast.found, fast.failed, fast.unevaluated
    else:
        found = dset.run(log.records)
        failed, lines = dict(dset.failed), dset.unevaluated()
    merged: dict[tuple[str, int | None, int | None], Finding] = {}
    for f in [*log.findings, *found]:
        merged.setdefault(_key(f), f)
    findings = [
        f if f.source else f.model_copy(update={"source": log.path}) for f in merged.values()
    ]
    kept = select_rules({f.code for f in findings}, select, ignore)
    findings = sorted(
        (f for f in findings if f.code in kept),
        key=lambda f: (f.step if f.step is not None else -1, -f.severity.rank, f.code),
    )
    columns = getattr(log, "columns", None)
    steps = columns.steps if columns is not None else [r.step for r in log.records]
    interval, gaps = log_interval(steps)
    unevaluated = _asked(lines, select, ignore)
    return Analysis(log, findings, interval, gaps, failed, unevaluated)
