"""``sapper diagnose LOG...``: why the run blew up — the first cause, not the loudest
symptom.

Reads the logs as ``analyze`` does (all of them one run: a run resumed into new files is
one history with several attempts), runs ``check`` on the run's config when one is
given (``--config``, ``--model``, ``--deepspeed``, ``--plan``, or the plan a sapper run
log stores), and reasons over both with the causal map beside the rules
(:mod:`sapper.rules.causes`; docs/diagnose.md); ``--checkpoint`` adds what ``sapper
inspect`` finds in the run's checkpoint. Exit 0 when nothing blew up, 1 when a cause (or
``unknown``) is reported, 2 when an input cannot be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sapper.cli.analyze_cmd import (
    LogFormatOpt,
    MapOpt,
    analyze_logs,
    column_mapping,
    cross_rank_analysis,
    has_plan_inputs,
    load_logs,
    merge_logs,
    plan_for,
    with_log_plan_options,
)
from sapper.cli.options import PlanInputs, load_from_options
from sapper.cli.output import (
    FormatOpt,
    OutputFormat,
    console,
    emit_json,
    err_console,
    run_guarded,
)

#: ``--checkpoint`` of ``diagnose`` and ``report``: the run's checkpoint(s) for ``sapper inspect``.
CheckpointOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--checkpoint",
        help="A checkpoint of the run (once, or twice: an earlier and a later one), read "
        "by `sapper inspect` (against --model's config.json when given): evidence for the "
        "diagnosis (the report also draws the later one per layer).",
        show_default=False,
    ),
]


@with_log_plan_options
def diagnose(
    inputs: PlanInputs,
    logs: Annotated[
        list[Path],
        typer.Argument(
            help="The run's logs, in any format `sapper analyze` reads; several files "
            "(or attempts after restarts) are one run.",
            show_default=False,
        ),
    ],
    log_format: LogFormatOpt = None,
    mapping: MapOpt = None,
    checkpoint: CheckpointOpt = None,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Why did the run blow up? The first cause, its evidence in time order, the fix, and
    the test that confirms it — or 'unknown' with the test that would decide."""

    def body() -> int:
        from sapper.checks.engine import plan_check_codes, run_checklist
        from sapper.diagnose.diagnosis import diagnose as run_diagnosis
        from sapper.plan.load import LoadedPlan
        from sapper.report.diagnosis import render_diagnosis
        from sapper.report.safe import safe_markup as escape

        loaded, failed = load_logs(
            logs, log_format, column_mapping(mapping), columnar=len(logs) == 1
        )
        if not loaded:
            raise failed[0]
        cross = cross_rank_analysis(loaded, [], [])
        one_run = [merge_logs(loaded)] if len(loaded) > 1 and cross is None else loaded
        if has_plan_inputs(inputs):
            config = load_from_options(inputs)
        else:
            stored = plan_for(inputs, one_run)
            config = LoadedPlan(stored, [], ["the plan in the run log"]) if stored else None
        plan = config.plan if config is not None else None
        analyses = analyze_logs(one_run, plan, [], [])
        if cross is not None:
            analyses.append(cross)
        report = run_checklist(config) if config is not None else None
        inspected = None
        if checkpoint:
            from sapper.checkpoint import inspect_paths

            # --model (the run's config.json) is the model the checkpoint should fit
            inspected = inspect_paths(checkpoint, config=inputs.model)
        result = run_diagnosis(analyses, report, plan_check_codes(), inspected)
        for exc in failed:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        if fmt == OutputFormat.json:
            emit_json(result.to_json())
        else:
            console.print(render_diagnosis(result))
        return 2 if failed else result.exit_code()

    run_guarded(body)
