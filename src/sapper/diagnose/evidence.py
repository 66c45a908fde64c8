"""What ``sapper diagnose`` reasons over: every finding of ``analyze`` on the logs and of
``check`` on the config, as :class:`Evidence` with its step and where it came from.

Findings of one rule repeat (a NaN on every later step, one spike per eval set); the first
is what orders causes in time, so each rule keeps its first finding and a count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from sapper.diagnose.onset import onset_of
from sapper.rules.causes import MONITOR_OWN
from sapper.rules.model import Finding, Severity

if TYPE_CHECKING:
    from sapper.checkpoint.inspect import InspectResult
    from sapper.checks.engine import CheckReport
    from sapper.logs.analysis import Analysis

__all__ = [
    "ConfigEvidence", "Evidence", "checkpoint_evidence", "config_evidence", "log_evidence",
]

#: Where an item of evidence comes from.
LOG, CONFIG, RESTART, CHECKPOINT = "log", "config", "restart", "checkpoint"


@dataclass(frozen=True)
class Evidence:
    """One finding as evidence: the first of its rule in one source, and how many."""

    code: str
    step: int | None
    source: str
    message: str
    severity: Severity
    kind: str
    count: int = 1
    #: The step this evidence began, read back from the records (``diagnose.onset``):
    #: a leak began before the step it was sure of. ``step`` when they do not say.
    began: int | None = None
    #: The largest value over threshold among the rule's findings (how far past its
    #: line the signal went), where they carry both; ``None`` otherwise.
    size: float | None = None

    @property
    def since(self) -> int | None:
        return self.began if self.began is not None else self.step

    @property
    def is_symptom(self) -> bool:
        """A problem of the run to explain: a finding of its logs at warning or error (a
        blow-up, a loss that never fell, memorisation, a slowdown, a leak), not an info,
        not a pre-flight finding, not the monitor's news about itself."""
        return (
            self.kind == LOG
            and self.severity != Severity.INFO
            and self.code[:1] in ("R", "X")
            and self.code not in MONITOR_OWN
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code, "step": self.step, "source": self.source,
            "message": self.message,
        }
        if self.count > 1:
            out["count"] = self.count
        if self.began is not None and self.began != self.step:
            out["began"] = self.began
        return out


def _when(f: Finding) -> tuple[int, int]:
    """A finding's place in time: its attempt (a resumed run logs earlier steps again
    later), then its step; findings without a step come last."""
    return (int(f.data.get("attempt") or 1), f.step if f.step is not None else 1 << 62)


def _first_per_code(
    findings: list[Finding], source: str, kind: str,
    began: Callable[[Finding], int | None] | None = None,
) -> list[Evidence]:
    first: dict[str, Finding] = {}
    counts: dict[str, int] = {}
    sizes: dict[str, float] = {}
    for f in sorted(findings, key=_when):
        counts[f.code] = counts.get(f.code, 0) + 1
        held = first.setdefault(f.code, f)
        if held.severity == Severity.INFO and f.severity != Severity.INFO:
            # an onset told as info, then sustained as a warning: the warning is the
            # finding (its onset is where its evidence began, ``began``)
            first[f.code] = f
        size = _size(f)
        if size is not None:
            sizes[f.code] = max(size, sizes.get(f.code, size))
    return [
        Evidence(code, f.step, f.source or source, f.message, f.severity, kind, counts[code],
                 began(f) if began is not None else None, sizes.get(code))
        for code, f in first.items()
    ]


def _size(f: Finding) -> float | None:
    """How far past its line a finding went: value over threshold, both positive."""
    value, threshold = f.value, f.threshold
    if not isinstance(value, (int, float)) or not isinstance(threshold, (int, float)):
        return None
    if not (value > 0 and threshold > 0) or value != value or value == float("inf"):
        return None
    return float(value) / float(threshold)


def log_evidence(analyses: list[Analysis]) -> list[Evidence]:
    """The logs' findings, first per rule and log, in step order, each with the step
    its evidence began."""
    out: list[Evidence] = []
    for a in analyses:
        out += _first_per_code(a.findings, a.log.path, LOG, partial(onset_of, a))
    return sorted(out, key=lambda e: (e.step is None, e.step or 0, e.code))


@dataclass(frozen=True)
class ConfigEvidence:
    """The pre-flight findings on the run's config, and the codes whose checks ran (a
    code that ran and did not fire is a clean item: it lowers the causes it would
    point at). ``None`` when no config was given: nothing is known either way."""

    findings: list[Evidence]
    evaluated: frozenset[str]
    source: str


def _declared(plan: Any, path: str) -> bool | None:
    """Whether the config set the plan field ``path`` (``clipping.max_norm``); ``None``
    when ``path`` is not a plan field."""
    node = plan
    for part in path.split("."):
        fields = getattr(node, "model_fields_set", None)
        if fields is None or part not in type(node).model_fields:
            return None
        if part not in fields:
            return False
        node = getattr(node, part)
    return True


def config_evidence(report: CheckReport, codes: list[str]) -> ConfigEvidence:
    """``report`` of ``sapper check`` over ``codes`` (every plan rule's code). A finding
    about a field the config never set ("clipping is not set" when only ``--dtype`` was
    given) is what the config does not say, not evidence of what the run did: left out,
    and its code counts as not evaluated."""
    source = ", ".join(report.sources) or "the config"
    unverified = {c for u in report.unverified for c in u.codes}
    stated = []
    for f in report.findings:
        if f.source and _declared(report.plan, f.source) is False:
            unverified.add(f.code)
        else:
            stated.append(f)
    return ConfigEvidence(
        findings=_first_per_code(stated, source, CONFIG),
        evaluated=frozenset(codes) - unverified,
        source=source,
    )


def checkpoint_evidence(result: InspectResult) -> list[Evidence]:
    """The findings of ``sapper inspect`` on the run's checkpoint(s), first per rule, at
    the step the checkpoint was saved (the trainer's, else the optimizer's) when known."""
    out: list[Evidence] = []
    for report in result.checkpoints:
        step = report.steps.get("trainer", report.steps.get("optimizer"))
        at = int(step) if step is not None else None
        mine = [f.model_copy(update={"step": at}) if f.step is None else f
                for f in report.findings]
        out += _first_per_code(mine, report.path, CHECKPOINT)
    # findings of the pair (what changed between the two checkpoints): the rest
    own = {id(f) for report in result.checkpoints for f in report.findings}
    pair = [f for f in result.findings if id(f) not in own]
    out += _first_per_code(pair, " → ".join(r.path for r in result.checkpoints), CHECKPOINT)
    return out
