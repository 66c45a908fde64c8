"""A run's logs as one run: read, analyzed (each rank and the ranks together) and
diagnosed, with the run's config and checkpoint as evidence when they are given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sapper.errors import InputError
from sapper.pipeline.logs import (
    analyze_logs,
    column_mapping,
    cross_rank_analysis,
    load_logs,
    merge_logs,
    stored_plan,
)

if TYPE_CHECKING:
    from sapper.checkpoint.inspect import InspectResult
    from sapper.checks.engine import CheckReport
    from sapper.diagnose.diagnosis import Diagnosis
    from sapper.logs import LogData
    from sapper.logs.analysis import Analysis
    from sapper.plan.load import LoadedPlan

__all__ = ["RunLogs", "diagnose_run", "read_run"]


@dataclass
class RunLogs:
    """The logs of one run, read: ``logs`` as one history each (a resumed run's files
    merged into one, per-rank logs kept apart), ``cross`` the ranks analyzed together,
    ``failed`` the files that could not be read."""

    logs: list[LogData]
    cross: Analysis | None
    failed: list[InputError] = field(default_factory=list)


def read_run(
    paths: list[Path],
    log_format: str | None = None,
    mapping: list[str] | None = None,
) -> RunLogs:
    """Read every log of ``paths`` as one run: several files of one rank are one
    history with several attempts; per-rank logs of one folder stay apart and are also
    lined up by step for the cross-rank detectors. Raises the first error when nothing
    could be read."""
    loaded, failed = load_logs(
        paths, log_format, column_mapping(mapping), columnar=len(paths) == 1
    )
    if not loaded:
        raise failed[0]
    cross = cross_rank_analysis(loaded, [], [])
    one_run = [merge_logs(loaded)] if len(loaded) > 1 and cross is None else loaded
    return RunLogs(one_run, cross, failed)


def diagnose_run(
    run: RunLogs,
    config: LoadedPlan | None,
    checkpoints: list[Path] | None = None,
    model_config: Path | None = None,
) -> tuple[Diagnosis, list[Analysis], CheckReport | None]:
    """The diagnosis of a read run: its analyses, the pre-flight checklist of its config
    (``config``, else the plan a sapper run log stores), and what ``sapper inspect``
    finds in its checkpoint(s) (against ``model_config``, the run's config.json)."""
    from sapper.checks.engine import plan_check_codes, run_checklist
    from sapper.diagnose.diagnosis import diagnose
    from sapper.plan.load import LoadedPlan

    if config is None:
        stored = stored_plan(run.logs)
        config = LoadedPlan(stored, [], ["the plan in the run log"]) if stored else None
    plan = config.plan if config is not None else None
    analyses = analyze_logs(run.logs, plan, [], [])
    if run.cross is not None:
        analyses.append(run.cross)
    report = run_checklist(config) if config is not None else None
    inspected: InspectResult | None = None
    if checkpoints:
        from sapper.checkpoint import inspect_paths

        inspected = inspect_paths(checkpoints, config=model_config)
    return diagnose(analyses, report, plan_check_codes(), inspected), analyses, report
