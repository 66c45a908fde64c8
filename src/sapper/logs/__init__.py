"""Readers that turn logs people already have into :class:`StepRecord` streams.

sapper's own run log, Hugging Face ``trainer_state.json``, TensorBoard event files,
CSV / JSON-lines tables (W&B exports, hand-written), Megatron-LM text logs, the HF
Trainer's console output and ``step N | loss X`` lines of other loops all become
the same records, so ``sapper analyze``, ``sapper report`` and ``sapper watch`` feed the
live monitor's detectors with them (one code path for live and offline). Every reader is
incremental (``feed`` lines, or ``poll`` a growing file through :class:`LogSource`);
:func:`read_log` reads a whole log and :func:`detect_format` picks the reader from
the formats the registry lists (:mod:`sapper.logs.registry`; one module per format).
"""

from typing import Any

from sapper.logs.base import LogData, LogParser, StepMerger
from sapper.logs.console import ConsoleParser
from sapper.logs.detect import detect_format, expand_paths
from sapper.logs.fields import FieldMap, canonical, parse_mapping
from sapper.logs.formats import LogFormat
from sapper.logs.keyvalue import KeyValueParser
from sapper.logs.megatron import MegatronParser
from sapper.logs.registry import find_log_format, log_formats
from sapper.logs.runlog import RunLogParser
from sapper.logs.source import LogSource, make_parser, read_log
from sapper.logs.table import TableParser
from sapper.logs.tensorboard import TensorBoardParser
from sapper.logs.trainer_state import TrainerStateParser

#: Built from the registry when first asked for (see ``__getattr__``).
FORMATS: tuple[str, ...]


def __getattr__(name: str) -> Any:
    """``FORMATS``: the ``--log-format`` values, from the registry (see
    :data:`sapper.logs.registry.LOG_READERS`)."""
    if name == "FORMATS":
        from sapper.logs.registry import format_names

        return format_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "ConsoleParser",
    "FieldMap",
    "KeyValueParser",
    "LogData",
    "LogFormat",
    "LogParser",
    "LogSource",
    "MegatronParser",
    "RunLogParser",
    "StepMerger",
    "TableParser",
    "TensorBoardParser",
    "TrainerStateParser",
    "canonical",
    "detect_format",
    "expand_paths",
    "find_log_format",
    "log_formats",
    "make_parser",
    "parse_mapping",
    "read_log",
]
