"""The one table of rules, filled through the ``sapper.rules`` entry-point group.

Built-in rule modules are registered in sapper's own ``pyproject.toml`` under the same
entry-point group a third-party package would use (the pytest/pluggy way), so
``sapper rules`` lists built-in and plug-in rules alike.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from importlib.metadata import entry_points

from sapper.errors import InputError
from sapper.rules.model import Rule

__all__ = ["all_rules", "check_patterns", "get_rule", "register", "select_rules"]

_RULES: dict[str, Rule] = {}
_loaded = False


def register(rule: Rule) -> Rule:
    """Add a rule to the table; a code may be registered once (re-registering the same
    rule object, as a module reload does, is allowed)."""
    existing = _RULES.get(rule.code)
    if existing is not None and existing != rule:
        raise ValueError(f"rule code {rule.code} registered twice ({existing.name}, {rule.name})")
    _RULES[rule.code] = rule
    return rule


def _import_tree(module_name: str) -> None:
    module = importlib.import_module(module_name)
    path = getattr(module, "__path__", None)
    if path is None:
        return
    for info in pkgutil.walk_packages(path, prefix=module.__name__ + "."):
        importlib.import_module(info.name)


def load_rules() -> None:
    """Import every module named in the ``sapper.rules`` entry points (and their
    sub-modules), once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group="sapper.rules"):
        _import_tree(ep.value)


def all_rules() -> list[Rule]:
    load_rules()
    return sorted(_RULES.values(), key=lambda r: r.code)


def get_rule(code: str) -> Rule:
    load_rules()
    rule = _RULES.get(code.upper())
    if rule is None:
        known = ", ".join(r.code for r in all_rules()[:8])
        raise InputError(
            "unknown rule code",
            field="CODE",
            value=code,
            expected=f"a code listed by `sapper rules` (e.g. {known}, ...)",
        )
    return rule


def check_patterns(patterns: Iterable[str], option: str) -> None:
    """Refuse a ``--select``/``--ignore`` entry that is no rule's code or prefix: a typo
    (``--select ZZZ``, ``--select N1O3``) would otherwise select nothing and report PASS."""
    codes = [r.code for r in all_rules()]
    for pattern in patterns:
        wanted = pattern.strip().upper()
        if wanted and not any(code.startswith(wanted) for code in codes):
            prefixes = ", ".join(sorted({c[0] for c in codes}))
            raise InputError(
                "unknown rule code or prefix",
                field=option,
                value=pattern,
                expected=f"a code or prefix listed by `sapper rules` (prefixes {prefixes})",
            )


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(code.startswith(p.strip().upper()) for p in patterns if p.strip())


def select_rules(
    codes: Iterable[str], select: Iterable[str] = (), ignore: Iterable[str] = ()
) -> set[str]:
    """Codes kept by ``--select`` (codes or prefixes; empty keeps all) minus ``--ignore``."""
    select, ignore = list(select), list(ignore)
    kept = {c for c in codes if not select or _matches(c, select)}
    return {c for c in kept if not _matches(c, ignore)}
