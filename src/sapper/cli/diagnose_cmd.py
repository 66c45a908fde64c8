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
    has_plan_inputs,
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
        from sapper.pipeline.run import diagnose_run, read_run
        from sapper.report.diagnosis import render_diagnosis
        from sapper.report.safe import safe_markup as escape

        hung = _hang_answer(logs, fmt)  # flight-recorder dumps: the hang answer
        if hung is not None:
            return hung
        run = read_run(logs, log_format, mapping)
        config = load_from_options(inputs) if has_plan_inputs(inputs) else None
        # --model (the run's config.json) is the model the checkpoint should fit
        result = diagnose_run(run, config, checkpoint, inputs.model)[0]
        failed = run.failed
        for exc in failed:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        if fmt == OutputFormat.json:
            emit_json(result.to_json())
        else:
            console.print(render_diagnosis(result))
        return 2 if failed else result.exit_code()

    run_guarded(body)


def _hang_answer(paths: list[Path], fmt: OutputFormat) -> int | None:
    """When a path holds PyTorch flight-recorder dumps (docs/hangs.md): print what they
    say and return the exit code (1: a hang); None when none does (the logs' diagnosis;
    with dumps, the answer is theirs and the logs are not read, unless the dumps are a
    ``sapper run`` folder's and show no hang).
    """
    from sapper.hangs import diagnose_hang
    from sapper.pipeline.logs import is_run_folder
    from sapper.report.hang import render_hang

    verdicts = [v for p in paths if p.exists() and (v := diagnose_hang(p)) is not None]
    if not verdicts:
        return None
    if not any(v.exit_code() for v in verdicts) and any(is_run_folder(p) for p in paths):
        # A run folder whose ranks dumped on the way out (a crash, a SIGTERM) with no
        # collective stuck: the run did not hang, its logs say what happened.
        return None
    if fmt == OutputFormat.json:
        emit_json(verdicts[0].to_json() if len(verdicts) == 1 else [v.to_json() for v in verdicts])
    else:
        for v in verdicts:
            console.print(render_hang(v))
    return max(v.exit_code() for v in verdicts)
