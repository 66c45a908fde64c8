"""Readers that turn logs people already have into :class:`StepRecord` streams.

sapper's own run log, Hugging Face ``trainer_state.json``, TensorBoard event files,
CSV / JSON-lines tables (W&B exports, hand-written) and Megatron-LM text logs all become
the same records, so ``sapper analyze``, ``sapper report`` and ``sapper watch`` feed the
live monitor's detectors with them (one code path for live and offline). Every reader is
incremental (``feed`` lines, or ``poll`` a growing file through :class:`LogSource`);
:func:`read_log` reads a whole log and :func:`detect_format` picks the reader.
"""

from sapper.logs.base import LogData, LogParser, StepMerger
from sapper.logs.detect import FORMATS, detect_format, expand_paths
from sapper.logs.fields import FieldMap, canonical, parse_mapping
from sapper.logs.megatron import MegatronParser
from sapper.logs.runlog import RunLogParser
from sapper.logs.source import LogSource, make_parser, read_log
from sapper.logs.table import TableParser
from sapper.logs.tensorboard import TensorBoardParser
from sapper.logs.trainer_state import TrainerStateParser

__all__ = [
    "FORMATS",
    "FieldMap",
    "LogData",
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
    "make_parser",
    "parse_mapping",
    "read_log",
]
