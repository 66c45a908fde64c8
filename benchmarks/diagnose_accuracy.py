"""How often `sapper diagnose` names the right cause, beside the obvious baseline.

The labelled cases are tests/fixtures/diagnose/LABELS.yaml: planted faults in tiny real
training runs, public logs whose authors documented the cause, public blow-ups whose
cause nobody could tell from the logs, and healthy public runs. Each case runs through
the command line exactly as a user runs it (``diagnose --format json``), and through the
baseline: "the first error-severity finding of ``analyze``", read as the cause it is a
strong sign of in the causal map (a symptom such as a NaN names no cause).

Scored per method:

- top-1: named-cause cases whose first answer is that cause;
- onset error: |first_step − labelled onset| over the run's length in steps (named
  cases answered right);
- false alarms: healthy runs given any cause (``unknown`` included);
- confident wrong: a named cause that is not the labelled one (on named and
  cannot-tell cases): the worst answer there is;
- calibration: the named answers' mean confidence against their accuracy.

    python benchmarks/diagnose_accuracy.py [--json]

Each is reported for the planted faults, the public logs and all cases. Targets
(tests/diagnose/test_accuracy.py): on every case no false alarm, no confident wrong
answer, the onset within 5 % of the run's length; top-1 ≥ 90 % on the planted faults,
whose logs hold the evidence by construction; on the public logs, better than the
baseline. Public logs whose documented cause their few lines cannot show (a LoRA spike
the maintainer blamed on the LR, a 3-line fp16 NaN) are kept in, and scored as misses.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.rules.causes import CAUSES, STRONG

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
LABELS = FIXTURES / "diagnose" / "LABELS.yaml"
NAMED_TARGET, ONSET_TARGET = 0.9, 0.05


@dataclass
class Answer:
    """One method's answer on one case."""

    cause: str | None  # a cause id, "unknown", or None (no cause)
    first_step: int | None
    confidence: float | None


@dataclass
class Case:
    #: "planted" (a fault run written by make_fault_runs.py) or "public" (a real log).
    group: str
    logs: list[str]
    expect: str
    onset: int | None
    source: str
    length: int
    sapper: Answer
    baseline: Answer


def _invoke(runner: CliRunner, command: str, paths: list[str], args: list[str]) -> dict:
    res = runner.invoke(app, [command, *paths, *args, "--format", "json"])
    if res.exit_code not in (0, 1):
        raise SystemExit(f"{command} {' '.join(paths)}: exit {res.exit_code}\n{res.output}")
    return json.loads(res.stdout)


def _sapper_answer(doc: dict[str, Any]) -> Answer:
    if not doc["causes"]:
        return Answer(None, None, None)
    top = doc["causes"][0]
    return Answer(top["cause"], top["first_step"], top["confidence"])


#: The cause a code is the one strong sign of (the baseline's reading of a finding).
_STRONG_OF: dict[str, str] = {}
for _cause in CAUSES:
    for _code, _strength in _cause.signs.items():
        if _strength == STRONG:
            _STRONG_OF[_code] = _cause.id if _code not in _STRONG_OF else "ambiguous"


def _baseline_answer(doc: dict[str, Any]) -> Answer:
    """The first error-severity finding of analyze, read as the cause it strongly
    signs (or as no cause when it is a symptom). The baseline has no notion of
    'cannot tell': whatever it names, it names."""
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    if not errors:
        return Answer(None, None, None)
    first = min(errors, key=lambda f: (f.get("step") is None, f.get("step") or 0))
    cause = _STRONG_OF.get(first["code"])
    named = cause if cause not in (None, "ambiguous") else f"symptom {first['code']}"
    return Answer(named, first.get("step"), 1.0)


def _length(doc: dict[str, Any]) -> int:
    """The run's length in steps, from analyze's summary of its logs."""
    summary = doc.get("summary", {})
    spans = [
        (log.get("first_step"), log.get("last_step"))
        for log in summary.get("logs", [])
        if isinstance(log, dict)
    ]
    spans = [(a, b) for a, b in spans if isinstance(a, int) and isinstance(b, int)]
    if spans:
        return max(1, max(b for _, b in spans) - min(a for a, _ in spans) + 1)
    return 1


def run_cases(labels: Path = LABELS) -> list[Case]:
    _register_commands()
    runner = CliRunner()
    cases = []
    for item in yaml.safe_load(labels.read_text()):
        paths = [str(FIXTURES / p) for p in item["logs"]]
        args = [str(a) for a in item.get("args", [])]
        diagnosed = _invoke(runner, "diagnose", paths, args)
        analyzed = _invoke(runner, "analyze", paths, args)
        group = "planted" if item["logs"][0].startswith("diagnose/") else "public"
        cases.append(Case(group, item["logs"], item["expect"], item.get("onset"), item["source"],
                          _length(analyzed), _sapper_answer(diagnosed),
                          _baseline_answer(analyzed)))
    return cases


@dataclass
class Score:
    named: int
    top1: int
    onset_errors: list[float]
    cannot_tell: int
    healthy: int
    false_alarms: int
    confident_wrong: int
    confidences: list[tuple[float, bool]]

    @property
    def top1_rate(self) -> float:
        return self.top1 / self.named if self.named else 1.0

    @property
    def worst_onset(self) -> float:
        return max(self.onset_errors, default=0.0)


def _is_cause(answer: str | None) -> bool:
    return answer is not None and answer != "unknown" and not answer.startswith("symptom")


def score(cases: list[Case], method: str) -> Score:
    s = Score(0, 0, [], 0, 0, 0, 0, [])
    for c in cases:
        a: Answer = getattr(c, method)
        if c.expect == "healthy":
            s.healthy += 1
            s.false_alarms += a.cause is not None
            continue
        if c.expect == "cannot-tell":
            s.cannot_tell += 1
            s.confident_wrong += _is_cause(a.cause)
            continue
        s.named += 1
        right = a.cause == c.expect
        s.top1 += right
        if _is_cause(a.cause) and not right:
            s.confident_wrong += 1
        if _is_cause(a.cause) and a.confidence is not None:
            s.confidences.append((a.confidence, right))
        if right and c.onset is not None and a.first_step is not None:
            s.onset_errors.append(abs(a.first_step - c.onset) / c.length)
    return s


def _row(name: str, group: str, s: Score) -> str:
    conf = [p for p, _ in s.confidences]
    calib = (
        f"{sum(conf) / len(conf):.2f} / {sum(r for _, r in s.confidences) / len(conf):.2f}"
        if conf else "-"
    )
    return (f"| {name} | {group} | {s.top1}/{s.named} ({s.top1_rate:.0%}) | {s.worst_onset:.1%} | "
            f"{s.false_alarms}/{s.healthy} | {s.confident_wrong} | {calib} |")


def table(cases: list[Case]) -> str:
    lines = [
        "| method | cases | top-1 (named causes) | worst onset error | false alarms (healthy) "
        "| confident wrong | mean confidence / accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, name in (("sapper", "sapper diagnose"), ("baseline", "first error of analyze")):
        for group in ("planted", "public", "all"):
            chosen = [c for c in cases if group in ("all", c.group)]
            lines.append(_row(name, group, score(chosen, method)))
    lines += [
        "",
        "| case | expected | diagnose | baseline |",
        "|---|---|---|---|",
    ]
    for c in cases:
        def show(a: Answer) -> str:
            if a.cause is None:
                return "no cause"
            conf = f" {a.confidence:.2f}" if a.confidence is not None else ""
            return f"{a.cause}{conf} @ {a.first_step}"

        expected = c.expect + (f" @ {c.onset}" if c.onset is not None else "")
        lines.append(f"| {Path(c.logs[0]).name} | {expected} | {show(c.sapper)} | "
                     f"{show(c.baseline)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the cases as JSON")
    ns = parser.parse_args()
    cases = run_cases()
    if ns.json:
        json.dump([asdict(c) for c in cases], sys.stdout, indent=2)
        print()
    else:
        print(table(cases))


if __name__ == "__main__":
    main()
