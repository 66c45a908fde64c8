"""The resolved plan as sapper read it, each value with where it came from (``--show-plan``).

Three parts, the same in the YAML a user reads and in the JSON a tool reads:

* ``plan``: every value the sources set (and what a framework fills in from them), in the
  Plan's own shape;
* ``origins``: dotted field -> where its value came from: ``file: key`` for a config
  file (the reader's own words for a framework default, e.g. ``optim (transformers 5.25.0
  default)``), ``--flag`` for the command line, ``derived: ...`` for what sapper computed;
* ``derived``: the numbers the checks work with (:func:`~sapper.checks.engine.summary_derived`), and
  ``unknown``: each value still unknown with why.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sapper.checks.engine import DERIVED_FIELDS, DERIVED_HOW, plan_values, summary_derived
from sapper.plan.schema import Plan
from sapper.rules.model import Finding

if TYPE_CHECKING:
    from sapper.checks.engine import Unverified

__all__ = ["plan_view", "render_plan_yaml"]

def _why_unknown(
    field: str, plan: Plan, findings: list[Finding], unverified: list[Unverified]
) -> str:
    reasons = [
        f"{Path((f.source or '').split(': ')[0]).name or f.code}: {f.message}"
        for f in findings
        if f.data.get("field") == field
    ]
    needs = sorted({c for u in unverified if field in u.missing for c in u.codes})
    if not reasons:
        reasons = [
            "left open by the config (an \"auto\" or a value set at launch: see the "
            "config findings)"
            if field in plan.unresolved
            else "not given"
        ]
    if needs:
        reasons.append("needed by " + ", ".join(needs))
    return "; ".join(reasons)


def plan_view(
    plan: Plan,
    origins: dict[str, str],
    findings: list[Finding] = (),  # type: ignore[assignment]
    unverified: list[Unverified] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """``plan``, ``origins``, ``derived`` and ``unknown`` (field -> why) of a loaded plan."""
    values, where = plan_values(plan, origins)
    missing = [u for u in plan.unresolved if not _given(u, where)]
    missing += [m for u in unverified for m in u.missing if m not in missing]
    return {
        "plan": values,
        "origins": where,
        "derived": summary_derived(plan),
        "unknown": {
            m: _why_unknown(m, plan, list(findings), list(unverified)) for m in missing
        },
    }


def _given(field: str, where: dict[str, str]) -> bool:
    """A value is now known for ``field`` (a framework filled in what a config left open)."""
    return field in where or any(k.startswith(field + ".") for k in where)


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _comment(text: str) -> str:
    return " ".join(text.split())


def render_plan_yaml(view: dict[str, Any]) -> str:
    """The view as YAML a user reads: each value with its origin as a trailing comment,
    then the derived numbers and what is still unknown, with why."""
    lines = ["# the plan as sapper read it (each value: where it came from)"]

    def walk(tree: dict[str, Any], prefix: str, indent: int) -> None:
        for key, value in tree.items():
            path = f"{prefix}{key}"
            pad = "  " * indent
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{key}:")
                walk(value, path + ".", indent + 1)
            else:
                origin = _comment(view["origins"].get(path, ""))
                lines.append(f"{pad}{key}: {_scalar(value)}  # {origin}")

    walk(view["plan"], "", 0)
    lines.append("# derived: the numbers the checks work with")
    lines.append("derived:")
    for key, value in view["derived"].items():
        if value is None:
            continue
        field = DERIVED_FIELDS[key]
        if field is None:
            how = f"derived: {DERIVED_HOW[key]}"
        else:
            how = view["origins"].get(field) or f"sapper default of {field}"
        how = _comment(how)
        lines.append(f"  {key}: {_scalar(value)}  # {how}")
    if view["unknown"]:
        lines.append("# unknown: values sapper could not read, and why")
        lines.append("unknown:")
        for field, why in view["unknown"].items():
            lines.append(f"  - {field}  # {_comment(why)}")
    return "\n".join(lines)
