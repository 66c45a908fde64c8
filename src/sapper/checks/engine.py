"""Pre-flight checks: functions of a Plan that return findings, each tied to rules.

A check module declares its :class:`Rule` objects and decorates its check functions with
:func:`plan_check`; :func:`run_checklist` runs them all over a loaded plan. A check that
needs a value the plan does not have never guesses and never passes silently: it yields
:func:`not_evaluated` naming the inputs it lacks, and its checklist item reads ``unknown``
instead of ``pass`` (an unverified item is not a PASS; a false PASS is what burns GPU-days).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sapper.model.derived import derived
from sapper.plan.schema import Plan
from sapper.rules.model import CHECKLIST_ITEMS, Finding, Rule, Severity
from sapper.rules.registry import load_rules, register, select_rules

if TYPE_CHECKING:  # the loaders (YAML, HF, DeepSpeed) are not needed to list rules
    from sapper.plan.load import LoadedPlan

__all__ = [
    "DERIVED_FIELDS",
    "CheckOutput",
    "CheckReport",
    "ItemStatus",
    "NotEvaluated",
    "Unverified",
    "not_evaluated",
    "plan_check",
    "plan_check_codes",
    "plan_values",
    "run_checklist",
    "summary_derived",
]


@dataclass(frozen=True)
class NotEvaluated:
    """Yielded by a check that could not run: what it could not verify, and the plan
    fields (dotted paths, e.g. ``hardware.gpu``) that would let it."""

    what: str
    missing: tuple[str, ...]


def not_evaluated(what: str, *missing: str) -> NotEvaluated:
    return NotEvaluated(what, tuple(missing))


@dataclass(frozen=True)
class Unverified:
    """A check of the report that did not run: its item, its rule codes and what it lacks."""

    item: str
    codes: tuple[str, ...]
    what: str
    missing: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "item": self.item,
            "codes": list(self.codes),
            "what": self.what,
            "missing": list(self.missing),
        }


PlanCheckFn = Callable[[Plan], Iterable[Finding | NotEvaluated]]
#: What a plan check function returns.
CheckOutput = Iterator[Finding | NotEvaluated]


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
    """One checklist item's verdict: ``fail`` (an error), ``warn``, ``unknown`` (a check
    it owns could not run for lack of inputs), or ``pass``."""

    item: str
    status: str
    findings: list[Finding] = field(default_factory=list)
    unverified: list[Unverified] = field(default_factory=list)
    #: How many of the item's checks ran.
    evaluated: int = 0

    @property
    def partial(self) -> bool:
        """Some of the item's checks ran and some could not."""
        return bool(self.unverified) and self.evaluated > 0


@dataclass
class CheckReport:
    plan: Plan
    findings: list[Finding]
    sources: list[str] = field(default_factory=list)
    unverified: list[Unverified] = field(default_factory=list)
    #: Dotted Plan field -> where its value came from (``LoadedPlan.origins``).
    origins: dict[str, str] = field(default_factory=dict)
    #: Checklist item -> how many of its checks ran (gave findings or found nothing).
    evaluated: dict[str, int] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(f.severity == Severity.ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == Severity.WARNING for f in self.findings)

    def items(self) -> list[ItemStatus]:
        """The seven checklist items in order, then any other topic that has findings or
        checks that ran or could not (the optimizer's learning-rate check: a clean or
        unverified item is shown, never left out)."""
        extra = {f.check for f in self.findings} | {u.item for u in self.unverified}
        topics = list(CHECKLIST_ITEMS) + sorted(
            (extra | set(self.evaluated)) - set(CHECKLIST_ITEMS)
        )
        out = []
        for topic in topics:
            found = [f for f in self.findings if f.check == topic]
            open_ = [u for u in self.unverified if u.item == topic]
            worst = max((f.severity.rank for f in found), default=-1)
            status = {2: "fail", 1: "warn"}.get(worst, "unknown" if open_ else "pass")
            out.append(ItemStatus(topic, status, found, open_, self.evaluated.get(topic, 0)))
        return out

    def partial(self) -> dict[str, list[str]]:
        """Items of which some checks ran and some could not: item -> the rule codes of
        the checks that did not run (an ``unknown`` item here passed every check it ran)."""
        return {
            i.item: list(dict.fromkeys(c for u in i.unverified for c in u.codes))
            for i in self.items()
            if i.partial
        }

    def missing_inputs(self) -> list[str]:
        """Every plan field some check lacked, in first-seen order."""
        return list(dict.fromkeys(m for u in self.unverified for m in u.missing))

    def exit_code(self, strict: bool = False) -> int:
        """1 on errors; under ``strict`` also on warnings and on checks that could not run."""
        if self.errors or (strict and (self.warnings or self.unverified)):
            return 1
        return 0

    def to_json(self) -> dict[str, object]:
        values, where = plan_values(self.plan, self.origins)
        return {
            "findings": [f.to_json() for f in self.findings],
            "plan": values,
            "origins": where,
            "summary": {
                "errors": self.errors,
                "warnings": self.warnings,
                "infos": sum(f.severity == Severity.INFO for f in self.findings),
                "items": {i.item: i.status for i in self.items()},
                "derived": summary_derived(self.plan),
                "sources": self.sources,
                "unresolved": list(dict.fromkeys([*self.plan.unresolved,
                                                  *self.missing_inputs()])),
                "not_evaluated": [u.to_json() for u in self.unverified],
                "partial": self.partial(),
            },
        }


#: ``summary.derived`` key -> the Plan field it reads (None: computed from several).
DERIVED_FIELDS: dict[str, str | None] = {
    "tp": "parallel.tp",
    "pp": "parallel.pp",
    "cp": "parallel.cp",
    "ep": "parallel.ep",
    "dp": None,
    "world_size": None,
    "micro_batch": "batch.micro_batch_size",
    "gradient_accumulation": None,
    "global_batch": None,
    "seq_len": "batch.seq_len",
    "tokens_per_step": None,
    "dtype": "precision.dtype",
    "zero_stage": "parallel.zero_stage",
    "checkpointing": "parallel.checkpointing.granularity",
    "lr": "optimizer.lr",
    "warmup_steps": "schedule.warmup_steps",
    "max_grad_norm": "clipping.max_norm",
    "parameters": None,
    "active_parameters": None,
}


#: How each computed value is computed, for its ``derived:`` comment.
DERIVED_HOW = {
    "dp": "world_size / (tp x pp x cp)",
    "world_size": "hardware.num_gpus (or nodes x gpus_per_node)",
    "gradient_accumulation": "global_batch / (micro_batch x dp)",
    "global_batch": "micro_batch x gradient_accumulation x dp",
    "tokens_per_step": "global_batch x seq_len",
    "parameters": "the model's shape",
    "active_parameters": "the model's shape, experts_top_k of num_experts",
}


def _get(plan: Plan, path: str) -> Any:
    node: Any = plan
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return getattr(node, "value", node)  # an enum's value


def _unknown(plan: Plan, path: str) -> bool:
    return any(path == u or path.startswith(u + ".") for u in plan.unresolved)


def summary_derived(plan: Plan) -> dict[str, Any]:
    """The numbers every report shows: each key of :data:`DERIVED_FIELDS`, ``None`` where
    the plan does not know it (a field the sources left unresolved is ``None`` even when
    the Plan has a default for it: a default is not what the job runs with). ZeRO stage 3
    is also FSDP's full sharding."""
    base = derived(plan)
    out: dict[str, Any] = {}
    for key, path in DERIVED_FIELDS.items():
        if path is None:
            out[key] = base.get(key)
        else:
            out[key] = None if _unknown(plan, path) else _get(plan, path)
    return out


def plan_values(plan: Plan, origins: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the sources set (and what a framework filled in from them) in the Plan's
    shape, and the origin of each leaf (dotted path): ``file: key``, ``--flag``, or
    ``derived: ...``. Fields left at the Plan's defaults are not listed."""
    from sapper.plan.sources import leaves

    values = plan.model_dump(mode="json", exclude_unset=True, exclude={"unresolved"})
    where: dict[str, str] = {}
    for leaf in leaves(values):
        probe, origin = leaf, None
        while probe and origin is None:
            origin = origins.get(probe)
            probe = probe.rpartition(".")[0]
        where[leaf] = origin or "derived: sapper fills it in from the other values"
    return values, where


def _order(f: Finding) -> tuple[int, int, str]:
    item = CHECKLIST_ITEMS.index(f.check) if f.check in CHECKLIST_ITEMS else len(CHECKLIST_ITEMS)
    return (item, -f.severity.rank, f.code)


def plan_check_codes() -> list[str]:
    """Every rule code a registered plan check can fire (what ``run_checklist`` looked
    for: a code here that did not fire and is not unverified ran clean)."""
    load_rules()
    return [r.code for c in _CHECKS for r in c.rules]


def run_checklist(
    loaded: LoadedPlan, select: Iterable[str] = (), ignore: Iterable[str] = ()
) -> CheckReport:
    """Run every registered plan check; keep the codes ``select``/``ignore`` allow."""
    load_rules()
    findings = list(loaded.findings)
    unverified: list[Unverified] = []
    ran: list[_PlanCheck] = []
    for check in _CHECKS:
        found = lacked = False
        for out in check.fn(loaded.plan):
            if isinstance(out, NotEvaluated):
                codes = tuple(r.code for r in check.rules)
                unverified.append(Unverified(check.rules[0].check, codes, out.what, out.missing))
                lacked = True
            else:
                findings.append(out)
                found = True
        if found or not lacked:
            ran.append(check)
    codes = {f.code for f in findings} | {c for u in unverified for c in u.codes}
    codes |= {r.code for c in ran for r in c.rules}
    kept = select_rules(codes, select, ignore)
    findings = sorted((f for f in findings if f.code in kept), key=_order)
    unverified = [u for u in unverified if any(c in kept for c in u.codes)]
    evaluated: dict[str, int] = {}
    for check in ran:
        if any(r.code in kept for r in check.rules):
            item = check.rules[0].check
            evaluated[item] = evaluated.get(item, 0) + 1
    return CheckReport(
        loaded.plan,
        findings,
        loaded.sources,
        unverified,
        origins=dict(getattr(loaded, "origins", {})),
        evaluated=evaluated,
    )
