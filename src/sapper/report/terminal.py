"""Terminal rendering of findings and check reports (rich), separate from printing."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sapper.checks.engine import CheckReport, ItemStatus
from sapper.model.derived import derived
from sapper.plan.flags import describe_input
from sapper.report.safe import safe_markup
from sapper.rules.model import Finding, Rule, Severity

__all__ = [
    "SEVERITY_STYLE",
    "render_check_report",
    "render_findings",
    "render_rule",
    "safe_markup",
]

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_STATUS = {
    "pass": "[green]PASS[/]",
    "warn": "[yellow]WARN[/]",
    "fail": "[bold red]FAIL[/]",
    "unknown": "[magenta]UNKNOWN[/]",
}


def _where(f: Finding) -> str:
    parts = []
    if f.step is not None:
        parts.append(f"step {f.step}")
    if f.rank is not None:
        parts.append(f"rank {f.rank}")
    return f" ({', '.join(parts)})" if parts else ""


_safe = safe_markup


def render_findings(findings: Iterable[Finding]) -> Group:
    """Each finding: code, severity, message with its numbers, then the fix."""
    lines = []
    for f in findings:
        style = SEVERITY_STYLE[f.severity]
        lines.append(
            Text.from_markup(
                f"  [{style}]{f.code} {f.severity.value}[/]{_safe(_where(f))}: {_safe(f.message)}"
            )
        )
        lines.append(Text.from_markup(f"      [dim]fix:[/] {_safe(f.fix)}"))
    return Group(*lines)


def _short_need(field: str) -> str:
    """``--model`` for ``model (--model config.json or a model section)``: the flag that
    gives a field, or the field itself."""
    how = describe_input(field)
    if "(" in how:
        flag = how[how.index("(") + 1 :].split()[0].rstrip(")")
        if flag.startswith("--"):
            return flag
    return field


def _status(item: ItemStatus) -> str:
    """The item's verdict; one whose checks ran clean while others lacked inputs reads
    ``PASS (1 check not run: N204 needs --model)``, not the ``UNKNOWN`` of an item where
    nothing could be checked."""
    if not item.unverified or (item.status == "unknown" and not item.partial):
        return _STATUS[item.status]
    shown = _STATUS["pass"] if item.status == "unknown" else _STATUS[item.status]
    parts = []
    for u in item.unverified:
        codes = "/".join(u.codes) if len(u.codes) <= 3 else f"{u.codes[0]}…{u.codes[-1]}"
        needs = ", ".join(dict.fromkeys(_short_need(m) for m in u.missing))
        verb = "needs" if len(u.codes) == 1 else "need"
        parts.append(f"{codes} {verb} {needs}")
    n = len(item.unverified)
    return f"{shown} ({n} check{'s' if n > 1 else ''} not run: {_safe('; '.join(parts))})"


def render_check_report(report: CheckReport) -> Group:
    parts: list[object] = []
    shown = {k: v for k, v in derived(report.plan).items() if v is not None}
    if shown:
        facts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in shown.items())
        parts.append(Text.from_markup(f"[bold]{_safe(report.plan.name or 'plan')}[/]: {facts}"))
    if report.plan.unresolved:
        parts.append(Text(f"unresolved ('auto'): {', '.join(report.plan.unresolved)}", style="dim"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("findings", justify="right")
    for item in report.items():
        table.add_row(item.item, _status(item), str(len(item.findings)))
    parts.append(table)
    for item in report.items():
        if item.findings or item.unverified:
            parts.append(Text.from_markup(f"\n[bold]{item.item}[/]"))
        if item.findings:
            parts.append(render_findings(item.findings))
        for u in item.unverified:
            needs = ", ".join(describe_input(m) for m in u.missing)
            parts.append(
                Text.from_markup(
                    f"  [magenta]not checked[/] ({'/'.join(u.codes)}): {_safe(u.what)}"
                    f"\n      [dim]needs:[/] {_safe(needs)}"
                )
            )
    summary = f"\n{report.errors} error(s), {report.warnings} warning(s)"
    if report.unverified:
        summary += (
            f", {len(report.unverified)} check(s) not run for lack of inputs: "
            + ", ".join(report.missing_inputs())
        )
    style = "bold red" if report.errors else ("bold magenta" if report.unverified else "bold green")
    parts.append(Text(summary, style=style))
    return Group(*parts)


def render_rule(rule: Rule, links: dict[str, list[dict[str, str]]] | None = None) -> Panel:
    """A rule's explanation; ``links``: its place in the causal map
    (:func:`sapper.rules.causes.causal_links`), what ``sapper diagnose`` reads it as."""
    body = Text.from_markup(
        f"[bold]{escape(rule.title)}[/]\n"
        f"check: {rule.check} · default severity: {rule.severity.value}"
        + (f" · seed {rule.seed}" if rule.seed else "")
        + f"\n\n[bold]Why it explodes[/]\n{escape(rule.why.strip())}"
        + f"\n\n[bold]Early signs[/]\n{escape(rule.signs.strip())}"
        + f"\n\n[bold]How to defuse[/]\n{escape(rule.fix.strip())}"
        + _causal_section(links or {})
    )
    return Panel(body, title=f"{rule.code} {rule.name}", title_align="left")


def _causal_section(links: dict[str, list[dict[str, str]]]) -> str:
    """One line per cause the rule is a sign or a symptom of (or both)."""
    roles: dict[str, list[str]] = {}
    titles: dict[str, str] = {}
    for link in links.get("sign_of", []):
        roles.setdefault(link["cause"], []).append(f"{link['strength']} sign")
        titles[link["cause"]] = link["title"]
    for link in links.get("symptom_of", []):
        roles.setdefault(link["cause"], []).append("symptom")
        titles[link["cause"]] = link["title"]
    if not roles:
        return ""
    lines = [
        f"  {' and '.join(r)} of [bold]{escape(cause)}[/]: {escape(titles[cause])}"
        for cause, r in roles.items()
    ]
    return "\n\n[bold]In sapper diagnose[/] (the causal map)\n" + "\n".join(lines)
