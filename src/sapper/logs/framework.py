"""Which training framework wrote a log, for the detectors' framework-specific rules.

Some R-rules read one framework's mechanics: R032/R033 are about torch-amp's GradScaler
call order, which Megatron, DeepSpeed, the HF Trainer and Lightning drive themselves
(they unscale before clipping and stepping, whatever norm they log). ``sapper analyze`` and
``sapper watch`` tell the detectors the framework this module reads from the log: what
a sapper run log's meta says (the live monitor records it), else what the format
implies, else ``unknown`` (the detectors then ask for unambiguous evidence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sapper.logs.base import LogData
from sapper.runtime.detector import FRAMEWORKS
from sapper.runtime.records import StepRecord

__all__ = [
    "FORMAT_FRAMEWORKS",
    "format_frameworks",
    "framework_from",
    "framework_of",
    "framework_of_format",
]

#: Built from the registry when first asked for (see ``__getattr__``).
FORMAT_FRAMEWORKS: dict[str, str]


def __getattr__(name: str) -> Any:
    """``FORMAT_FRAMEWORKS``: format name -> the framework it implies, from each
    registered format's ``framework`` (Megatron's iteration line is written by
    Megatron-LM and Megatron-DeepSpeed alike, both unscale inside their optimizer;
    ``trainer_state.json`` and the Trainer's console dicts are the HF Trainer's; tables
    and TensorBoard say nothing)."""
    if name == "FORMAT_FRAMEWORKS":
        return dict(format_frameworks())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def format_frameworks() -> dict[str, str]:
    """See ``FORMAT_FRAMEWORKS``; read from the registry on first use."""
    from sapper.logs.registry import log_formats

    return {f.name: f.framework for f in log_formats() if f.framework is not None}


def framework_of_format(fmt: str | None) -> str:
    """The framework a format name implies (``a+b`` for merged logs: the one they agree
    on), else ``unknown``."""
    if not fmt:
        return "unknown"
    found = {format_frameworks().get(part, "unknown") for part in fmt.split("+")}
    return found.pop() if len(found) == 1 else "unknown"


def framework_of(log: LogData) -> str:
    """The framework that wrote ``log`` (one of :data:`FRAMEWORKS`)."""
    return framework_from(log.meta, log.format, log.records)


def framework_from(
    meta: Mapping[str, Any], fmt: str | None, records: Sequence[StepRecord] = ()
) -> str:
    """The framework a log's meta, format and first records show (``sapper watch`` has
    them before the whole log)."""
    declared = meta.get("framework")
    if isinstance(declared, str) and declared in FRAMEWORKS:
        return declared
    if any("scaler_checked" in r.extra for r in records[:1000]):
        return "torch-amp"  # the live monitor saw a GradScaler (older run logs)
    if meta.get("source") == "sapper.Monitor":
        return "torch"  # the live monitor, and it saw no GradScaler
    return framework_of_format(fmt)
