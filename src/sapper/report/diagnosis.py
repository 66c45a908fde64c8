"""The terminal narrative of ``sapper diagnose``: read top to bottom, cause first, then
the evidence chain in time order, the fix and the test that confirms it, and what else
was considered."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from sapper.diagnose.diagnosis import Diagnosis
from sapper.report.safe import safe_markup as escape

__all__ = ["render_diagnosis"]


def _step(step: Any, began: Any = None) -> str:
    if not isinstance(step, int):
        return "config"
    return f"steps {began:,}–{step:,}" if isinstance(began, int) else f"step {step:,}"


def _since(e: dict[str, Any]) -> tuple[bool, int]:
    when = e.get("began", e["step"])
    return (when is not None, when or 0)


def _evidence(
    items: list[dict[str, Any]], logs: list[str], indent: str = "  "
) -> list[Text]:
    """One line per item in time order; the source is named unless it is the only log."""
    lines = []
    ordered = sorted(items, key=_since)
    for e in ordered:
        more = f" (×{e['count']})" if e.get("count", 1) > 1 else ""
        role = "sign" if e.get("role") == "sign" else ""
        where = "" if logs == [e["source"]] else f"  [dim]{escape(e['source'])}[/]"
        lines.append(Text.from_markup(
            f"{indent}[bold]{_step(e['step'], e.get('began')):>12}[/]  {escape(e['code'])}{more} "
            f"[cyan]{role:4}[/] {escape(e['message'])}{where}"
        ))
    return lines


#: The headline per question (seed §1), for a run that did not blow up.
QUESTIONS = {
    "not-learning": "Why the loss does not go down (or the model only memorises)",
    "slow": "Why the run is slow",
    "memory": "Why memory runs out",
}


def _cause(c: dict[str, Any], logs: list[str], label: str = "Cause") -> list[Any]:
    likely = "most likely: " if c.get("basis") == "most likely" else ""
    parts: list[Any] = [Text.from_markup(
        f"[bold red]{label}:[/] {likely}[bold]{escape(c['title'])}[/]  "
        f"[dim]({c['check']} · {c['cause']} · confidence {c['confidence']:.2f})[/]"
    )]
    lead = c.get("steps_before_symptom")
    if c["first_step"] is not None:
        when = f"  its evidence begins at step {c['first_step']:,}"
        if lead:
            when += f", {lead:,} steps before the first symptom it explains"
        parts.append(Text(when))
    parts.append(Text("Evidence, in time order:"))
    parts += _evidence(c["evidence"], logs)
    parts.append(Text.from_markup(f"[bold]Fix:[/] {escape(c['fix'])}"))
    parts.append(Text.from_markup(f"[bold]To confirm:[/] {escape(c['next_test'])}"))
    for other in c.get("not_excluded", []):
        parts.append(Text.from_markup(
            f"[bold]Not excluded:[/] {escape(other['title'])} [dim]({other['cause']} · "
            f"explains {', '.join(other['explains']) or 'nothing'})[/]; what would decide: "
            f"{escape(other['would_decide'])}"))
    if c.get("unexplained"):
        parts.append(Text.from_markup(
            f"  [dim]it does not explain: {escape(', '.join(c['unexplained']))}[/]"))
    for note in c["notes"]:
        if note.startswith("most likely"):
            continue  # said by the headline and the "not excluded" line
        parts.append(Text.from_markup(f"  [dim]note: {escape(note)}[/]"))
    return parts


def _bottlenecks(items: list[dict[str, Any]]) -> list[Any]:
    """Where a slow run's step time goes, largest share first."""
    if not items:
        return []
    parts: list[Any] = [Text("Where the slow steps' time goes:")]
    for b in items:
        parts.append(Text.from_markup(
            f"  {100 * b['share']:5.0f}%  [bold]{escape(b['name'])}[/]  {escape(b['detail'])}"))
    return parts


def _considered(items: list[dict[str, Any]], heading: str, logs: list[str]) -> list[Any]:
    """Each candidate with its score and its signs (the symptoms are listed above)."""
    if not items:
        return []
    parts: list[Any] = [Text(heading)]
    for c in items:
        parts.append(Text.from_markup(
            f"  - {escape(c['title'])} [dim]({c['check']} · {c['cause']} · confidence "
            f"{c['confidence']:.2f})[/]; explains {', '.join(c['explains']) or 'nothing'}"
        ))
        parts += _evidence([e for e in c["evidence"] if e["role"] == "sign"], logs, "    ")
    return parts


def render_diagnosis(diagnosis: Diagnosis) -> Group:
    doc = diagnosis.to_json()
    logs = doc["summary"]["logs"]
    parts: list[Any] = [Text.from_markup(
        f"[bold]{escape(', '.join(doc['summary']['logs']))}[/]"
        + (f" with {escape(doc['summary']['config'])}" if doc["summary"]["config"] else "")
    )]
    causes = doc["causes"]
    question = doc["summary"].get("question")
    if question in QUESTIONS and causes:
        parts.append(Text(QUESTIONS[question] + ":", style="bold"))
    if not causes and not doc["symptoms"]:
        parts.append(Text("Nothing to explain: no problem in the logs, no cause named.",
                          style="bold green"))
    elif not causes:
        parts.append(Text("No cause named: these warnings are all there is, and nothing in "
                          "the inputs points at a cause (told, not judged):", style="yellow"))
        parts += _evidence(doc["symptoms"], logs)
    elif causes[0]["check"] == "unknown":
        u = causes[0]
        parts.append(Text.from_markup(
            f"[bold magenta]Cause: unknown[/] — {escape(u['title'].lower())} "
            f"[dim]({escape(u['notes'][0])})[/]"
        ))
        parts.append(Text("Symptoms:"))
        parts += _evidence(u["evidence"], logs)
        parts += _considered(u["candidates"], "Candidates:", logs)
        parts.append(Text.from_markup(f"[bold]Next test:[/] {escape(u['next_test'])}"))
    else:
        parts += _cause(causes[0], logs)
        for i, more in enumerate(causes[1:], 2):
            parts.append(Text(""))
            parts += _cause(more, logs, f"Cause {i} (of what the first leaves unexplained)")
        parts += _considered(doc["considered"], "Also considered (ranked lower):", logs)
    parts += _bottlenecks(doc["summary"].get("bottlenecks", []))
    for note in doc["summary"].get("columns", []):
        parts.append(Text.from_markup(f"[dim]{escape(note)}[/]"))
    if doc["summary"]["other_findings"]:
        parts.append(Text("Other findings of analyze (no cause points at them):", style="dim"))
        parts += _evidence(doc["summary"]["other_findings"], logs)
    for q in doc["summary"].get("open", []):
        parts.append(Text.from_markup(
            f"[bold]{escape(q['code'])}[/] could come from: {escape(', '.join(q['could_be']))}; "
            f"to decide: {escape('; or '.join(q['to_decide']))}"))
    return Group(*parts)
