"""Logs read into columns for ``sapper analyze`` on long runs (see docs/analyze.md).

:func:`read_columnar` reads a sapper run log with polars when it pays (a large file
whose steps ascend), else returns ``None`` and the streaming readers take over;
:func:`columns_from_records` turns any reader's records into the same columns, so the
vectorised detectors (``sapper.logs.columnar.twins``) serve every format.
"""

from __future__ import annotations

from pathlib import Path

from sapper.logs.columnar.frame import ColumnarLog, Columns, LazyRecords, columns_from_records

__all__ = ["ColumnarLog", "Columns", "LazyRecords", "columns_from_records", "read_columnar"]


def read_columnar(
    path: str | Path, fmt: str | None, *, min_bytes: int | None = None
) -> ColumnarLog | None:
    """``path`` read into columns when its format has a columnar reader and the file is
    large enough to pay for it (``min_bytes``, default ``runlog.MIN_BYTES``), else
    ``None``."""
    if fmt != "sapper":
        return None
    from sapper.logs.columnar.runlog import MIN_BYTES, read_runlog_columnar

    return read_runlog_columnar(path, min_bytes=MIN_BYTES if min_bytes is None else min_bytes)
