"""``sapper rules`` lists every rule; ``sapper explain CODE`` prints one."""

from __future__ import annotations

from typing import Annotated

import typer

from sapper.cli.app import (
    FormatOpt,
    IgnoreOpt,
    OutputFormat,
    SelectOpt,
    app,
    console,
    emit_json,
    run_guarded,
    split_codes,
)

# The rule registry and the renderers are imported inside the commands: ``sapper --help``
# imports every command module, and should pay for none of them.


@app.command("rules")
def rules(
    fmt: FormatOpt = OutputFormat.text,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
) -> None:
    """List every rule with its code, checklist item, severity and title."""

    def body() -> int:
        from rich.table import Table

        from sapper.rules.registry import all_rules, select_rules

        table_rules = all_rules()
        kept = select_rules([r.code for r in table_rules], split_codes(select), split_codes(ignore))
        chosen = [r for r in table_rules if r.code in kept]
        if fmt == OutputFormat.json:
            emit_json([r.model_dump(mode="json") for r in chosen])
            return 0
        table = Table(box=None, header_style="bold")
        for col in ("code", "check", "severity", "name", "title"):
            table.add_column(col)
        for r in chosen:
            table.add_row(r.code, r.check, r.severity.value, r.name, r.title)
        console.print(table)
        return 0

    run_guarded(body)


@app.command("explain")
def explain(
    code: Annotated[str, typer.Argument(help="A rule code, e.g. N102.")],
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Why it explodes, the early signs, and how to defuse it — for one rule."""

    def body() -> int:
        from sapper.rules.registry import get_rule

        rule = get_rule(code)
        if fmt == OutputFormat.json:
            emit_json(rule.model_dump(mode="json"))
        else:
            from sapper.report.terminal import render_rule

            console.print(render_rule(rule))
        return 0

    run_guarded(body)
