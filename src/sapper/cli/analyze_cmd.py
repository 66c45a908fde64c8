"""``sapper analyze LOG...``: the live monitor's detectors over logs that already exist.

Reads each log (sapper run log, ``trainer_state.json``, TensorBoard, CSV/JSONL, Megatron,
console output; every format in :mod:`sapper.logs.registry`),
feeds its records to the same detector objects the monitor runs in the training loop,
and reports the findings like ``sapper check``: text or ``--format json``, exit 1 on
errors (or warnings under ``--strict``), 2 when an input cannot be read. A log that can
be read only in part is analyzed as far as it goes, with notes saying what was skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sapper.cli.options import PlanInputs, load_from_options, with_plan_options
from sapper.cli.output import (
    FormatOpt,
    IgnoreOpt,
    OutputFormat,
    SelectOpt,
    console,
    emit_json,
    err_console,
    run_guarded,
    split_codes,
)
from sapper.errors import InputError

# Readers, detectors, pydantic and the renderers are imported where they are used:
# ``sapper --help`` imports this module (and report/watch import its helpers), and a
# command's start-up should pay only for what that command runs.
if TYPE_CHECKING:
    from rich.console import Group

    from sapper.logs import LogData
    from sapper.logs.analysis import Analysis
    from sapper.logs.fields import FieldMap
    from sapper.plan.schema import Plan
    from sapper.rules.model import Severity
    from sapper.runtime.detector import Detector

__all__ = [
    "LOG_FORMATS",
    "LogFormatOpt",
    "MapOpt",
    "analyses_json",
    "analyze_logs",
    "column_mapping",
    "detectors_for",
    "has_plan_inputs",
    "load_logs",
    "merge_logs",
    "plan_for",
    "render_analyses",
    "with_log_plan_options",
]

#: ``sapper.logs.FORMATS``, spelled out so the option's help does not import every log
#: reader; tests/test_startup.py checks that the two agree.
LOG_FORMATS: tuple[str, ...] = (
    "sapper",
    "trainer_state",
    "tensorboard",
    "csv",
    "jsonl",
    "megatron",
    "hf_console",
    "keyvalue",
)

LogFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        help=f"Read the logs as this format instead of detecting it: {', '.join(LOG_FORMATS)}.",
        show_default=False,
    ),
]
MapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        help="Map a column or tag to a record field: COLUMN=FIELD or COLUMN=FIELD*FACTOR "
        "(e.g. --map 'mem_mb=memory_peak_gib*0.0009765625', --map iter=step, --map x=ignore).",
        show_default=False,
    ),
]
_PlanFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan", help="A sapper plan file (YAML) describing the run.", show_default=False
    ),
]


def with_log_plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``with_plan_options`` for commands whose positional arguments are logs: the plan
    file becomes ``--plan``; every other plan option (``--model``, ``--max-norm`` ...)
    stays as ``sapper check`` has it."""
    wrapped = with_plan_options(fn)
    sig = wrapped.__signature__  # type: ignore[attr-defined]
    params = [
        p.replace(annotation=_PlanFileOpt) if p.name == "plan" else p
        for p in sig.parameters.values()
    ]
    wrapped.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapped.__annotations__["plan"] = _PlanFileOpt
    return wrapped


def has_plan_inputs(inputs: PlanInputs) -> bool:
    given = [inputs.plan, inputs.model, inputs.deepspeed, *inputs.values.values()]
    return bool(inputs.configs) or any(v is not None for v in given)


def plan_for(inputs: PlanInputs, logs: list[LogData]) -> Plan | None:
    """The Plan from the command line, else the one a sapper run log carries, else None."""
    if has_plan_inputs(inputs):
        return load_from_options(inputs).plan
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


def load_logs(
    paths: list[Path],
    log_format: str | None,
    mapping: dict[str, FieldMap],
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
        expanded = expand_paths(list(paths), skipped)
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
    from sapper.distributed.detectors import default_distributed_detectors
    from sapper.distributed.offline import cross_rank_records, ranked_logs
    from sapper.logs import LogData
    from sapper.logs.analysis import analyze_log

    index = ranked_logs([log.path for log in logs])
    if index is None:
        return None
    records = cross_rank_records({r: logs[i].records for r, i in index.items()})
    folder = Path(logs[next(iter(index.values()))].path).parent
    joined = LogData(
        path=f"{folder}/rank*.jsonl ({len(index)} ranks)",
        format="sapper-ranks",
        records=records,
    )
    return analyze_log(joined, default_distributed_detectors(), select, ignore)


#: Inputs at least this large take over a second: a progress bar on a terminal.
PROGRESS_BYTES = 32 << 20


class _Progress:
    """A transient rich progress bar on stderr for a long analysis, or nothing (not a
    terminal, JSON output, small inputs)."""

    def __init__(self, paths: list[Path], enabled: bool) -> None:
        self.bar: Any = None
        if not enabled or not err_console.is_terminal:
            return
        size = 0
        for p in paths:
            try:
                size += sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if (
                    p.is_dir()
                ) else p.stat().st_size
            except OSError:
                continue
        if size < PROGRESS_BYTES:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self.reading = self.bar.add_task("reading", total=None)
        self.detecting: Any = None

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def read(self, path: str) -> None:
        if self.bar is not None:
            self.bar.update(self.reading, description=f"reading {Path(path).name}")

    def detectors(self, logs: int, per_log: int) -> Callable[[int], None] | None:
        if self.bar is None:
            return None
        self.bar.update(self.reading, total=1, completed=1)
        self.detecting = self.bar.add_task("detectors", total=logs * per_log)
        return lambda n: self.bar.advance(self.detecting, n)


def _count(analyses: list[Analysis], severity: Severity) -> int:
    return sum(a.count(severity) for a in analyses)


def render_analyses(analyses: list[Analysis]) -> Group:
    """Per log: what was read, the notes, the findings in step order; then the totals."""
    from rich.console import Group
    from rich.text import Text

    from sapper.report.terminal import render_findings
    from sapper.report.terminal import safe_markup as escape
    from sapper.rules.model import Severity

    parts: list[Any] = []
    for a in analyses:
        log = a.log
        span = f"steps {log.first_step:,}–{log.last_step:,}" if log.records else "no steps"
        every = f", every {a.interval:,} step(s)" if a.interval else ""
        if len(a.attempts) > 1:
            every += f", {len(a.attempts)} attempts"
        parts.append(
            Text.from_markup(
                f"[bold]{escape(log.path)}[/]: {escape(log.format)} log, "
                f"{len(log.records):,} records, {span}{every}"
            )
        )
        for note in a.notes:
            parts.append(Text.from_markup(f"  [yellow]note:[/] {escape(note)}"))
        for line in a.unevaluated:
            parts.append(Text.from_markup(f"  [dim]not evaluated:[/] {escape(line)}"))
        if a.findings:
            parts.append(render_findings(a.findings))
        elif a.unevaluated:
            # Silence is not a pass when rules could not look: say which could not.
            parts.append(Text("  no findings from the rules that could run", style="green"))
        else:
            parts.append(Text("  no findings", style="green"))
        if a.unevaluated:
            parts.append(Text(f"  not evaluated ({len(a.unevaluated)}):", style="yellow"))
            for line in _compact_unevaluated(a.unevaluated):
                parts.append(Text(f"    {line}", style="dim"))
        parts.append(Text(""))
    errors, warnings = _count(analyses, Severity.ERROR), _count(analyses, Severity.WARNING)
    infos = _count(analyses, Severity.INFO)
    summary = f"{errors} error(s), {warnings} warning(s), {infos} info"
    parts.append(Text(summary, style="bold red" if errors else "bold green"))
    return Group(*parts)


def _compact_unevaluated(lines: list[str]) -> list[str]:
    """The terminal's list: rules that only the live monitor's hooks can feed share one
    line (JSON keeps every line)."""
    live = [line.split(" ", 1)[0] for line in lines if "needs the live monitor" in line]
    rest = [line for line in lines if "needs the live monitor" not in line]
    if len(live) > 1:
        rest.append(
            f"{', '.join(live)}: not evaluated — they need the live monitor's hooks "
            "(sapper.Monitor in the training loop)"
        )
    else:
        rest = list(lines)
    return rest


def analyses_json(analyses: list[Analysis], failed: list[InputError]) -> dict[str, Any]:
    from sapper.rules.model import Severity

    return {
        "findings": [f.to_json() for a in analyses for f in a.findings],
        # What could not be evaluated, per log: no findings is not a pass for these.
        "not_evaluated": {a.log.path: a.unevaluated for a in analyses},
        "summary": {
            "errors": _count(analyses, Severity.ERROR),
            "warnings": _count(analyses, Severity.WARNING),
            "infos": _count(analyses, Severity.INFO),
            "logs": [a.summary() for a in analyses],
            "unreadable": [{"file": e.file, "error": str(e)} for e in failed],
        },
    }


@with_log_plan_options
def analyze(
    inputs: PlanInputs,
    logs: Annotated[
        list[Path],
        typer.Argument(
            help="Logs: sapper run log (.jsonl), trainer_state.json or a HF output folder, "
            "TensorBoard event files or run folders, CSV/JSONL tables, Megatron text logs, "
            "HF Trainer console output, 'step N | loss X' console logs (nanoGPT, torchtitan).",
            show_default=False,
        ),
    ],
    log_format: LogFormatOpt = None,
    mapping: MapOpt = None,
    merge: bool = typer.Option(
        False, "--merge", help="Treat all logs as one run (a run resumed into new files)."
    ),
    fmt: FormatOpt = OutputFormat.text,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
) -> None:
    """Run the monitor's detectors over existing training logs and name what went wrong."""

    def body() -> int:
        from sapper.report.terminal import safe_markup as escape
        from sapper.rules.model import Severity

        columns = column_mapping(mapping)
        with _Progress(logs, fmt != OutputFormat.json) as bar:
            loaded, failed = load_logs(
                logs, log_format, columns, columnar=not merge, progress=bar.read
            )
            if not loaded:
                raise failed[0]
            if merge and len(loaded) > 1:
                loaded = [merge_logs(loaded)]
            plan = plan_for(inputs, loaded)
            tick = bar.detectors(len(loaded), len(detectors_for(plan)))
            analyses = analyze_logs(
                loaded, plan, split_codes(select), split_codes(ignore, "--ignore"), progress=tick
            )
            if not merge:
                cross = cross_rank_analysis(
                    loaded, split_codes(select), split_codes(ignore, "--ignore")
                )
                if cross is not None:
                    analyses.append(cross)
        for exc in failed:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        if fmt == OutputFormat.json:
            emit_json(analyses_json(analyses, failed))
        else:
            console.print(render_analyses(analyses))
        if failed:
            return 2
        errors, warnings = _count(analyses, Severity.ERROR), _count(analyses, Severity.WARNING)
        return 1 if errors or (strict and warnings) else 0

    run_guarded(body)
