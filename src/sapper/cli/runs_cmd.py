"""``sapper runs``: the ledger of runs — what each planned, how it ended, and why."""

from __future__ import annotations

import typer

from sapper.cli.output import FormatOpt, OutputFormat, console, emit_json, run_guarded


def runs(
    outcome: str | None = typer.Option(
        None, "--outcome", help="Only runs that ended so: ok, failed, hung, blocked, "
        "interrupted.", show_default=False,
    ),
    cause: str | None = typer.Option(
        None, "--cause", help="Only runs whose first cause names this (a part of it).",
        show_default=False,
    ),
    limit: int = typer.Option(50, "--limit", help="At most this many, newest first."),
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """List the runs `sapper run` recorded ($SAPPER_HOME/runs.sqlite)."""

    def body() -> int:
        from rich.table import Table

        from sapper.errors import InputError
        from sapper.launch.ledger import LedgerError, ledger_path, list_runs
        from sapper.report.safe import safe_markup

        known = ("ok", "failed", "hung", "blocked", "interrupted")
        if outcome is not None and outcome not in known:
            raise InputError("unknown outcome", field="--outcome", value=outcome,
                             expected=" / ".join(known))
        try:
            rows = list_runs(outcome, cause, limit if limit > 0 else None)
        except LedgerError as exc:
            if not ledger_path().exists():
                rows = []
            else:
                raise InputError(str(exc), file=str(ledger_path())) from None
        if fmt == OutputFormat.json:
            emit_json({"ledger": str(ledger_path()), "runs": [r.to_json() for r in rows]})
            return 0
        if not rows:
            console.print(f"no runs recorded in {safe_markup(str(ledger_path()))}",
                          highlight=False)
            return 0
        table = Table(box=None, pad_edge=False)
        for col in ("date", "outcome", "cause", "model", "run folder"):
            table.add_column(col)
        for r in rows:
            table.add_row(safe_markup(r.date[:19]), safe_markup(r.outcome),
                          safe_markup(r.cause or "-"), safe_markup(r.family or "-"),
                          safe_markup(r.run_dir))
        console.print(table)
        return 0

    run_guarded(body)
