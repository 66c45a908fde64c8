"""From evidence to a ranked list of causes, or an honest ``unknown``.

The score of a cause (documented in docs/diagnose.md, calibrated by
benchmarks/diagnose_accuracy.py) is its *support* times how much of what went wrong it
*explains*:

- support adds one weight per item of evidence that points at the cause (``SUPPORT``): a
  sign found in the log counts more when it came **before** the first symptom it explains
  (a precursor) than after it (then it may be one more symptom); so does a finding of
  ``sapper inspect`` on a checkpoint, at the step it was saved; a pre-flight finding on
  the config that predicts the cause counts; a restart that came back (or did not) counts.
  A config whose checks for the cause ran clean lowers it (``CLEAN_CONFIG``, half of it
  where the run shows a strong sign of the cause).
- coverage is the share of the blow-up's symptoms (distinct rules) the cause can produce:
  a cause that explains every symptom outranks one that explains a few.
- confidence = min(support, ``MAX_SUPPORT``) × (``BASE`` + (1 − ``BASE``) × coverage).

The verdict weighs the *margin* between candidates and how much of the evidence each
explains, not an absolute score alone (:func:`_decide`):

- a cause whose confidence reaches ``CONFIDENT`` with no cause of another checklist
  topic within ``MARGIN`` is named;
- otherwise a cause is still named, as the *most likely* one, when its support is more
  than thin (``SOLID``: a strong sign that came before what it explains, a restart that
  read the same samples, a config finding the log bears out) and no cause of another
  topic explains as many of the same problems with support within ``MARGIN`` of it; the
  rival is listed as "not excluded", with the test that would decide (a cause that
  explains only other problems is no rival: it is theirs);
- a candidate whose own signs are all symptoms the named cause produces, seen no earlier
  than its evidence (a memorisation that a short data cycle explains), is its
  consequence, not its rival;
- otherwise the answer is ``unknown``: two causes explain the evidence about equally
  well, or the evidence is thin (weak signs, or one strong sign logged at the same step
  as the symptom it would explain, where it may be one more symptom). A confident wrong
  cause costs more than an honest unknown.

Problems the named cause does not explain (a leak beside a memorisation) are reasoned
over again on their own (``Reasoning.more``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sapper.diagnose.evidence import CHECKPOINT, CONFIG, LOG, ConfigEvidence, Evidence
from sapper.rules.causes import CAUSES, MIN_SIZE, STRONG, Cause
from sapper.rules.model import Severity

__all__ = ["CONFIDENT", "MARGIN", "SOLID", "Candidate", "Reasoning", "Verdict", "rank_causes"]

#: Weight of one item of evidence, by (where it was found, sign strength, timing).
SUPPORT: dict[tuple[str, str, str], float] = {
    (LOG, STRONG, "before"): 0.6,
    (LOG, STRONG, "after"): 0.35,
    (LOG, "weak", "before"): 0.2,
    (LOG, "weak", "after"): 0.1,
    (CONFIG, STRONG, ""): 0.4,
    (CONFIG, "weak", ""): 0.2,
    # An error of the pre-flight check (a value orders of magnitude outside what runs of
    # its kind use) predicts the failure as firmly as a precursor in the log.
    (CONFIG, STRONG, "error"): 0.6,
    (CONFIG, "weak", "error"): 0.2,
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
#: The config's checks for this cause ran and found nothing: evidence against it, half
#: as strong where the run itself shows a strong sign of it (a check predicts from what
#: the config states; the log measured what the loop did, which no config states, such
#: as a loss not divided by the accumulation steps).
CLEAN_CONFIG = -0.2
CLEAN_CONFIG_MEASURED = -0.1
MAX_SUPPORT = 0.95
BASE = 0.4
#: Confidence a cause needs to be named outright, and its lead over a cause of another
#: topic.
CONFIDENT = 0.5
MARGIN = 0.15
#: Support that is more than thin: a strong sign before what it explains (0.6), a
#: restart that read the same samples (0.6), a config finding the log bears out
#: (0.4 + 0.2). One strong sign at the same step as the symptom (0.35), weak signs
#: (0.2 each, two of them 0.4) or a restart without the samples (0.45) are not.
SOLID = 0.5
#: Rounds of reasoning over the problems a named cause leaves unexplained.
MAX_CAUSES = 3


class Verdict(Protocol):
    """Evidence that names its cause itself: a restart that came back (or did not), a
    measurement of where a slow step's time goes."""

    cause: str
    evidence: Evidence
    verified: bool


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
    #: How the cause was named: "confident" (its score), "most likely" (by margin and
    #: coverage), "" when none was.
    basis: str = ""
    #: The candidate of another topic the named cause did not exclude (most likely).
    rival: Candidate | None = None
    #: The reasoning over the problems the named cause does not explain.
    more: list[Reasoning] = field(default_factory=list)


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
    restarts: Sequence[Verdict],
    checkpoint: list[Evidence],
) -> Candidate | None:
    explains = [s for s in symptoms if s.code in cause.symptoms or s.code in cause.signs]
    onset = min((s.since for s in explains if s.since is not None), default=None)
    support = 0.0
    evidence: list[Evidence] = []
    notes: list[str] = []
    for e in log:
        strength = cause.signs.get(e.code)
        if strength is None or e.severity == Severity.INFO or not _large_enough(e):
            continue
        support += SUPPORT[(LOG, strength, _timing(e, explains))]
        evidence.append(e)
    if config is not None:
        for e in config.findings:
            strength = cause.signs.get(e.code)
            if strength is not None:
                level = "error" if e.severity == Severity.ERROR else ""
                support += SUPPORT[(CONFIG, strength, level)]
                evidence.append(e)
        planned = [c for c in cause.signs if c[0] in "NCDMP"]
        ran = [c for c in planned if c in config.evaluated]
        fired = {e.code for e in config.findings}
        if ran and not fired & set(planned):
            measured = any(cause.signs.get(e.code) == STRONG for e in evidence)
            support += CLEAN_CONFIG_MEASURED if measured else CLEAN_CONFIG
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


def _large_enough(e: Evidence) -> bool:
    """A sign that counts only when large (``MIN_SIZE``) went far enough past its line."""
    gate = MIN_SIZE.get(e.code)
    return gate is None or e.size is None or e.size >= gate


def _codes(evidence: list[Evidence]) -> set[str]:
    return {e.code for e in evidence}


def _downstream(top: Candidate, other: Candidate) -> bool:
    """Whether ``other`` is a consequence of ``top``: every sign of ``other`` is a
    symptom ``top`` produces, and none of it came before ``top``'s evidence."""
    signs = {e.code for e in other.evidence if e.kind != CONFIG}
    if not signs or not signs <= top.cause.symptoms:
        return False
    if top.first_step is None or other.first_step is None:
        return False
    return other.first_step >= top.first_step


def _decide(candidates: list[Candidate]) -> tuple[Candidate | None, str, str, Candidate | None]:
    """The named candidate (or None), why none was, the basis, and the rival not excluded
    (the module doc)."""
    top = candidates[0]
    mine = _codes(top.explains)
    # A rival offers another explanation of the same problems: a cause of another topic
    # that explains some of them and is not their consequence. One that explains only
    # other problems is their cause, for the next round (``Reasoning.more``).
    rivals = [c for c in candidates[1:]
              if c.cause.check != top.cause.check and not _downstream(top, c)
              and (_codes(c.explains) & mine or not mine)]
    rival = rivals[0] if rivals else None
    if top.confidence >= CONFIDENT and (
        rival is None or top.confidence - rival.confidence >= MARGIN
    ):
        return top, "", "confident", None
    if not top.explains:
        return None, (f"the best candidate ({top.cause.id}) explains none of the problems "
                      "the logs show"), "", None
    if top.support < SOLID:
        return None, (f"the evidence is thin: the best candidate ({top.cause.id}) rests on "
                      f"support {top.support:.2f}, below {SOLID}"), "", None
    explained = len(mine)
    close = [c for c in rivals
             if len(_codes(c.explains)) >= explained and c.support > top.support - MARGIN]
    if close:
        other = close[0]
        return None, (f"{top.cause.id} (support {top.support:.2f}) and {other.cause.id} "
                      f"(support {other.support:.2f}) explain the run about equally"), "", None
    return top, "", "most likely", rival


def rank_causes(
    log: list[Evidence],
    config: ConfigEvidence | None,
    restarts: Sequence[Verdict],
    precision: str | None,
    checkpoint: list[Evidence] | None = None,
    measured: Sequence[Verdict] = (),
) -> Reasoning:
    """Score every cause of the map against the evidence and decide (the module doc). A
    run with no problem in its logs is diagnosed only from what they show (a strong
    sign such as wrapped position ids): a config finding alone is ``check``'s to report,
    not a cause of a failure that did not happen. ``measured``: verdicts read from the
    records themselves (where a slow step's time goes)."""
    return _rank(log, config, [*restarts, *measured], precision, checkpoint or [], set())


def _rank(
    log: list[Evidence],
    config: ConfigEvidence | None,
    verdicts: list[Verdict],
    precision: str | None,
    checkpoint: list[Evidence],
    named_before: set[str],
) -> Reasoning:
    symptoms = [e for e in log if e.is_symptom]
    if not symptoms and not any(
        e.severity != Severity.INFO and any(c.signs.get(e.code) == STRONG for c in CAUSES)
        for e in log
    ):
        return Reasoning([], [], None)
    candidates = [
        c for cause in CAUSES if _allowed(cause, precision) and cause.id not in named_before
        if (c := _candidate(cause, symptoms, log, config, verdicts, checkpoint)) is not None
    ]
    # on a tie, the cause whose evidence began first: the first cause, not a later one
    candidates.sort(key=lambda c: (-c.confidence, -c.coverage,
                                   c.first_step if c.first_step is not None else 1 << 62,
                                   c.cause.id))
    if not candidates:
        return Reasoning([], symptoms, None,
                         "no evidence in the inputs points at any cause")
    named, undecided, basis, rival = _decide(candidates)
    out = Reasoning(candidates, symptoms, named, undecided, basis, rival)
    if named is None or len(named_before) + 1 >= MAX_CAUSES:
        return out
    used = {(e.code, e.step, e.source) for e in named.evidence + named.explains}
    rest = [e for e in log if (e.code, e.step, e.source) not in used]
    if any(e.is_symptom for e in rest):
        again = _rank(rest, config, [v for v in verdicts if v.cause != named.cause.id],
                      precision, [e for e in checkpoint
                                  if (e.code, e.step, e.source) not in used],
                      named_before | {named.cause.id})
        if again.named is not None:
            out.more = [again, *again.more]
            again.more = []
    return out
