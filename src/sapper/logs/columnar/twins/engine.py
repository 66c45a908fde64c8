"""Run the detectors over columns: each by its vectorised twin where one is proven
equivalent, else streaming over the rows it reads (``fallback``).

The result is what :meth:`DetectorSet.run` returns on the same records, findings and
failures alike; the property test ``tests/runtime/test_columnar_equivalence.py`` holds
every twin to that on random streams and on every example log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sapper.logs.base import Attempt, LogData
from sapper.logs.columnar.frame import Columns, columns_from_records, strictly_ascending
from sapper.logs.columnar.twins.base import Twin, fingerprint
from sapper.logs.columnar.twins.fallback import run_streaming
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = [
    "FINGERPRINTS",
    "MIN_RECORDS",
    "TWINS",
    "Outcome",
    "run_attempt",
    "run_columns",
    "twin_for",
]


def _twins() -> dict[type, Twin]:
    from sapper.logs.columnar.twins import (
        accumulation,
        gradnorm,
        loss,
        lr,
        memory,
        scaler,
        throughput,
    )

    twins = (
        loss.TWIN,
        gradnorm.TWIN,
        memory.TWIN,
        throughput.TWIN,
        accumulation.TWIN,
        lr.TWIN,
        scaler.TWIN,
    )
    return {t.cls: t for t in twins}


TWINS: dict[type, Twin] = _twins()

#: The source each twin was proven equivalent to (see ``base.fingerprint``); a twin
#: whose detector changed since is not used until the property test passes again and
#: this digest is updated.
FINGERPRINTS: dict[str, str] = {
    "LossDetector": "80d6f436987c8cf3",
    "GradNormDetector": "f29a3a149714fbbc",
    "MemoryDetector": "6e5e12556ff8c509",
    "ThroughputDetector": "c35a06f37c13ff3d",
    "AccumulationDetector": "d9945b41cb978343",
    "LRDetector": "91d24796862ef354",
    "ScalerDetector": "1f10f414bbea5278",
}

_checked: dict[type, bool] = {}


def twin_for(det: Detector, *, proven_only: bool = True) -> Twin | None:
    """The twin that may stand in for ``det``: its exact class, options it accepts and,
    unless ``proven_only`` is off (the equivalence tests), an unchanged source."""
    twin = TWINS.get(type(det))
    if twin is None or not twin.accepts(det):
        return None
    if twin.unevaluated is None and type(det).unevaluated is not Detector.unevaluated:
        return None  # the detector says what it could not evaluate; this twin cannot
    if proven_only:
        ok = _checked.get(twin.cls)
        if ok is None:
            ok = _checked[twin.cls] = FINGERPRINTS.get(twin.cls.__name__) == fingerprint(
                twin.modules
            )
        if not ok:
            return None
    return twin


@dataclass
class Outcome:
    """What :meth:`DetectorSet.run` and :meth:`DetectorSet.unevaluated` give."""

    found: list[Finding] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unevaluated: list[str] = field(default_factory=list)


def run_columns(
    cols: Columns,
    detectors: Iterable[Detector],
    *,
    proven_only: bool = True,
    progress: Callable[[int], None] | None = None,
    warm: int = 0,
) -> Outcome:
    """``detectors`` over ``cols`` (one attempt, steps ascending), in detector order.
    The first ``warm`` rows are context only (the history a resumed attempt starts
    from): the detectors see them, their findings are dropped. ``progress(n)`` is told
    as each detector ends."""
    out = Outcome()
    first = int(cols.steps[warm]) if 0 < warm < len(cols) else None
    for det in detectors:
        twin = twin_for(det, proven_only=proven_only)
        done = False
        if twin is not None:
            try:
                found = twin.run(det, cols)
                lines = twin.unevaluated(det, cols, found) if twin.unevaluated is not None else []
                done = True
            except Exception:  # a twin that cannot follow: the streaming detector can
                done = False
        if not done:
            found, bad, lines = run_streaming(det, cols)
            out.failed.update(bad)
        if warm >= len(cols):
            found = []
        elif first is not None:
            found = [f for f in found if f.step is None or f.step >= first]
        out.found.extend(found)
        out.unevaluated.extend(lines)
        if progress is not None:
            progress(1)
    return out


#: Above this share of rows with extras (a live monitor logging them every step) the
#: detectors that read extras run record by record anyway, and the streaming run is faster.
EXTRAS_SHARE = 0.25

#: Below this many records the streaming detectors are as fast and need no columns.
MIN_RECORDS = 20_000


def run_attempt(
    log: LogData,
    attempt: Attempt,
    detectors: list[Detector],
    warm: Sequence[StepRecord] = (),
    *,
    progress: Callable[[int], None] | None = None,
    min_records: int | None = None,
) -> Outcome | None:
    """The detectors over one attempt of ``log`` through columns, ``warm`` (the history
    the attempt resumes from; records, or :class:`~sapper.logs.columnar.RowRecords` of
    the log's own columns) seen first as context; ``None`` when the streaming run is
    the one to use: a short attempt, steps that do not ascend, a field holding something
    other than numbers."""
    cols = getattr(log, "columns", None)
    whole = attempt.start == 0 and attempt.stop == len(log.records)
    rows = getattr(warm, "rows", None)
    if cols is not None and rows is not None and getattr(warm, "columns", None) is cols:
        # the history as rows of the same columns: the attempt after it, as rows too
        if attempt.stop - attempt.start < (MIN_RECORDS if min_records is None else min_records):
            return None
        cols = cols.take(np.concatenate([rows, np.arange(attempt.start, attempt.stop)]))
    elif cols is None or warm or not whole:
        if attempt.stop - attempt.start < (MIN_RECORDS if min_records is None else min_records):
            return None
        if cols is not None and not warm:
            cols = cols.slice(attempt.start, attempt.stop)
        else:
            records = [*warm, *log.records[attempt.start : attempt.stop]]
            cols = columns_from_records(records)
            if cols is None:
                return None
    if not strictly_ascending(cols.steps):
        return None
    if len(cols.full) > EXTRAS_SHARE * len(cols):
        return None  # extras on most rows: the detectors reading them cost what they do
    return run_columns(cols, detectors, progress=progress, warm=len(warm))


def _main() -> None:
    """Print each twin's fingerprint of the current detector source (to update
    :data:`FINGERPRINTS` once the equivalence tests pass)."""
    for cls, twin in TWINS.items():
        print(f'    "{cls.__name__}": "{fingerprint(twin.modules)}",')


if __name__ == "__main__":
    _main()
