"""What the R-rule detectors share: firing a rule with a cooldown, reading options.

Records may be sparse (a log written every k steps), have gaps, or lack fields; every
detector reads what is present and stays silent otherwise. A rule fires once per episode:
after firing, the same rule waits ``cooldown`` steps before it may fire again, so a
diverging run yields a few precise findings instead of one per step.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sapper.rules.model import Finding, Rule, Severity
from sapper.runtime.detector import Detector

__all__ = ["RuleDetector", "fmt"]


def fmt(value: float | None) -> str:
    """Short number for messages: 3 significant digits, scientific when tiny or huge."""
    if value is None:
        return "N/A"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    a = abs(value)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{value:.3g}"
    return f"{value:.4g}"


class RuleDetector(Detector):
    """A detector with a per-rule cooldown (in steps); ``None`` means fire once per run."""

    #: Steps to wait before the same rule may fire again.
    cooldown: int | None = None
    #: Per-rule exceptions to ``cooldown`` (code -> steps, or None for once per run).
    cooldowns: ClassVar[dict[str, int | None]] = {}

    def __init__(self) -> None:
        self.fired: dict[str, int] = {}

    def can_fire(self, rule: Rule, step: int) -> bool:
        last = self.fired.get(rule.code)
        if last is None:
            return True
        cooldown = self.cooldowns.get(rule.code, self.cooldown)
        return cooldown is not None and step - last >= cooldown

    def fire(
        self,
        rule: Rule,
        step: int,
        message: str,
        *,
        severity: Severity | None = None,
        fix: str | None = None,
        **details: Any,
    ) -> list[Finding]:
        """One finding, or none while the rule is cooling down."""
        if not self.can_fire(rule, step):
            return []
        self.fired[rule.code] = step
        return [rule.finding(message, step=step, severity=severity, fix=fix, **details)]
