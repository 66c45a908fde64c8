"""Terminal rendering of a smoke report (rich), separate from printing."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sapper.smoke.runner import SmokeReport

__all__ = ["render_smoke_report"]

_STATUS = {"pass": "[green]PASS[/]", "warn": "[yellow]WARN[/]", "fail": "[bold red]FAIL[/]"}


def render_smoke_report(report: SmokeReport) -> Group:
    """Header (the toy), one row per finding with its numbers, then the fixes of failures."""
    parts: list[object] = []
    cfg = report.config
    parts.append(
        Text.from_markup(
            f"[bold]{escape(report.model)}[/]: {report.num_params:,} parameters, vocab "
            f"{report.vocab_size}, micro-batch {cfg.micro_batch} × {cfg.seq_len} tokens, "
            f"{cfg.device}, seed {cfg.seed}"
        )
    )
    if report.notes:
        parts.append(Text("toy: " + ", ".join(report.notes), style="dim"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("check")
    table.add_column("code")
    table.add_column("status")
    table.add_column("s", justify="right")
    table.add_column("result", overflow="fold")
    for outcome in report.outcomes:
        for i, f in enumerate(outcome.findings):
            status = str(f.data.get("status", "fail"))
            table.add_row(
                outcome.name if i == 0 else "",
                f.code,
                _STATUS.get(status, status),
                f"{outcome.seconds:.1f}" if i == 0 else "",
                escape(f.message),
            )
    parts.append(table)
    failing = [f for f in report.findings if f.data.get("status") in ("fail", "warn")]
    for f in failing:
        head = f"\n[bold]{f.code}[/] {escape(f.title)}"
        parts.append(Text.from_markup(f"{head}\n  [dim]fix:[/] {escape(f.fix)}"))
    summary = f"\n{report.errors} error(s), {report.warnings} warning(s)"
    parts.append(Text(summary, style="bold red" if report.errors else "bold green"))
    return Group(*parts)
