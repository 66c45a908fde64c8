"""``sapper check``: the pre-flight checklist of seed §5.1 over a planned job."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from sapper.cli.options import PlanInputs, load_from_options, with_plan_options
from sapper.cli.output import (
    FormatOpt,
    IgnoreOpt,
    OutputFormat,
    SelectOpt,
    console,
    emit_json,
    run_guarded,
    split_codes,
)

if TYPE_CHECKING:
    from sapper.plan.load import LoadedPlan


@with_plan_options
def check(
    inputs: PlanInputs,
    fmt: FormatOpt = OutputFormat.text,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
) -> None:
    """Run the pre-flight checklist: precision, clipping, init, normalization, memory,
    parallel layout, data."""

    def body() -> int:
        # Imported here so ``sapper --help`` does not load the checklist.
        from sapper.checks.engine import run_checklist
        from sapper.report.terminal import render_check_report

        chosen, dropped = split_codes(select), split_codes(ignore, "--ignore")
        loaded = load_from_options(inputs)
        report = run_checklist(loaded, chosen, dropped)
        if fmt == OutputFormat.json:
            emit_json(report.to_json())
        else:
            console.print(render_check_report(report))
            _ledger_matches(loaded)
        return report.exit_code(strict)

    run_guarded(body)


def _ledger_matches(loaded: LoadedPlan) -> None:
    """Say when this plan repeats one that blew up in a recorded run (``sapper run``'s
    ledger): same model family and the settings the earlier cause named. Silent when
    there is no ledger."""
    from sapper.launch.ledger import fingerprint, matches
    from sapper.report.safe import safe_markup

    for match in matches(fingerprint(loaded.plan)):
        console.print(f"[yellow]history:[/] {safe_markup(match.line())}", highlight=False)
