"""Pre-flight checks over a Plan (seed §5.1), one module per checklist item.

Modules in this package are imported by the rule registry (entry point
``sapper.rules: checks``); importing one registers its rules and checks.
"""

from sapper.checks.engine import CheckReport, ItemStatus, plan_check, run_checklist

__all__ = ["CheckReport", "ItemStatus", "plan_check", "run_checklist"]
