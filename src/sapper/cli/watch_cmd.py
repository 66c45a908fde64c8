"""``sapper watch PATH``: follow a training log while it grows and name each mine as it shows.

For jobs the user cannot modify: point it at the log the job writes (a sapper run log,
a Megatron-LM stdout log, a console log (HF Trainer, nanoGPT, torchtitan), a CSV/JSON-lines
table, a TensorBoard run folder, a ``trainer_state.json`` or the Trainer's output folder)
or pipe the job's output into it
(``torchrun ... | tee train.log | sapper watch -``). The same detectors as ``sapper
analyze`` run on each new record. It stops on Ctrl-C, at the end of a pipe, or after
``--idle-timeout`` seconds without new data, and exits like ``sapper analyze``: 1 when
an error was found (warnings too under ``--strict``), 0 otherwise, 2 on bad input.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sapper.cli.analyze_cmd import (
    LogFormatOpt,
    MapOpt,
    has_plan_inputs,
    with_log_plan_options,
)
from sapper.cli.options import PlanInputs, load_from_options
from sapper.cli.output import IgnoreOpt, SelectOpt, console, run_guarded, split_codes
from sapper.errors import InputError

__all__ = ["watch"]


def _choice(value: str, allowed: tuple[str, ...] | list[str], option: str) -> str:
    if value not in allowed:
        raise InputError("unknown value", field=option, value=value, expected=" / ".join(allowed))
    return value


@with_log_plan_options
def watch(
    inputs: PlanInputs,
    path: Annotated[
        str,
        typer.Argument(
            help="The log to follow ('-' for stdin): sapper run log, Megatron log, CSV/JSONL "
            "table, TensorBoard run folder, trainer_state.json or a HF output folder. It "
            "may not exist yet.",
            show_default=False,
        ),
    ],
    poll: float = typer.Option(1.0, "--poll", help="Seconds between two looks at the log."),
    idle_timeout: float = typer.Option(
        600.0,
        "--idle-timeout",
        help="Stop after this many seconds without new data (also while waiting for the "
        "log to appear); 0 never stops.",
    ),
    view: str = typer.Option(
        "auto", "--format", "-f", help="Output: auto (live on a terminal, else plain), "
        "live, plain (one line per event) or json (JSON lines)."
    ),
    log_format: LogFormatOpt = None,
    mapping: MapOpt = None,
    exec_cmd: str | None = typer.Option(
        None,
        "--exec",
        help="Shell command run on each finding at --exec-on severity or above, with the "
        "finding as JSON on stdin and SAPPER_CODE/SEVERITY/STEP/MESSAGE/LOG set "
        "(e.g. 'scancel $SLURM_JOB_ID').",
        show_default=False,
    ),
    exec_on: str = typer.Option(
        "error", "--exec-on", help="Lowest severity that runs --exec: error, warning or info."
    ),
    exec_timeout: float = typer.Option(
        60.0, "--exec-timeout", help="Seconds an --exec command may run before it is killed."
    ),
    exec_existing: bool = typer.Option(
        False,
        "--exec-existing",
        help="Run --exec for findings already in the log when the watch started too (by "
        "default only for what the job writes after: a resumed job is not cancelled for "
        "its previous attempt's findings).",
    ),
    findings_out: str | None = typer.Option(
        None,
        "--findings-out",
        help="Append each finding to this JSONL file as it fires.",
        show_default=False,
    ),
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
) -> None:
    """Follow a growing training log and report each finding as soon as it shows."""

    def body() -> int:
        # Imported here so ``sapper --help`` does not load the watcher.
        from sapper.pipeline.logs import column_mapping, detectors_for
        from sapper.rules.model import Severity
        from sapper.watch import (
            ExecAction,
            FindingsFile,
            Watcher,
            WatchSink,
            make_view,
            open_follower,
        )
        from sapper.watch.live import VIEWS

        severities = {s.value: s for s in Severity}
        kind = _choice(view, VIEWS, "--format")
        severity = severities[_choice(exec_on, list(severities), "--exec-on")]
        plan = load_from_options(inputs).plan if has_plan_inputs(inputs) else None
        follower = open_follower(path, log_format, column_mapping(mapping))
        sinks: list[WatchSink] = []
        if exec_cmd is not None:
            sinks.append(ExecAction(exec_cmd, severity, exec_timeout, existing=exec_existing))
        if findings_out:
            sinks.append(FindingsFile(findings_out))
        sinks.append(make_view(kind, sys.stdout, console))
        watcher = Watcher(
            follower,
            plan=plan,
            detectors=detectors_for,
            select=split_codes(select),
            ignore=split_codes(ignore, "--ignore"),
            poll=poll,
            idle_timeout=idle_timeout,
            sinks=sinks,
        )
        result = watcher.run()
        errors, warnings = result.count(Severity.ERROR), result.count(Severity.WARNING)
        return 1 if errors or (strict and warnings) else 0

    run_guarded(body)
