"""sapper: clears the mines in large-model training before they go off.

Before training, :func:`sapper.plan.load_plan` and :func:`sapper.checks.run_checklist`
run the pre-flight checklist over a planned job; during training, the runtime detectors
(:mod:`sapper.runtime`) watch the first steps; :class:`sapper.Monitor` feeds them from
inside a PyTorch training loop.
"""

from sapper.errors import InputError, SapperError
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
__version__ = "0.1.0"

#: Exported lazily: the monitor imports torch, which ``import sapper`` (and the CLI) must
#: not pay for.
_LAZY = {"Monitor": "sapper.monitor", "SapperHalt": "sapper.monitor"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sapper' has no attribute {name!r}")
