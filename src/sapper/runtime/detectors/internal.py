"""The monitor's own health: its errors are reported once, never raised into training."""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = ["MONITOR_ERROR", "OUTPUT_UNWRITABLE"]

MONITOR_ERROR = register(
    Rule(
        code="R190",
        name="monitor-internal-error",
        check="monitor",
        severity=Severity.WARNING,
        title="A part of the sapper monitor failed and was switched off",
        why="""\
The monitor must never stop the run it watches: when one of its parts raises (an
unexpected model output, an unusual optimizer), that part is disabled, the error is
reported once and training goes on, with less coverage. It is a warning, not a note:
a switched-off part is a blind spot (no gradient norm, no cross-rank checks), and a run
that looks healthy may only look so because nothing is measured any more.

Frameworks: any (sapper's own monitor).""",
        signs="""\
This finding, naming the part and the error; the metrics of that part missing from
the run log.""",
        fix="""\
Report the message to the sapper maintainers; the run itself is unaffected.""",
    )
)

OUTPUT_UNWRITABLE = register(
    Rule(
        code="R191",
        name="monitor-output-unwritable",
        check="monitor",
        severity=Severity.WARNING,
        title="The monitor cannot write its run log",
        why="""\
The run log is what explains a run after the fact: the steps before a crash, a hang or
an OOM kill, and the findings. When its path cannot be opened (a folder of that name, a
read-only location, no permission) or a write fails later (the disk filled up), the
monitor stops writing it and training goes on, but nothing more reaches the file; a run
that then dies leaves no record of why. Said once, at the moment it happens, rather than
discovered after the run.

Frameworks: any (sapper's own monitor).""",
        signs="""\
This finding at construction (the path cannot be opened) or mid-run (a write failed),
naming the path and the operating system's reason (Is a directory, Permission denied,
No space left on device); the run log ends at that point.""",
        fix="""\
Give ``run_log=`` a writable file path (its missing parent folders are created), or free
space on that disk; the monitor's in-memory history and the console still work.""",
    )
)
