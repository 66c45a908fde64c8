"""``sapper rules`` lists every rule; ``sapper explain CODE`` prints one."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Annotated

import typer

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

# The rule registry and the renderers are imported inside the commands: ``sapper --help``
# imports every command module, and should pay for none of them.
if TYPE_CHECKING:
    from rich.text import Text

    from sapper.rules.model import Rule

_COLUMNS = ("code", "check", "severity", "name", "title")


def rules_table(rules: list[Rule], width: int) -> Text:
    """The rule list as aligned columns, the title wrapped into what the width leaves
    (on its own indented lines when that is under 30 columns).

    Laid out by hand rather than with a rich Table: measuring and wrapping 100+ rows of
    cells took ~80 ms, a third of what ``sapper rules`` may take in all."""
    from rich.text import Text

    rows = [(r.code, r.check, r.severity.value, r.name, r.title) for r in rules]
    widths = [max(len(row[i]) for row in [_COLUMNS, *rows]) for i in range(4)]
    indent = sum(widths) + 2 * len(widths) + 1
    below = width - indent - 1 < 30
    if below:
        indent = widths[0] + 3
    title_width = max(20, width - indent - 1)
    out = Text()
    for n, row in enumerate([_COLUMNS, *rows]):
        lead = " " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
        title = textwrap.wrap(row[4], title_width) or [""]
        if below:
            lines = [lead.rstrip(), *(" " * indent + t for t in title)]
        else:
            lines = [lead + "  " + title[0], *(" " * indent + t for t in title[1:])]
        out.append("\n".join(lines) + "\n", style="bold" if n == 0 else "")
    out.rstrip()
    return out


def rules(
    fmt: FormatOpt = OutputFormat.text,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
) -> None:
    """List every rule with its code, checklist item, severity and title."""

    def body() -> int:
        from sapper.rules.registry import all_rules, select_rules

        table_rules = all_rules()
        chosen_codes = split_codes(select), split_codes(ignore, "--ignore")
        kept = select_rules([r.code for r in table_rules], *chosen_codes)
        chosen = [r for r in table_rules if r.code in kept]
        if fmt == OutputFormat.json:
            emit_json([r.model_dump(mode="json") for r in chosen])
            return 0
        console.print(rules_table(chosen, console.width), highlight=False, soft_wrap=True)
        return 0

    run_guarded(body)


def explain(
    code: Annotated[str, typer.Argument(help="A rule code, e.g. N102.")],
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Why it explodes, the early signs, and how to defuse it — for one rule."""

    def body() -> int:
        from sapper.rules.causes import causal_links
        from sapper.rules.registry import get_rule

        rule = get_rule(code)
        links = causal_links(rule.code)
        if fmt == OutputFormat.json:
            emit_json({**rule.model_dump(mode="json"), "causes": links})
        else:
            from sapper.report.terminal import render_rule

            console.print(render_rule(rule, links))
        return 0

    run_guarded(body)
