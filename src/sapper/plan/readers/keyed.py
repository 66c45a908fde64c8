"""Typed access by dotted key to one parsed YAML config, shared by the readers of
llm-foundry, OLMo, Nanotron, torchtune and NeMo configs.

A value is read by the key the user wrote (``fsdp_config.sharding_strategy``), checked
against what the framework takes (:func:`sapper.plan.readers.typed.check_kind`), and
stored in the Plan with that key as its origin. For the OmegaConf-based trainers
(llm-foundry, OLMo) ``${...}`` interpolations into the same file are resolved
(:mod:`sapper.plan.readers.interpolation`); one into anything else (the environment, a
launcher, a resolver registered at launch) leaves the field unknown with C006, reported
once per key. Nanotron reads its YAML with PyYAML's SafeLoader, where ``${x}`` is only
text, so its reader turns resolution off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sapper.errors import InputError
from sapper.plan.readers.base import unknown_key_findings, unresolved_finding
from sapper.plan.readers.interpolation import MISSING, Resolver, Unresolved
from sapper.plan.readers.typed import bad_value, check_kind
from sapper.plan.sources import PlanSource

__all__ = ["MAX_NUMBER", "MISSING", "Keyed"]

#: Largest number a count or size may be (past any training config; the Plan's own bounds
#: are tighter and named in their errors).
MAX_NUMBER = 1e18


class Keyed:
    """One config document, read key by key into ``src``."""

    def __init__(self, doc: dict[str, Any], src: PlanSource, *, fix: str,
                 interpolate: bool = True, max_number: float | None = MAX_NUMBER) -> None:
        self.doc, self.src, self.file, self.fix = doc, src, src.name, fix
        self.resolver = Resolver(doc) if interpolate else None
        self.reported: set[str] = set()
        #: The cap on counts and sizes with no bound of their own (None: the Plan's).
        self.max_number = max_number

    # -- reading ------------------------------------------------------------------
    def raw(self, key: str) -> Any:
        """The (resolved) value at ``key``, :data:`MISSING`, or an :class:`Unresolved`."""
        if self.resolver is not None:
            return self.resolver.get(key)
        node: Any = self.doc
        for part in key.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return MISSING
        return node

    def given(self, key: str) -> bool:
        """The file has ``key`` (even as null or an unresolvable interpolation)."""
        return self.raw(key) is not MISSING

    def has(self, key: str) -> bool:
        """The file gives ``key`` a value (not absent, not null)."""
        return self.raw(key) not in (MISSING, None)

    def unresolved(self, key: str, field: str, why: str, fix: str | None = None) -> None:
        """C006 for ``key`` (once per key): ``field`` stays unknown."""
        if key in self.reported:
            if field not in self.src.unresolved:
                self.src.unresolved.append(field)
            return
        self.reported.add(key)
        unresolved_finding(self.src, key, field, why, fix or self.fix)

    def value(self, key: str, field: str, kind: str, *, minimum: float | None = None,
              maximum: float | None = None) -> Any:
        """The checked value of ``key``; None when absent or null, and when it cannot be
        resolved from the file (then ``field`` is unresolved, C006)."""
        value = self.raw(key)
        if isinstance(value, Unresolved):
            self.unresolved(key, field, value.why)
            return None
        if value is MISSING or value is None:
            return None
        if kind in ("int", "number") and maximum is None:
            maximum = self.max_number  # keeps the readers' arithmetic finite
        return check_kind(self.file, key, value, kind, minimum=minimum, maximum=maximum)

    def take(self, key: str, field: str, kind: str, *, minimum: float | None = None,
             maximum: float | None = None) -> Any:
        """Set ``field`` from ``key`` when the file gives it."""
        value = self.value(key, field, kind, minimum=minimum, maximum=maximum)
        if value is not None:
            self.set(field, value, key)
        return value

    def pick(self, key: str, field: str, kind: str, default: Any, where: str, *,
             minimum: float | None = None, maximum: float | None = None) -> tuple[Any, str]:
        """(value, origin): the file's value of ``key``, else ``default`` with ``where``
        the default comes from; (None, key) when the file's value cannot be resolved."""
        raw = self.raw(key)
        if raw is MISSING or raw is None:
            return default, f"{key} ({where})"
        value = self.value(key, field, kind, minimum=minimum, maximum=maximum)
        return value, key

    def take_or(self, key: str, field: str, kind: str, default: Any, where: str, *,
                minimum: float | None = None, maximum: float | None = None) -> Any:
        """Set ``field`` from ``key``, or from the framework's ``default``."""
        value, origin = self.pick(key, field, kind, default, where, minimum=minimum,
                                  maximum=maximum)
        if value is not None:
            self.set(field, value, origin)
        return value

    def section(self, key: str) -> dict[str, Any]:
        """A nested mapping (empty when absent, null or unresolved)."""
        value = self.raw(key)
        if value is MISSING or value is None or isinstance(value, Unresolved):
            return {}
        if not isinstance(value, dict):
            raise self.error(key, value, "a mapping of settings")
        return value

    def word(self, key: str, field: str, choices: Iterable[str], default: str | None = None,
             where: str = "") -> tuple[str | None, str]:
        """(word, origin) of a setting that takes one of ``choices`` (compared without
        case); the framework's ``default`` when absent; an error naming the choices."""
        options = list(choices)
        raw = self.raw(key)
        if raw is MISSING or raw is None:
            return default, f"{key} ({where})"
        text = self.value(key, field, "str")
        if text is None:
            return None, key
        folded = {c.lower(): c for c in options}
        if text.strip().lower() not in folded:
            raise self.error(key, raw, " / ".join(options))
        return folded[text.strip().lower()], key

    def set(self, field: str, value: Any, origin: str) -> None:
        self.src.set(field, value, origin)

    def error(self, key: str, value: Any, expected: str) -> InputError:
        return bad_value(self.file, key, value, expected)

    # -- keys -------------------------------------------------------------------------
    def unknown_keys(self, section: str, known: Iterable[str], *, framework: str,
                     effect: str) -> None:
        """C005 for each key of the mapping at ``section`` ("" for the top level) that
        ``known`` does not list."""
        node = self.doc if not section else self.raw(section)
        if not isinstance(node, Mapping):
            return
        prefix = f"{section}." if section else ""
        self.src.findings.extend(unknown_key_findings(
            [f"{prefix}{k}" for k in node], {f"{prefix}{k}" for k in known},
            file=self.file, framework=framework, effect=effect,
        ))
