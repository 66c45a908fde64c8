"""sapper: clears the mines in large-model training before they go off.

Before training, :func:`sapper.plan.load_plan` and :func:`sapper.checks.run_checklist`
run the pre-flight checklist over a planned job; during training, the runtime detectors
(:mod:`sapper.runtime`) watch the first steps; :class:`sapper.Monitor` feeds them from
inside a PyTorch training loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.version import __version__ as __version__

if TYPE_CHECKING:
    from sapper.errors import InputError, SapperError
    from sapper.monitor import Monitor, SapperHalt
    from sapper.plan import LoadedPlan, Plan, load_plan
    from sapper.rules import Finding, Rule, Severity

__all__ = [
    "Finding",
    "InputError",
    "LoadedPlan",
    "Monitor",
    "Plan",
    "Rule",
    "SapperError",
    "SapperHalt",
    "Severity",
    "load_plan",
]

#: Every export is lazy: importing any ``sapper.*`` module runs this file first, and
#: ``sapper --help`` or ``sapper rules`` must not pay for the plan schema (pydantic, YAML)
#: nor the monitor (torch) just because ``sapper.errors`` lives in this package.
_LAZY = {
    "Finding": "sapper.rules",
    "InputError": "sapper.errors",
    "LoadedPlan": "sapper.plan",
    "Monitor": "sapper.monitor",
    "Plan": "sapper.plan",
    "Rule": "sapper.rules",
    "SapperError": "sapper.errors",
    "SapperHalt": "sapper.monitor",
    "Severity": "sapper.rules",
    "load_plan": "sapper.plan",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'sapper' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
