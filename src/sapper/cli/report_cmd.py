"""``sapper report LOG -o report.html``: one self-contained HTML page about a run.

The same reading and analysis as ``sapper analyze`` (so the same findings), drawn as the
five curves of seed §5.2 plus loss scale and skipped steps, each finding marked where it
fired; with a plan (``--plan``, ``--model`` ...) the pre-flight checklist is summarised
and the declared LR schedule and device memory are drawn next to the measured ones.
When something blew up, ``sapper diagnose``'s answer heads the page: the cause, its
evidence as a timeline, and the span from its first sign to the symptom on the curves.
With ``--checkpoint``, what ``sapper inspect`` finds in one of the run's checkpoints: per
layer, the weights' RMS and the largest Adam update the saved moments imply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sapper.cli.analyze_cmd import (
    LogFormatOpt,
    MapOpt,
    has_plan_inputs,
    plan_for,
    with_log_plan_options,
)
from sapper.cli.diagnose_cmd import CheckpointOpt
from sapper.cli.options import PlanInputs, load_from_options
from sapper.cli.output import IgnoreOpt, SelectOpt, console, run_guarded, split_codes
from sapper.errors import InputError


@with_log_plan_options
def report(
    inputs: PlanInputs,
    logs: Annotated[
        list[Path],
        typer.Argument(
            help="The run's log (several files of one resumed run are merged).",
            show_default=False,
        ),
    ],
    output: Path = typer.Option(
        Path("sapper-report.html"), "--output", "-o", help="The HTML file to write."
    ),
    log_format: LogFormatOpt = None,
    mapping: MapOpt = None,
    expected_tokens_per_s: float | None = typer.Option(
        None,
        "--expected-tokens-per-s",
        help="The throughput you expect (tokens/s), drawn on the throughput chart.",
        show_default=False,
    ),
    title: str | None = typer.Option(None, "--title", help="Page title.", show_default=False),
    checkpoint: CheckpointOpt = None,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
) -> None:
    """Write an offline HTML report: curves, findings marked where they fired, fixes."""

    def body() -> int:
        # Imported here so ``sapper --help`` does not load the report builder.
        from sapper.checks.engine import plan_check_codes, run_checklist
        from sapper.diagnose.diagnosis import diagnose
        from sapper.pipeline.logs import (
            analyze_logs,
            column_mapping,
            first_rank,
            load_logs,
            merge_logs,
        )
        from sapper.report.html import build_report_data, write_report
        from sapper.report.safe import safe_markup as escape

        loaded, failed = load_logs(logs, log_format, column_mapping(mapping))
        if failed:
            raise failed[0]
        ranked = first_rank(loaded) if len(logs) == 1 else None
        if ranked is not None:  # a run folder of `sapper run`: its ranks are one run
            loaded = [ranked]
        if len(logs) == 1 and len(loaded) > 1:
            names = ", ".join(log.path for log in loaded[:6])
            raise InputError(
                f"this folder holds {len(loaded)} runs; a report is about one",
                file=str(logs[0]),
                expected=f"one of them: {names}",
            )
        if len(loaded) > 1:
            loaded = [merge_logs(loaded)]
        plan = plan_for(inputs, loaded)
        select_codes, ignore_codes = split_codes(select), split_codes(ignore, "--ignore")
        analysis = analyze_logs(loaded, plan, select_codes, ignore_codes)[0]
        checklist = None
        if has_plan_inputs(inputs):
            checklist = run_checklist(load_from_options(inputs), select_codes, ignore_codes)
        # The diagnosis reads every finding: --select/--ignore shape the page, not it.
        whole, config = analysis, checklist
        if select_codes or ignore_codes:
            whole = analyze_logs(loaded, plan, [], [])[0]
            config = run_checklist(load_from_options(inputs)) if checklist else None
        inspected = None
        if checkpoint:
            from sapper.checkpoint import inspect_paths

            # --model (the run's config.json) is the model the checkpoint should fit
            inspected = inspect_paths(checkpoint, config=inputs.model)
        diagnosis = diagnose([whole], config, plan_check_codes(), inspected).to_json()
        data = build_report_data(
            analysis,
            plan=plan,
            checklist=checklist,
            expected_tokens_per_s=expected_tokens_per_s,
            title=title,
            diagnosis=diagnosis,
            checkpoint=inspected,
        )
        try:
            size = write_report(output, data)
        except OSError as exc:
            problem = f"cannot write the report ({exc.strerror})"
            raise InputError(problem, file=str(output)) from None
        counts = data["counts"]
        console.print(
            f"wrote {escape(str(output))} ({size / 1024:,.0f} KiB): "
            f"{len(analysis.log.records):,} records, {counts['error']} error(s), "
            f"{counts['warning']} warning(s), {counts['info']} info",
            highlight=False,
        )
        return 0

    run_guarded(body)
