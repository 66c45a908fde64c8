"""The terminal answer of ``sapper diagnose`` over flight-recorder dumps: the stuck
collective and the suspect ranks first, then what every listed rank was doing, the fix
and what would confirm it. Rendered from the verdict's JSON, the same data ``--format
json`` prints."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from sapper.hangs import HangVerdict
from sapper.report.safe import safe_markup as escape

__all__ = ["render_hang"]


def _sizes(sizes: list[list[int]] | None) -> str:
    if not sizes:
        return "-"
    return ", ".join("x".join(map(str, s)) or "scalar" for s in sizes)


def render_hang(verdict: HangVerdict) -> Group:
    data = verdict.to_json()
    summary = data["summary"]
    head = Text.from_markup(
        f"[dim]{escape(summary['dumps'])}: {summary['ranks']} rank dump(s), "
        f"{summary['stacks_files']} stacks file(s), format "
        f"{escape(', '.join(summary['format_versions']) or '?')}[/]")  # fmt: skip
    if not data["causes"]:
        line = escape(summary["headline"].removeprefix("no hang: "))
        return Group(head, Text.from_markup(f"[bold green]No hang:[/] {line}"))
    c = data["causes"][0]
    col = c["collective"]
    if col is None:  # nothing recorded: what is missing, and how to get it
        return Group(head, Text.from_markup(
            f"[bold yellow]Unknown:[/] {escape(c['notes'][0])}"),
            Text.from_markup(f"[bold]To decide:[/] {escape(c['next_test'])}"))  # fmt: skip
    conf = f" · confidence {c['confidence']:.2f}" if c["confidence"] is not None else ""
    parts: list[Any] = [head, Text.from_markup(
        f"[bold red]Hang:[/] [bold]{escape(c['title'])}[/]  "
        f"[dim]({c['check']} · {escape(c['cause'])}{conf})[/]")]  # fmt: skip
    parts.append(Text.from_markup(f"  {escape(c['notes'][0])}"))
    ranks = col["ranks"]
    more = f" … ({len(ranks)} ranks)" if len(ranks) > 16 else ""
    shown = ", ".join(map(str, ranks[:16])) + more
    parts.append(Text.from_markup(
        f"[bold]Stuck in:[/] process group {escape(col['process_group'])} "
        f"({escape(col['desc'] or '-')}; ranks {shown}), #{col['seq']} "
        f"{escape(col['op'] or '?')} of {escape(_sizes(col['input_sizes']))} "
        f"{escape('/'.join(col['dtypes'] or []))}"))  # fmt: skip
    parts.append(Text("Ranks:"))
    for e in c["evidence"]:
        mark = "[bold red]suspect[/]" if e.get("suspect") else "       "
        rank = f"{e['rank']:>6}" if e["rank"] is not None else "      "
        parts.append(Text.from_markup(f"  {rank} {mark} {escape(e['message'])}"))
    for note in c["notes"][1:]:
        parts.append(Text.from_markup(f"[dim]note:[/] {escape(note)}"))
    parts.append(Text.from_markup(f"[bold]Fix:[/] {escape(c['fix'])}"))
    parts.append(Text.from_markup(f"[bold]To confirm:[/] {escape(c['next_test'])}"))
    return Group(*parts)
