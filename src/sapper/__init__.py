"""sapper: clears the mines in large-model training before they go off.

Before training, :func:`sapper.plan.load_plan` and :func:`sapper.checks.run_checklist`
run the pre-flight checklist over a planned job; during training, the runtime detectors
(:mod:`sapper.runtime`) watch the first steps.
"""

from sapper.errors import InputError, SapperError
from sapper.plan import LoadedPlan, Plan, load_plan
from sapper.rules import Finding, Rule, Severity

__all__ = [
    "Finding",
    "InputError",
    "LoadedPlan",
    "Plan",
    "Rule",
    "SapperError",
    "Severity",
    "load_plan",
]
__version__ = "0.1.0"
