"""Terminal rendering of a smoke report (rich), separate from printing.

The report renders whole (:func:`render_smoke_report`) or in the three parts a streaming
caller prints as the run goes: the header once the toy is built, one table per check as it
finishes, the fixes and the summary at the end."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sapper.smoke.runner import CheckOutcome, SmokeReport

__all__ = [
    "render_footer",
    "render_header",
    "render_outcomes",
    "render_smoke_report",
    "shapes_text",
]

_STATUS = {"pass": "[green]PASS[/]", "warn": "[yellow]WARN[/]", "fail": "[bold red]FAIL[/]"}


def shapes_text(report: SmokeReport) -> str:
    """The micro-batches as the source gave them: ``4 × 64 tokens``, or each shape when
    they differ (a loader pads every batch to its own longest)."""
    shapes = report.batch_shapes
    if not shapes:
        cfg = report.config
        return f"micro-batch {cfg.micro_batch} × {cfg.seq_len} tokens"
    distinct = list(dict.fromkeys(f"{b} × {t}" for b, t in shapes))
    if len(distinct) == 1:
        return f"micro-batch {distinct[0]} tokens"
    return f"micro-batches {', '.join(distinct)} tokens"


def render_header(report: SmokeReport) -> Group:
    """The toy, the data and the settings."""
    cfg = report.config
    parts: list[object] = [
        Text.from_markup(
            f"[bold]{escape(report.model)}[/]: {report.num_params:,} parameters, vocab "
            f"{report.vocab_size}, {escape(shapes_text(report))} ({escape(report.data)}), "
            f"{cfg.device}, seed {cfg.seed}"
        )
    ]
    if report.notes:
        parts.append(Text("toy: " + ", ".join(report.notes), style="dim"))
    return Group(*parts)


def render_outcomes(outcomes: list[CheckOutcome], show_header: bool = True) -> Table:
    """One row per finding with its numbers (fixed-width leading columns, so tables printed
    one check at a time line up)."""
    table = Table(show_header=show_header, header_style="bold", box=None, pad_edge=False)
    table.add_column("check", min_width=13)
    table.add_column("code", min_width=4)
    table.add_column("status", min_width=6)
    table.add_column("s", justify="right", min_width=5)
    table.add_column("result", overflow="fold")
    for outcome in outcomes:
        for i, f in enumerate(outcome.findings):
            status = str(f.data.get("status", "fail"))
            table.add_row(
                outcome.name if i == 0 else "",
                f.code,
                _STATUS.get(status, status),
                f"{outcome.seconds:.1f}" if i == 0 else "",
                escape(f.message),
            )
    return table


def render_footer(report: SmokeReport) -> Group:
    """The fix of every failure or warning, then the counts."""
    parts: list[object] = []
    failing = [f for f in report.findings if f.data.get("status") in ("fail", "warn")]
    for f in failing:
        head = f"\n[bold]{f.code}[/] {escape(f.title)}"
        parts.append(Text.from_markup(f"{head}\n  [dim]fix:[/] {escape(f.fix)}"))
    summary = f"\n{report.errors} error(s), {report.warnings} warning(s)"
    parts.append(Text(summary, style="bold red" if report.errors else "bold green"))
    return Group(*parts)


def render_smoke_report(report: SmokeReport) -> Group:
    """Header (the toy), one row per finding with its numbers, then the fixes of failures."""
    return Group(render_header(report), render_outcomes(report.outcomes), render_footer(report))
