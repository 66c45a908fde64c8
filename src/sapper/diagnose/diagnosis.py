"""``diagnose``: the logs' analyses and the config's checklist in, one answer out.

The answer is a :class:`Diagnosis`: the causes ranked (one named cause, or an ``unknown``
that lists the candidates and the test that would decide), the symptoms they explain,
and a summary. Its JSON is the stable contract of ``sapper diagnose --format json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sapper.diagnose.evidence import (
    ConfigEvidence,
    Evidence,
    checkpoint_evidence,
    config_evidence,
    log_evidence,
)
from sapper.diagnose.onset import series
from sapper.diagnose.reason import Candidate, Reasoning, rank_causes
from sapper.diagnose.restarts import restart_verdicts
from sapper.diagnose.slow import Bottleneck, slow_verdicts
from sapper.rules.causes import BLOW_UP, causes_of, produced_by, question_of

if TYPE_CHECKING:
    from sapper.checkpoint.inspect import InspectResult
    from sapper.checks.engine import CheckReport
    from sapper.logs.analysis import Analysis
    from sapper.plan.schema import Plan

__all__ = ["Diagnosis", "diagnose", "run_precision"]

#: Candidates listed under an ``unknown`` answer and under "also considered".
MAX_CONSIDERED = 4


@dataclass
class Diagnosis:
    reasoning: Reasoning
    logs: list[str]
    config: str | None
    precision: str | None
    #: Warnings of analyze that are no blow-up and that no cause explains (told, not judged).
    other: list[Evidence] = field(default_factory=list)
    #: The checkpoints ``sapper inspect`` read for evidence.
    checkpoints: list[str] = field(default_factory=list)
    #: Where a slow run's step time goes, largest share first (empty when not slow).
    bottlenecks: list[Bottleneck] = field(default_factory=list)
    #: How the logs' columns were read (a memory column in bytes, ``throughput`` as
    #: tokens/s) and the numeric columns no field took: what the answer rests on.
    columns: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.causes_json()

    @property
    def onset(self) -> int | None:
        return min((s.since for s in self.reasoning.symptoms if s.since is not None),
                   default=None)

    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    @property
    def question(self) -> str | None:
        """Which of the three questions the run's problems raise (seed §1): a blow-up,
        not-learning (a loss that never fell, memorisation), slow, memory; ``None``
        when nothing is wrong."""
        codes = {s.code for s in self.reasoning.symptoms}
        return question_of(codes) if codes else None

    def _named_json(self, r: Reasoning) -> dict[str, Any]:
        """A named cause with how it was named and what it did not exclude."""
        assert r.named is not None
        out = self._cause_json(r.named)
        out["basis"] = r.basis
        explained = {s.code for s in r.named.explains}
        out["unexplained"] = sorted({s.code for s in r.symptoms} - explained
                                    - {e.code for e in r.named.evidence})
        if r.rival is not None:
            out["not_excluded"] = [{
                "cause": r.rival.cause.id, "title": r.rival.cause.title,
                "confidence": r.rival.confidence,
                "explains": sorted({s.code for s in r.rival.explains}),
                "would_decide": r.rival.cause.next_test,
            }]
            out["notes"] = [*out["notes"], (
                f"most likely {r.named.cause.id}: it explains "
                f"{', '.join(sorted(explained)) or 'its own signs'}; not excluded: "
                f"{r.rival.cause.id} (what would decide: {r.rival.cause.next_test})")]
        elif r.basis == "most likely":
            out["notes"] = [*out["notes"], (
                f"most likely {r.named.cause.id}: no other cause explains as much of the "
                "evidence")]
        return out

    def _cause_json(self, c: Candidate) -> dict[str, Any]:
        onset = min((s.since for s in c.explains if s.since is not None), default=None)
        lead = onset - c.first_step if onset is not None and c.first_step is not None else None
        return {
            "check": c.cause.check,
            "cause": c.cause.id,
            "code": c.evidence[0].code,
            "title": c.cause.title,
            "confidence": c.confidence,
            "first_step": c.first_step,
            "steps_before_symptom": lead,
            "evidence": _chain(c),
            "explains": sorted({s.code for s in c.explains}),
            "fix": c.cause.fix,
            "next_test": c.cause.next_test,
            "notes": c.notes,
        }

    def causes_json(self) -> list[dict[str, Any]]:
        r = self.reasoning
        if r.named is not None:
            return [self._named_json(x) for x in (r, *r.more) if x.named is not None]
        if not self._worth_an_answer():
            return []
        tests = [c.cause.next_test for c in r.candidates[:2]] or [
            "re-run the first failing step from the last good checkpoint with the same "
            "batch; if it does not reproduce, suspect the hardware"
        ]
        return [{
            "check": "unknown",
            "cause": "unknown",
            "code": None,
            "title": "The inputs cannot tell the cause apart",
            "confidence": None,
            "first_step": self.onset,
            "steps_before_symptom": 0 if self.onset is not None else None,
            "evidence": [e.to_json() for e in r.symptoms],
            "explains": sorted({s.code for s in r.symptoms}),
            "fix": "; then ".join(tests),
            "next_test": tests[0],
            "notes": [r.undecided],
            "candidates": [self._cause_json(c) for c in r.candidates[:MAX_CONSIDERED]],
        }]

    def _worth_an_answer(self) -> bool:
        """An undecided run deserves an ``unknown`` answer when it broke (an error-level
        symptom) or when some evidence points somewhere; a lone warning that nothing
        explains (one spike in a healthy-looking run) is told, not diagnosed."""
        r = self.reasoning
        return bool(r.candidates) or any(s.severity.rank >= 2 for s in r.symptoms)

    def _uncovered(self, causes: list[dict[str, Any]]) -> list[Evidence]:
        """The problems the named causes leave unexplained, told beside them (when no
        cause is named the problems are the answer's own list)."""
        if not causes:
            return []
        covered = {code for c in causes
                   for code in [*c["explains"], *(e["code"] for e in c["evidence"])]}
        return [s for s in self.reasoning.symptoms if s.code not in covered]

    def open_questions(self) -> list[dict[str, Any]]:
        """The problems no answer covers (told, not diagnosed), each with the causes
        that can produce it and the tests that would decide between them: what to do
        next when the inputs do not say."""
        covered: set[str] = set()
        for c in self.causes_json():
            covered |= set(c["explains"]) | {e["code"] for e in c["evidence"]}
        out = []
        for s in self.reasoning.symptoms:
            if s.code in covered:
                continue
            could = [c for c in produced_by(s.code) + [c for c, _ in causes_of(s.code)]
                     if not c.needs_precision or self.precision in (None, *c.needs_precision)]
            seen: dict[str, str] = {}
            for c in could:
                seen.setdefault(c.id, c.next_test)
            if seen:
                out.append({"code": s.code, "step": s.step, "could_be": list(seen)[:4],
                            "to_decide": list(seen.values())[:2]})
        return out

    def considered(self) -> list[Candidate]:
        """The other candidates of the first round, less the causes named after it."""
        r = self.reasoning
        named = {x.named.cause.id for x in (r, *r.more) if x.named is not None}
        return [c for c in r.candidates if c.cause.id not in named][:MAX_CONSIDERED]

    def to_json(self) -> dict[str, Any]:
        causes = self.causes_json()
        return {
            "causes": causes,
            "considered": [self._cause_json(c) for c in self.considered()]
            if self.reasoning.named is not None else [],
            "symptoms": [s.to_json() for s in self.reasoning.symptoms],
            "summary": {
                # "unexplained": a blow-up finding no answer covers; other warnings that
                # are only told (a noisy loss) leave the run "healthy", as before
                "verdict": causes[0]["cause"] if causes else (
                    "unexplained" if any(s.code in BLOW_UP for s in self.reasoning.symptoms)
                    else "healthy"),
                "onset": self.onset,
                "logs": self.logs,
                "config": self.config,
                "checkpoints": self.checkpoints,
                "precision": self.precision,
                "undecided": self.reasoning.undecided or None,
                "other_findings": [e.to_json() for e in self.other + self._uncovered(causes)],
                "question": self.question,
                "bottlenecks": [b.to_json() for b in self.bottlenecks],
                "columns": self.columns,
                "open": self.open_questions(),
            },
        }


def _chain(c: Candidate) -> list[dict[str, Any]]:
    """The evidence chain: the signs that point at the cause and the symptoms it
    explains, in time order (config findings first: they were there before step 0)."""
    signs = [(e, "sign") for e in c.evidence]
    seen = {(e.code, e.step, e.source) for e in c.evidence}
    symptoms = [(e, "symptom") for e in c.explains if (e.code, e.step, e.source) not in seen]
    items = sorted(signs + symptoms, key=lambda p: (p[0].since is not None, p[0].since or 0))
    return [{**e.to_json(), "role": role} for e, role in items]


#: The notes of a log reader that say how its columns were read.
COLUMN_NOTES = ("columns read as:", "numeric columns no field reads")

#: Records at the start of each attempt searched for the precision the monitor saw.
PRECISION_RECORDS = 50


def _monitored_precision(analysis: Analysis) -> str | None:
    """What a sapper run log says the forward ran in: autocast's dtype, else the
    trainable weights' (recorded at the first forward of each attempt)."""
    records = analysis.log.records
    starts = [s.attempt.start for s in analysis.attempts] or [0]
    for start in starts:
        for rec in records[start : start + PRECISION_RECORDS]:
            extra = rec.extra
            if "autocast_dtype" in extra or "param_dtype" in extra:
                found = extra.get("autocast_dtype") or extra.get("param_dtype")
                return str(found) if found in ("fp16", "bf16", "fp32") else None
    return None


def run_precision(plan: Plan | None, analyses: list[Analysis]) -> str | None:
    """The compute dtype where it is known: the plan's, when the user set it; else what
    the live monitor saw (autocast's or the weights' dtype); else fp16 when a log shows
    a dynamic loss scale other than 1 (only fp16 scales)."""
    if plan is not None and "dtype" in plan.precision.model_fields_set:
        return plan.precision.dtype
    for a in analyses:
        seen = _monitored_precision(a)
        if seen is not None:
            return seen
    for a in analyses:
        scales = series(a.log, "loss_scale", 0, len(a.log.records))
        if any(scale not in (0.0, 1.0) for _, scale in scales):
            return "fp16"
    return None


def diagnose(
    analyses: list[Analysis],
    report: CheckReport | None = None,
    checked: list[str] | None = None,
    inspected: InspectResult | None = None,
) -> Diagnosis:
    """The cause of what the logs show, with the config's pre-flight findings (``report``
    over the plan check codes ``checked``) as evidence when a config was given, and the
    findings of ``sapper inspect`` on the run's checkpoint(s) (``inspected``)."""
    config: ConfigEvidence | None = None
    if report is not None:
        config = config_evidence(report, checked or [])
    log = log_evidence(analyses)
    precision = run_precision(report.plan if report is not None else None, analyses)
    stored = checkpoint_evidence(inspected) if inspected is not None else []
    measured, ranked = slow_verdicts(analyses)
    reasoning = rank_causes(log, config, restart_verdicts(analyses), precision, stored,
                            measured)
    explained = {e.code for c in reasoning.candidates for e in c.evidence}
    explained |= {s.code for s in reasoning.symptoms}
    # What the logs or the checkpoint show that no cause explains is still listed: a
    # checkpoint that does not fit its model (K013) is news whatever blew up.
    other = [e for e in log + stored if e.code not in explained and e.severity.rank >= 1]
    return Diagnosis(
        reasoning,
        [a.log.path for a in analyses],
        config.source if config is not None else None,
        precision,
        other,
        [c.path for c in inspected.checkpoints] if inspected is not None else [],
        ranked,
        [n for a in analyses for n in a.log.notes if n.startswith(COLUMN_NOTES)],
    )
