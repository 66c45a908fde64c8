"""From evidence to a ranked list of causes, or an honest ``unknown``.

The score of a cause (documented in docs/diagnose.md, calibrated by
benchmarks/diagnose_accuracy.py) is its *support* times how much of what went wrong it
*explains*:

- support adds one weight per item of evidence that points at the cause (``SUPPORT``): a
  sign found in the log counts more when it came **before** the first symptom it explains
  (a precursor) than after it (then it may be one more symptom); so does a finding of
  ``sapper inspect`` on a checkpoint, at the step it was saved; a pre-flight finding on
  the config that predicts the cause counts; a restart that came back (or did not) counts.
  A config whose checks for the cause ran clean lowers it (``CLEAN_CONFIG``).
- coverage is the share of the blow-up's symptoms (distinct rules) the cause can produce:
  a cause that explains every symptom outranks one that explains a few.
- confidence = min(support, ``MAX_SUPPORT``) × (``BASE`` + (1 − ``BASE``) × coverage).

The answer names a cause only when its confidence reaches ``CONFIDENT`` and no cause of
another checklist topic comes within ``MARGIN``; otherwise it is ``unknown``, with the
candidates, their evidence and the test that would decide. A confident wrong cause costs
more than an honest unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sapper.diagnose.evidence import CHECKPOINT, CONFIG, LOG, ConfigEvidence, Evidence
from sapper.diagnose.restarts import RestartVerdict
from sapper.rules.causes import CAUSES, STRONG, Cause
from sapper.rules.model import Severity

__all__ = ["CONFIDENT", "MARGIN", "Candidate", "Reasoning", "rank_causes"]

#: Weight of one item of evidence, by (where it was found, sign strength, timing).
SUPPORT: dict[tuple[str, str, str], float] = {
    (LOG, STRONG, "before"): 0.6,
    (LOG, STRONG, "after"): 0.35,
    (LOG, "weak", "before"): 0.2,
    (LOG, "weak", "after"): 0.1,
    (CONFIG, STRONG, ""): 0.4,
    (CONFIG, "weak", ""): 0.2,
    # The checkpoint's state is measured, not predicted: weighed as a log finding at
    # the step it was saved (no step known: as if saved after the first symptom).
    (CHECKPOINT, STRONG, "before"): 0.6,
    (CHECKPOINT, STRONG, "after"): 0.35,
    (CHECKPOINT, "weak", "before"): 0.2,
    (CHECKPOINT, "weak", "after"): 0.1,
}
#: A restart that came back (or did not) where this cause says it would; more when the
#: log shows the resumed run read the same samples (``RestartVerdict.verified``).
RESTART_WEIGHT = 0.45
RESTART_VERIFIED = 0.6
#: The config's checks for this cause ran and found nothing.
CLEAN_CONFIG = -0.2
MAX_SUPPORT = 0.95
BASE = 0.4
#: Confidence a cause needs to be named, and its lead over a cause of another topic.
CONFIDENT = 0.5
MARGIN = 0.15


@dataclass
class Candidate:
    """A cause with its score and the evidence behind it."""

    cause: Cause
    confidence: float
    support: float
    coverage: float
    evidence: list[Evidence]
    explains: list[Evidence]
    first_step: int | None
    notes: list[str] = field(default_factory=list)


@dataclass
class Reasoning:
    """Ranked candidates (best first), the blow-up's symptoms, and the verdict."""

    candidates: list[Candidate]
    symptoms: list[Evidence]
    named: Candidate | None
    #: Why no cause was named, when one was not (an empty string when one was).
    undecided: str = ""


def _timing(sign: Evidence, explains: list[Evidence]) -> str:
    """A sign that began before the first *other* symptom the cause explains is a
    precursor; one logged at the same step may be one more symptom (a logging interval
    hides their order). With nothing else to explain, the sign is the first evidence
    there is."""
    others = [s.since for s in explains if s is not sign and s.since is not None]
    if not others:
        return "before"
    if sign.since is None:
        return "after"
    return "before" if sign.since < min(others) else "after"


def _allowed(cause: Cause, precision: str | None) -> bool:
    """Framework mechanics apply only where they are in play: loss scaling only in fp16."""
    return not cause.needs_precision or precision is None or precision in cause.needs_precision


def _candidate(
    cause: Cause,
    symptoms: list[Evidence],
    log: list[Evidence],
    config: ConfigEvidence | None,
    restarts: list[RestartVerdict],
    checkpoint: list[Evidence],
) -> Candidate | None:
    explains = [s for s in symptoms if s.code in cause.symptoms or s.code in cause.signs]
    onset = min((s.since for s in explains if s.since is not None), default=None)
    support = 0.0
    evidence: list[Evidence] = []
    notes: list[str] = []
    for e in log:
        strength = cause.signs.get(e.code)
        if strength is None or e.severity == Severity.INFO:
            continue
        support += SUPPORT[(LOG, strength, _timing(e, explains))]
        evidence.append(e)
    if config is not None:
        for e in config.findings:
            strength = cause.signs.get(e.code)
            if strength is not None:
                support += SUPPORT[(CONFIG, strength, "")]
                evidence.append(e)
        planned = [c for c in cause.signs if c[0] in "NCDMP"]
        ran = [c for c in planned if c in config.evaluated]
        fired = {e.code for e in config.findings}
        if ran and not fired & set(planned):
            support += CLEAN_CONFIG
            notes.append(f"the config's checks {', '.join(ran)} ran clean")
    for e in checkpoint:
        strength = cause.signs.get(e.code)
        if strength is not None and e.severity != Severity.INFO:
            support += SUPPORT[(CHECKPOINT, strength, _timing(e, explains))]
            evidence.append(e)
    for r in restarts:
        if r.cause == cause.id:
            support += RESTART_VERIFIED if r.verified else RESTART_WEIGHT
            evidence.append(r.evidence)
    if not evidence:
        return None
    distinct = {s.code for s in symptoms}
    coverage = len({s.code for s in explains}) / len(distinct) if distinct else 1.0
    confidence = max(0.0, min(support, MAX_SUPPORT)) * (BASE + (1 - BASE) * coverage)
    steps = [e.since for e in evidence if e.since is not None and e.kind != CONFIG]
    first = min(steps, default=onset)
    return Candidate(cause, round(confidence, 2), round(support, 2), round(coverage, 2),
                     evidence, explains, first, notes)


def rank_causes(
    log: list[Evidence],
    config: ConfigEvidence | None,
    restarts: list[RestartVerdict],
    precision: str | None,
    checkpoint: list[Evidence] | None = None,
) -> Reasoning:
    """Score every cause of the map against the evidence and decide. A run with no
    blow-up is diagnosed only from what its own logs show (a strong sign such as wrapped
    position ids): a config finding alone is ``check``'s to report, not a cause of a
    blow-up that did not happen."""
    symptoms = [e for e in log if e.is_symptom]
    if not symptoms and not any(
        e.severity != Severity.INFO and any(c.signs.get(e.code) == STRONG for c in CAUSES)
        for e in log
    ):
        return Reasoning([], [], None)
    candidates = [
        c for cause in CAUSES if _allowed(cause, precision)
        if (c := _candidate(cause, symptoms, log, config, restarts, checkpoint or []))
        is not None
    ]
    candidates.sort(key=lambda c: (-c.confidence, -c.coverage, c.cause.id))
    if not candidates:
        return Reasoning([], symptoms, None,
                         "no evidence in the inputs points at any cause")
    top = candidates[0]
    if top.confidence < CONFIDENT:
        return Reasoning(candidates, symptoms, None,
                         f"the best candidate ({top.cause.id}) reaches confidence "
                         f"{top.confidence:.2f}, below {CONFIDENT}")
    rival = next((c for c in candidates[1:] if c.cause.check != top.cause.check), None)
    if rival is not None and top.confidence - rival.confidence < MARGIN:
        return Reasoning(candidates, symptoms, None,
                         f"{top.cause.id} ({top.confidence:.2f}) and {rival.cause.id} "
                         f"({rival.confidence:.2f}) explain the run about equally")
    return Reasoning(candidates, symptoms, top)
