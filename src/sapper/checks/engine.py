"""Pre-flight checks: functions of a Plan that return findings, each tied to rules.

A check module declares its :class:`Rule` objects and decorates its check functions with
:func:`plan_check`; :func:`run_checklist` runs them all over a loaded plan. A check that
needs a value the plan does not have returns nothing: it never guesses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sapper.plan.schema import Plan
from sapper.rules.model import CHECKLIST_ITEMS, Finding, Rule, Severity
from sapper.rules.registry import load_rules, register, select_rules

if TYPE_CHECKING:  # the loaders (YAML, HF, DeepSpeed) are not needed to list rules
    from sapper.plan.load import LoadedPlan

__all__ = ["CheckReport", "ItemStatus", "plan_check", "run_checklist"]

PlanCheckFn = Callable[[Plan], Iterable[Finding]]


@dataclass(frozen=True)
class _PlanCheck:
    rules: tuple[Rule, ...]
    fn: PlanCheckFn


_CHECKS: list[_PlanCheck] = []


def plan_check(*rules: Rule) -> Callable[[PlanCheckFn], PlanCheckFn]:
    """Register ``fn`` as the check that fires ``rules`` (registered here too)."""
    for rule in rules:
        register(rule)

    def deco(fn: PlanCheckFn) -> PlanCheckFn:
        if not any(c.fn is fn for c in _CHECKS):
            _CHECKS.append(_PlanCheck(rules, fn))
        return fn

    return deco


@dataclass
class ItemStatus:
    """One checklist item's verdict: ``fail`` (an error), ``warn``, or ``pass``."""

    item: str
    status: str
    findings: list[Finding] = field(default_factory=list)


@dataclass
class CheckReport:
    plan: Plan
    findings: list[Finding]
    sources: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(f.severity == Severity.ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == Severity.WARNING for f in self.findings)

    def items(self) -> list[ItemStatus]:
        """The seven checklist items in order, then any other topic that has findings."""
        topics = list(CHECKLIST_ITEMS) + sorted(
            {f.check for f in self.findings} - set(CHECKLIST_ITEMS)
        )
        out = []
        for topic in topics:
            found = [f for f in self.findings if f.check == topic]
            worst = max((f.severity.rank for f in found), default=-1)
            status = {2: "fail", 1: "warn"}.get(worst, "pass")
            out.append(ItemStatus(topic, status, found))
        return out

    def exit_code(self, strict: bool = False) -> int:
        if self.errors or (strict and self.warnings):
            return 1
        return 0

    def to_json(self) -> dict[str, object]:
        return {
            "findings": [f.to_json() for f in self.findings],
            "summary": {
                "errors": self.errors,
                "warnings": self.warnings,
                "infos": sum(f.severity == Severity.INFO for f in self.findings),
                "items": {i.item: i.status for i in self.items()},
                "derived": self.plan.derived(),
                "sources": self.sources,
                "unresolved": list(self.plan.unresolved),
            },
        }


def _order(f: Finding) -> tuple[int, int, str]:
    item = CHECKLIST_ITEMS.index(f.check) if f.check in CHECKLIST_ITEMS else len(CHECKLIST_ITEMS)
    return (item, -f.severity.rank, f.code)


def run_checklist(
    loaded: LoadedPlan, select: Iterable[str] = (), ignore: Iterable[str] = ()
) -> CheckReport:
    """Run every registered plan check; keep the codes ``select``/``ignore`` allow."""
    load_rules()
    findings = list(loaded.findings)
    for check in _CHECKS:
        findings.extend(check.fn(loaded.plan))
    kept = select_rules({f.code for f in findings}, select, ignore)
    findings = sorted((f for f in findings if f.code in kept), key=_order)
    return CheckReport(loaded.plan, findings, loaded.sources)
