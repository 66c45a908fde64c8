"""Run the detectors over columns: each by its vectorised twin where one is proven
equivalent, else streaming over the rows it reads (``fallback``).

The result is what :meth:`DetectorSet.run` returns on the same records, findings and
failures alike; the property test ``tests/runtime/test_columnar_equivalence.py`` holds
every twin to that on random streams and on every example log.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
    "LossDetector": "b5d8c774fa5d5118",
    "GradNormDetector": "d87f313e4d765c3c",
    "MemoryDetector": "6e5e12556ff8c509",
    "ThroughputDetector": "1c962abadeb937eb",
    "AccumulationDetector": "4ad7e114fc85b89a",
    "LRDetector": "b9894ef6ba042a5f",
    "ScalerDetector": "b2904c417b6119bb",
}

_checked: dict[type, bool] = {}

#: Detectors run at once on a long log (see :func:`_run_parallel`).
TWIN_WORKERS = min(2, os.cpu_count() or 1)
#: Below this many rows the detectors take milliseconds: one thread, no pool to start.
PARALLEL_ROWS = 100_000
#: The temporaries of the detectors running at once, at most, in bytes per row: about
#: the columns' own size (a run log's dozen fields at 9 bytes each), so two run side by
#: side only where each holds about half that (see ``Twin.scratch``).
SCRATCH_BUDGET = 112
#: The most of the machine's cores the other processes may have kept busy (on average,
#: while the log was read) for the detectors to run side by side: with no core free,
#: a second thread only waits for one and faults in an arena of its own (measured under
#: load 6 on two cores: 0.45-0.95 s against 0.42 s one at a time).
OTHERS_MAX_CORES = 0.5
#: ``Twin.scratch`` and ``Twin.cost`` of a detector that runs streaming over its rows
#: (it holds records of the rows it reads, one at a time; most read few rows).
STREAMING_SCRATCH = 8
STREAMING_COST = 0.01


def _cpu_sample() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds of the whole machine, of this process), or ``None``
    where the kernel does not say (no ``/proc/stat``)."""
    try:
        with open("/proc/stat", "rb") as fh:
            ticks = fh.readline().split()
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if len(ticks) < 5 or ticks[0] != b"cpu":
        return None
    counts = [int(v) for v in ticks[1:9]]
    busy = sum(counts) - counts[3] - counts[4]  # all but idle and waiting for I/O
    return time.monotonic(), busy / hz, time.process_time()


#: The machine's CPU when this module was imported (during the log's read, in
#: ``sapper analyze``), the start of the span :func:`_core_free` looks at.
_since = _cpu_sample()
#: The shortest span over which the machine's use is judged (its clock ticks 100 times
#: a second); below it the load average says.
_MIN_SPAN_S = 0.2


def _core_free() -> bool:
    """Whether the other processes left this one a core free of late: the machine's CPU
    time less this process's own since the last look (the import, while the log was
    read), else the load average."""
    global _since
    now = _cpu_sample()
    before = _since
    if now is not None and before is not None and now[0] - before[0] >= _MIN_SPAN_S:
        _since = now
        others = (now[1] - before[1]) - (now[2] - before[2])
        return others / (now[0] - before[0]) <= OTHERS_MAX_CORES
    try:
        return os.getloadavg()[0] <= (os.cpu_count() or 1) - 1
    except OSError:
        return False


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
    workers: int | None = None,
    strict: bool = False,
) -> Outcome:
    """``detectors`` over ``cols`` (one attempt, steps ascending), in detector order.
    The first ``warm`` rows are context only (the history a resumed attempt starts
    from): the detectors see them, their findings are dropped. ``progress(n)`` is told
    as each detector ends. ``workers``: detectors run at once (by default
    :data:`TWIN_WORKERS` on a long log where a core is free, else one). ``strict``: a
    twin that raises is an error, not a fall back to the streaming detector (the
    equivalence tests)."""
    out = Outcome()
    first = int(cols.steps[warm]) if 0 < warm < len(cols) else None
    detectors = list(detectors)
    twins = [twin_for(det, proven_only=proven_only) for det in detectors]
    if workers is None:
        long = len(cols) >= PARALLEL_ROWS and TWIN_WORKERS > 1
        workers = TWIN_WORKERS if long and _core_free() else 1
    if workers > 1 and sum(t is not None for t in twins) > 1:
        results = _run_parallel(cols, detectors, twins, workers, strict)
    else:
        results = (_run_one(cols, d, t, strict) for d, t in zip(detectors, twins, strict=True))
    for found, bad, lines in results:
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


_Result = tuple[list[Finding], dict[str, str], list[str]]


def _run_one(cols: Columns, det: Detector, twin: Twin | None, strict: bool) -> _Result:
    """One detector over ``cols``: by its twin where it has one (a twin reads the
    detector's options and the columns and writes neither, so twins may run in threads
    side by side), else, or when the twin cannot follow, streaming over its rows."""
    if twin is not None:
        try:
            found = twin.run(det, cols)
            lines = twin.unevaluated(det, cols, found) if twin.unevaluated is not None else []
            return found, {}, lines
        except Exception:  # a twin that cannot follow: the streaming detector can
            if strict:
                raise
    return run_streaming(det, cols)


class _Budget:
    """The temporaries the detectors running at once may hold, in bytes per row: a
    detector waits until its own share fits beside those running (one larger than the
    whole budget runs alone)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.cond = threading.Condition()

    def run(self, need: int, fn: Callable[[], _Result]) -> _Result:
        need = min(need, self.total)
        with self.cond:
            self.cond.wait_for(lambda: self.used + need <= self.total)
            self.used += need
        try:
            return fn()
        finally:
            with self.cond:
                self.used -= need
                self.cond.notify_all()


def _run_parallel(
    cols: Columns,
    detectors: list[Detector],
    twins: list[Twin | None],
    workers: int,
    strict: bool,
) -> Iterable[_Result]:
    """Every detector's result, in detector order, from ``workers`` threads: the
    longest first, each waiting for room in :data:`SCRATCH_BUDGET`, so two detectors
    run at once only where both their temporaries fit (the process's peak stays near
    one detector's). numpy and polars work on whole arrays outside the interpreter's
    lock, so a second core takes a share of the time."""
    budget = _Budget(SCRATCH_BUDGET)
    costs = [t.cost if t is not None else STREAMING_COST for t in twins]
    jobs = sorted(range(len(detectors)), key=lambda k: -costs[k])
    futures: dict[int, Future[_Result]] = {}
    with ThreadPoolExecutor(workers, thread_name_prefix="sapper-twin") as pool:
        for k in jobs:
            twin = twins[k]
            need = twin.scratch if twin is not None else STREAMING_SCRATCH
            futures[k] = pool.submit(
                budget.run, need, lambda d=detectors[k], t=twin: _run_one(cols, d, t, strict)
            )
        return [futures[k].result() for k in range(len(detectors))]


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
