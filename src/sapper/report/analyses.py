"""``sapper analyze``'s terminal page: per log what was read, its notes, its findings in
step order and what could not be evaluated; then the totals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group

    from sapper.logs.analysis import Analysis

__all__ = ["render_analyses"]


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
    errors, warnings, infos = (
        sum(a.count(s) for a in analyses)
        for s in (Severity.ERROR, Severity.WARNING, Severity.INFO)
    )
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
