"""Rules, findings and the registry every check and detector reports through."""

from sapper.rules.model import CHECKLIST_ITEMS, Finding, Rule, Severity
from sapper.rules.registry import all_rules, get_rule, register, select_rules

__all__ = [
    "CHECKLIST_ITEMS",
    "Finding",
    "Rule",
    "Severity",
    "all_rules",
    "get_rule",
    "register",
    "select_rules",
]
