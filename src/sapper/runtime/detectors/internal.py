"""The monitor's own health: its errors are reported once, never raised into training."""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = ["MONITOR_ERROR"]

MONITOR_ERROR = register(
    Rule(
        code="R190",
        name="monitor-internal-error",
        check="monitor",
        severity=Severity.INFO,
        title="A part of the sapper monitor failed and was switched off",
        why="""\
The monitor must never stop the run it watches: when one of its parts raises (an
unexpected model output, an unusual optimizer), that part is disabled, the error is
reported once and training goes on, with less coverage.

Frameworks: any (sapper's own monitor).""",
        signs="""\
This finding, naming the part and the error; the metrics of that part missing from
the run log.""",
        fix="""\
Report the message to the sapper maintainers; the run itself is unaffected.""",
    )
)
