"""Logs read into columns for ``sapper analyze`` on long runs (see docs/analyze.md).

:func:`read_columnar` reads a sapper run log with polars when it pays (a large file;
a run resumed from a checkpoint is split into attempts), and a Megatron-LM text log a
batch of lines at a time (``sapper.logs.columnar.megatron``), else returns ``None`` and
the streaming readers take over;
:func:`columns_from_records` turns any reader's records into the same columns, so the
vectorised detectors (``sapper.logs.columnar.twins``) serve every format.

The column classes load on first use (they import numpy): a small log, which never
reaches them, is analyzed without it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sapper.lazy import lazy_exports

if TYPE_CHECKING:
    from sapper.logs.columnar.frame import (
        ColumnarLog,
        Columns,
        LazyRecords,
        RowRecords,
        columns_from_records,
    )

__all__ = [
    "DEFAULT_MIN_BYTES",
    "ColumnarLog",
    "Columns",
    "LazyRecords",
    "RowRecords",
    "columns_from_records",
    "read_columnar",
]

_FRAME_NAMES = ("ColumnarLog", "Columns", "LazyRecords", "RowRecords", "columns_from_records")
__getattr__, __dir__ = lazy_exports(
    __name__, dict.fromkeys(_FRAME_NAMES, "frame"), [*__all__]
)

#: Below this size a log's columnar reader (``runlog``, ``megatron``: their
#: ``MIN_BYTES``) is not worth its imports; the readers start from it.
DEFAULT_MIN_BYTES = 4 << 20

#: The columnar reader of each format that has one.
_READERS = {"sapper": "runlog", "megatron": "megatron"}


def _min_bytes(reader: str) -> int:
    """The reader's ``MIN_BYTES`` once its module is loaded (a caller may have set it),
    else the default it starts from: a small file is turned away before numpy and the
    reader are imported."""
    module = sys.modules.get(f"{__name__}.{reader}")
    return int(getattr(module, "MIN_BYTES", DEFAULT_MIN_BYTES))


def read_columnar(
    path: str | Path, fmt: str | None, *, min_bytes: int | None = None
) -> ColumnarLog | None:
    """``path`` read into columns when its format has a columnar reader (a sapper run
    log, a Megatron-LM text log) and the file is large enough to pay for it
    (``min_bytes``, default the reader's ``MIN_BYTES``), else ``None``."""
    reader = _READERS.get(fmt or "")
    if reader is None:
        return None
    limit = _min_bytes(reader) if min_bytes is None else min_bytes
    try:
        if Path(path).stat().st_size < max(1, limit):
            return None
    except OSError:
        return None
    if reader == "megatron":
        from sapper.logs.columnar.megatron import read_megatron_columnar

        return read_megatron_columnar(path, min_bytes=limit)
    from sapper.logs.columnar.runlog import read_runlog_columnar

    return read_runlog_columnar(path, min_bytes=limit)
