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
from typing import Any

from sapper.logs.base import LogData
from sapper.runtime.detector import FRAMEWORKS
from sapper.runtime.records import StepRecord

__all__ = ["FORMAT_FRAMEWORKS", "framework_from", "framework_of", "framework_of_format"]

#: The framework a log format implies on its own. Megatron's iteration line is written
#: by Megatron-LM and Megatron-DeepSpeed alike (both unscale inside their optimizer);
#: ``trainer_state.json`` is the HF Trainer's. Tables and TensorBoard say nothing.
FORMAT_FRAMEWORKS: dict[str, str] = {
    "megatron": "megatron",
    "trainer_state": "hf-trainer",
}


def framework_of_format(fmt: str | None) -> str:
    """The framework a format name implies (``a+b`` for merged logs: the one they agree
    on), else ``unknown``."""
    if not fmt:
        return "unknown"
    found = {FORMAT_FRAMEWORKS.get(part, "unknown") for part in fmt.split("+")}
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
