"""The monitor's own health: its errors are reported once, never raised into training."""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = ["MONITOR_ERROR", "MONITOR_MISUSE", "OUTPUT_UNWRITABLE"]

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

MONITOR_MISUSE = register(
    Rule(
        code="R192",
        name="monitor-misuse",
        check="monitor",
        severity=Severity.WARNING,
        title="The monitor was handed something it cannot read",
        why="""\
A call into the monitor passed a value of the wrong kind: ``step("loss")`` (the word, not
the value), a loss on the ``meta`` device (a tensor with no data), a complex loss,
``skipped="yes"``, a batch that holds no tensors. The monitor cannot measure from it, so
that measurement is missing for the steps that pass it; the rest keeps working and
training goes on. It is the caller's mistake, not the monitor's: the message says what to
pass instead.

Frameworks: any (sapper's own monitor).""",
        signs="""\
This finding, once per kind of value, naming the argument, what it got and what it takes;
``loss`` (or the batch statistics) missing from the run log for those steps.""",
        fix="""\
Pass what the message asks for: the loss as a tensor, a number or the model's output
(``.loss`` / ``"loss"``), computed on the device the model runs on; ``skipped`` as
``True``/``False``; ``batch`` as a dict, a tensor or a tuple/list of tensors.""",
    )
)
