"""Reading the logs of a run and analyzing them with the monitor's detectors."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.errors import InputError

if TYPE_CHECKING:
    from sapper.logs import LogData
    from sapper.logs.analysis import Analysis
    from sapper.logs.fields import FieldMap
    from sapper.plan.schema import Plan
    from sapper.runtime.detector import Detector

__all__ = [
    "analyses_json",
    "analyze_logs",
    "column_mapping",
    "count",
    "cross_rank_analysis",
    "detectors_for",
    "first_rank",
    "is_run_folder",
    "load_logs",
    "merge_logs",
    "run_folder_paths",
    "stored_plan",
]


def is_run_folder(path: Path) -> bool:
    """A folder ``sapper run`` wrote: its ``run.json``, or ``logs/`` beside
    ``console.log`` (a run still going, or one whose end was not recorded)."""
    try:
        return path.is_dir() and (path / "logs").is_dir() and (
            (path / "run.json").is_file() or (path / "console.log").is_file()
        )
    except OSError:
        return False


def run_folder_paths(paths: list[Path]) -> list[Path]:
    """``paths`` with each run folder of ``sapper run`` replaced by its ``logs/``: the
    run logs of every rank are the run; the console, stacks and dumps beside them are
    read by ``run`` and the hang analysis, not as logs."""
    return [Path(p) / "logs" if is_run_folder(Path(p)) else p for p in paths]


def first_rank(logs: list[LogData]) -> LogData | None:
    """The lowest rank's log when ``logs`` are the per-rank logs of one run (what a
    report about the run draws), else None."""
    if len(logs) < 2:
        return None
    from sapper.distributed.offline import ranked_logs

    index = ranked_logs([log.path for log in logs])
    if index is None:
        return None
    return logs[index[min(index)]]


def stored_plan(logs: list[LogData]) -> Plan | None:
    """The plan a sapper run log carries (the monitor writes it into its meta), or None.
    An invalid one is ignored with a note on its log, not an error: the log still reads.
    The schema is imported only for a log that carries a plan."""
    if not any(isinstance(log.meta.get("plan"), dict) for log in logs):
        return None
    from pydantic import ValidationError

    from sapper.plan.schema import Plan

    for log in logs:
        raw = log.meta.get("plan")
        if isinstance(raw, dict):
            try:
                return Plan.model_validate(raw)
            except ValidationError as exc:
                log.notes.append(
                    f"the plan stored in the run log is not valid and was ignored "
                    f"({exc.error_count()} error(s))"
                )
    return None


def detectors_for(plan: Plan | None, framework: str | None = None) -> list[Detector]:
    """The monitor's default detectors for this plan, plus the eval-loss detector; told
    the training framework when it is known (see :mod:`sapper.logs.framework`)."""
    from sapper.runtime.detectors import default_detectors
    from sapper.runtime.detectors.eval import EvalLossDetector

    detectors = list(default_detectors(plan=plan, framework=framework))
    if not any(isinstance(d, EvalLossDetector) for d in detectors):
        detectors.append(EvalLossDetector())
        if framework is not None:
            detectors[-1].set_framework(framework)
    return detectors


def _for_log(
    factory: Callable[[Plan | None], list[Detector]], plan: Plan | None, log: LogData
) -> list[Detector]:
    """Fresh detectors from ``factory``, told the framework that wrote ``log`` (its format
    or a run log's meta), so framework-specific rules apply only where they belong."""
    from sapper.logs.framework import framework_of

    detectors = factory(plan)
    framework = framework_of(log)
    for det in detectors:
        det.set_framework(framework)
    return detectors


def column_mapping(items: list[str] | None) -> dict[str, FieldMap]:
    """``--map COLUMN=FIELD[*FACTOR]`` items as the readers' column mapping."""
    from sapper.logs import parse_mapping

    try:
        return parse_mapping(items or [])
    except ValueError as exc:
        raise InputError(
            str(exc), field="--map", expected="COLUMN=FIELD with a StepRecord field"
        ) from None


def merge_logs(logs: list[LogData]) -> LogData:
    """One run from several logs (a run resumed into new files): the logs in the order
    of their first step, each log's records and attempts kept. A log that starts after
    the previous one's last step continues its attempt; one that starts at or below it
    (the run resumed from an earlier checkpoint) begins a new attempt."""
    from sapper.logs import LogData
    from sapper.logs.analysis import attempts_of
    from sapper.logs.base import Attempt

    ordered = sorted(
        (log for log in logs if log.records), key=lambda log: log.records[0].step
    )
    records: list[Any] = []
    attempts: list[Attempt] = []
    for log in ordered:
        base = len(records)
        for i, a in enumerate(attempts_of(log)):
            start, stop = base + a.start, base + a.stop
            prev = attempts[-1] if attempts else None
            if i == 0 and prev is not None and a.first_step > prev.last_step:
                prev.stop, prev.last_step = stop, max(prev.last_step, a.last_step)
            else:
                attempts.append(Attempt(len(attempts) + 1, start, stop, a.first_step, a.last_step))
        records.extend(log.records)
    notes = [f"{Path(log.path).name}: {n}" for log in logs for n in log.notes]
    formats = sorted({log.format for log in logs})
    return LogData(
        path=" + ".join(log.path for log in logs),
        format="+".join(formats),
        records=records,
        findings=[f for log in logs for f in log.findings],
        meta={k: v for log in logs for k, v in log.meta.items()},
        notes=notes,
        attempts=attempts,
    )


def prepare_while_reading() -> None:
    """While a long log is read in another thread (``sapper.logs.columnar.early``), do
    what :func:`analyze_logs` would do first once it is read: import the detectors and
    their vectorised twins and prove each twin against its detector's source. The
    thread that reads holds the interpreter's lock seldom, so this is off the time the
    command takes. Nothing when no such read is under way."""
    early = sys.modules.get("sapper.logs.columnar.early")
    if early is None or not early.pending():
        return
    from sapper.logs.analysis import analyze_log  # noqa: F401  (imported for its cost)
    from sapper.logs.columnar.twins.engine import twin_for

    for det in detectors_for(None):
        twin_for(det)


def load_logs(
    paths: list[Path],
    log_format: str | None,
    mapping: dict[str, FieldMap] | None,
    *,
    columnar: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[LogData], list[InputError]]:
    """Every readable log, and the errors of those that could not be read. With
    ``columnar``, a large sapper run log is read into columns (``sapper.logs.columnar``)
    for the vectorised detectors; ``progress(path)`` is told before each log is read."""
    from sapper.logs import expand_paths, read_log

    logs: list[LogData] = []
    errors: list[InputError] = []
    skipped: list[str] = []
    try:
        expanded = expand_paths(run_folder_paths(list(paths)), skipped)
    except InputError as exc:
        return [], [exc]
    for path, detected in expanded:
        if progress is not None:
            progress(str(path))
        fmt = log_format or detected
        if columnar and not mapping and path.is_file():
            from sapper.logs import detect_format
            from sapper.logs.columnar import read_columnar

            try:
                fast = read_columnar(path, fmt or detect_format(path))
            except InputError:  # not a log at all: read_log says so below
                fast = None
            if fast is not None:
                logs.append(fast)
                continue
        try:
            logs.append(read_log(path, fmt=fmt, mapping=mapping))
        except InputError as exc:
            errors.append(exc)
    early = sys.modules.get("sapper.logs.columnar.early")
    if early is not None:  # an early read of a file not read into columns: let it go
        early.discard()
    if skipped and logs:
        # A folder's files that are no log: said on its first log, where notes are read.
        logs[0].notes.extend(skipped)
    return logs, errors


def analyze_logs(
    logs: list[LogData],
    plan: Plan | None,
    select: list[str],
    ignore: list[str],
    detector_factory: Callable[[Plan | None], list[Detector]] = detectors_for,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[Analysis]:
    """One analysis per log, each with fresh detectors (logs are separate runs)."""
    from sapper.logs.analysis import analyze_log

    return [
        analyze_log(
            log, _for_log(detector_factory, plan, log), select, ignore, progress=progress
        )
        for log in logs
    ]


def cross_rank_analysis(
    logs: list[LogData], select: list[str], ignore: list[str]
) -> Analysis | None:
    """Per-rank run logs of one folder (``rank<N>.jsonl``): the cross-rank detectors
    over their records lined up by step, as one more analysis; None otherwise."""
    if len(logs) < 2:  # one log is one rank: nothing to line up, nothing to import
        return None
    from sapper.distributed.offline import ranked_logs

    index = ranked_logs([log.path for log in logs])
    if index is None:
        return None
    from sapper.distributed.detectors import default_distributed_detectors
    from sapper.distributed.offline import cross_rank_records
    from sapper.logs import LogData
    from sapper.logs.analysis import analyze_log

    records = cross_rank_records({r: logs[i].records for r, i in index.items()})
    folder = Path(logs[next(iter(index.values()))].path).parent
    joined = LogData(
        path=f"{folder}/rank*.jsonl ({len(index)} ranks)",
        format="sapper-ranks",
        records=records,
    )
    return analyze_log(joined, default_distributed_detectors(), select, ignore)


def count(analyses: list[Analysis], severity: Any) -> int:
    """Findings of ``severity`` over all analyses."""
    return sum(a.count(severity) for a in analyses)


def analyses_json(analyses: list[Analysis], failed: list[InputError]) -> dict[str, Any]:
    """``sapper analyze --format json``: every finding, what could not be evaluated per
    log, and the totals."""
    from sapper.rules.model import Severity

    return {
        "findings": [f.to_json() for a in analyses for f in a.findings],
        # What could not be evaluated, per log: no findings is not a pass for these.
        "not_evaluated": {a.log.path: a.unevaluated for a in analyses},
        "summary": {
            "errors": count(analyses, Severity.ERROR),
            "warnings": count(analyses, Severity.WARNING),
            "infos": count(analyses, Severity.INFO),
            "logs": [a.summary() for a in analyses],
            "unreadable": [{"file": e.file, "error": str(e)} for e in failed],
        },
    }
