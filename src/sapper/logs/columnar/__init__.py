"""Logs read into columns for ``sapper analyze`` on long runs (see docs/analyze.md).

:func:`read_columnar` reads a sapper run log with polars when it pays (a large file
whose steps ascend), and a Megatron-LM text log a batch of lines at a time
(``sapper.logs.columnar.megatron``), else returns ``None`` and the streaming readers
take over;
:func:`columns_from_records` turns any reader's records into the same columns, so the
vectorised detectors (``sapper.logs.columnar.twins``) serve every format.
"""

from __future__ import annotations

from pathlib import Path

from sapper.logs.columnar.frame import (
    ColumnarLog,
    Columns,
    LazyRecords,
    RowRecords,
    columns_from_records,
)

__all__ = [
    "ColumnarLog",
    "Columns",
    "LazyRecords",
    "RowRecords",
    "columns_from_records",
    "read_columnar",
]


def read_columnar(
    path: str | Path, fmt: str | None, *, min_bytes: int | None = None
) -> ColumnarLog | None:
    """``path`` read into columns when its format has a columnar reader (a sapper run
    log, a Megatron-LM text log) and the file is large enough to pay for it
    (``min_bytes``, default the reader's ``MIN_BYTES``), else ``None``."""
    if fmt == "megatron":
        from sapper.logs.columnar.megatron import MIN_BYTES as MEGATRON_MIN
        from sapper.logs.columnar.megatron import read_megatron_columnar

        return read_megatron_columnar(
            path, min_bytes=MEGATRON_MIN if min_bytes is None else min_bytes
        )
    if fmt != "sapper":
        return None
    from sapper.logs.columnar.runlog import MIN_BYTES, read_runlog_columnar

    return read_runlog_columnar(path, min_bytes=MIN_BYTES if min_bytes is None else min_bytes)
