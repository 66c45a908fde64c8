"""sapper's JSONL run log read into columns with polars.

The run log's step lines are flat objects of numbers (``StepRecord.to_json``), written
by one writer in one spelling, so polars decodes them in its own threads at a few
hundred MB/s against the standard library's tens. What is not such a plain line, a
meta or finding line, a step with extras or per-group LRs, a non-finite float spelled
as a string, anything unreadable, goes through :class:`sapper.logs.runlog.RunLogParser`
line by line, with its own line number, so notes, findings and meta come out as the
streaming reader has them. A log whose steps do not strictly ascend (a restart, a
hand-merged file) is left to the streaming reader: it owns what a repeated step means.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from sapper.logs.base import Attempt
from sapper.logs.columnar.frame import (
    BOOL_FIELDS,
    FLOAT_FIELDS,
    INT_FIELDS,
    ColumnarLog,
    Columns,
    LazyRecords,
)
from sapper.logs.runlog import RunLogParser

__all__ = ["MIN_BYTES", "read_runlog_columnar"]

#: Below this size the streaming reader is as fast and the polars import is not worth it.
MIN_BYTES = 4 << 20

_SCALARS = (*FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS)
#: Plain lines whose keys decide which fields polars decodes; a line with another key
#: fails the key count below and is read by the streaming parser, so the sample only
#: has to be typical, not complete.
_SAMPLE = 2000
_DTYPES = {
    **{name: (lambda pl: pl.Float64) for name in (*FLOAT_FIELDS, *INT_FIELDS)},
    **{name: (lambda pl: pl.Boolean) for name in BOOL_FIELDS},
}


def _sample_fields(lines: Any) -> set[str]:
    """The StepRecord fields the first plain lines hold."""
    names: set[str] = set()
    for text in lines.to_list():
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            names.update(k for k in obj if k in _DTYPES)
    return names


#: A plain step line: written by the monitor, ``kind`` then an integer ``step`` first.
_PLAIN_HEAD = r'^\{"kind": "step", "step": -?\d+(, "|\}$)'
#: Anything a plain line must not hold: non-finite floats as strings (and, after its
#: first character, nesting or lists: see ``_NESTED``).
_NOT_PLAIN = ('"nan"', 'inf"', '"NaN"', "Infinity")
_NESTED = r"[\[{]"


def _decode_file(pl: Any, path: Path, schema: dict[str, Any], kept: np.ndarray) -> Any:
    """Every line decoded by polars straight from the file (the fast way), with the
    line index of each row; ``None`` when a line is not JSON at all (polars stops
    there) or the rows do not line up with the non-blank lines."""
    try:
        frame = pl.read_ndjson(path, schema=schema, ignore_errors=True)
    except Exception:
        return None
    index = np.flatnonzero(kept)
    if frame.height != len(index):
        return None
    return frame.with_columns(pl.Series("i", index))


def _decode_lines(pl: Any, lines: Any, plain: np.ndarray, schema: dict[str, Any]) -> Any:
    """The plain lines only, decoded one string at a time by polars (a log with torn
    or unreadable lines, which stop the file reader)."""
    index = np.flatnonzero(plain)
    try:
        return (
            pl.DataFrame({"line": lines.gather(index)})
            .select(pl.col("line").str.json_decode(pl.Struct(schema)).alias("r"))
            .unnest("r")
            .with_columns(pl.Series("i", index))
        )
    except Exception:  # a plain-looking line that is not JSON after all
        return None


def read_runlog_columnar(path: str | Path, *, min_bytes: int = MIN_BYTES) -> ColumnarLog | None:
    """The run log at ``path`` in columns, or ``None`` when this path does not apply
    (no polars, a small file, steps that repeat): then the streaming reader reads it."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size < max(1, min_bytes):
        return None
    try:
        import polars as pl
    except ImportError:
        return None
    try:
        with path.open("rb") as fh:
            fh.seek(size - 1)
            newline_end = fh.read(1) == b"\n"
        lines = pl.read_csv(
            path,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["line"],
            schema={"line": pl.Utf8},
        )["line"]
    except Exception:  # a line polars cannot split (a \x1f in it): the streaming reader
        return None
    n_lines = len(lines)
    line = pl.col("line")
    # A line is plain when it starts as the writer writes a step and polars decodes a
    # value for every key it has (counted here): a key outside the schema (extras,
    # per-group LRs, a stranger's field) or a value of another type ("nan", a string)
    # fails the count, and the line goes to the streaming parser.
    plain = line.str.contains(_PLAIN_HEAD)
    if not newline_end:  # a torn last line is the streaming reader's to judge
        plain = plain & (pl.int_range(pl.len()) < n_lines - 1)
    table = pl.DataFrame({"line": lines}).select(
        plain.fill_null(False).alias("plain"),
        line.str.count_matches('":', literal=True).alias("keys"),
        (line.is_not_null() & ~line.str.contains(r"^\s*$")).fill_null(False).alias("kept"),
    )
    plain_mask = table["plain"].to_numpy()
    first = np.flatnonzero(plain_mask[: 4 * _SAMPLE])[:_SAMPLE]
    sample = _sample_fields(lines.gather(first))
    schema = {
        "kind": pl.Utf8,
        "step": pl.Int64,
        **{name: _DTYPES[name](pl) for name in _SCALARS if name in sample},
    }
    frame = _decode_file(pl, path, schema, table["kept"].to_numpy()) if newline_end else None
    if frame is None:
        # json_decode has no ignore_errors: lines it would stop on are left out first.
        simple = (
            pl.DataFrame({"line": lines})
            .select(
                (~pl.col("line").str.slice(1).str.contains(_NESTED))
                .fill_null(False)
                .and_(
                    pl.all_horizontal(
                        [~pl.col("line").str.contains(t, literal=True) for t in _NOT_PLAIN]
                    ).fill_null(False)
                )
            )
            .to_series()
            .to_numpy()
        )
        frame = _decode_lines(pl, lines, plain_mask & simple, schema)
    if frame is None:
        return None
    keys = table["keys"].to_numpy()[frame["i"].to_numpy()]
    # A key the sample did not show, or a value polars could not take as the field's type
    # (it is null then), makes a line not plain: the keys must be the fields decoded.
    fields_ = [c for c in frame.columns if c != "i"]
    decoded = frame.select(pl.sum_horizontal([pl.col(c).is_not_null() for c in fields_]))
    ok = (decoded.to_series().to_numpy() == keys) & plain_mask[frame["i"].to_numpy()]
    frame = frame.filter(pl.Series(ok)).drop("kind")
    plain_idx = frame["i"].to_numpy().astype(np.int64)
    other_mask = np.ones(n_lines, dtype=bool)
    other_mask[plain_idx] = False
    other_idx = np.flatnonzero(other_mask)

    parser = RunLogParser(str(path))
    texts = lines.gather(other_idx).to_list() if len(other_idx) else []
    full_rows: list[tuple[int, object]] = []  # (line index, record)
    for idx, text in zip(other_idx.tolist(), texts, strict=True):
        parser._line = idx  # the line numbers in notes stay the file's
        for rec in parser.feed([text if text is not None else ""]):
            full_rows.append((idx, rec))
    parser.finish()
    if parser._replayed:
        return None

    plain_steps = frame["step"].to_numpy()
    n = len(plain_idx) + len(full_rows)
    line_of = np.empty(n, dtype=np.int64)
    steps = np.empty(n, dtype=np.int64)
    full_lines = np.fromiter((i for i, _ in full_rows), dtype=np.int64, count=len(full_rows))
    line_of[: len(plain_idx)] = plain_idx
    line_of[len(plain_idx) :] = full_lines
    steps[: len(plain_idx)] = plain_steps
    steps[len(plain_idx) :] = [r.step for _, r in full_rows]  # type: ignore[attr-defined]
    order = np.argsort(line_of, kind="stable")
    steps = steps[order]
    if n == 0 or (n > 1 and not bool(np.all(steps[1:] > steps[:-1]))):
        return None
    # Row of each plain line and of each full record in file order.
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    plain_rows = rank[: len(plain_idx)]
    cols = Columns(steps=steps)
    for _, (row, (_, rec)) in enumerate(
        zip(rank[len(plain_idx) :].tolist(), full_rows, strict=True)
    ):
        cols.full[row] = rec  # type: ignore[assignment]
    full_row_idx = rank[len(plain_idx) :]
    dense = len(plain_rows) == n
    for name in _SCALARS:
        col = frame[name] if name in frame.columns else None
        from_full = [
            (row, getattr(rec, name))
            for row, (_, rec) in zip(full_row_idx.tolist(), full_rows, strict=True)
            if getattr(rec, name) is not None
        ]
        if (col is None or col.null_count() == len(col)) and not from_full:
            continue
        if col is not None and dense:  # every row a plain line: the columns as decoded
            values = col.cast(pl.Float64).to_numpy()
            present = col.is_not_null().to_numpy()
        else:
            values = np.full(n, np.nan)
            present = np.zeros(n, dtype=bool)
            if col is not None:
                values[plain_rows] = col.cast(pl.Float64).to_numpy()
                present[plain_rows] = col.is_not_null().to_numpy()
        for row, value in from_full:
            if not isinstance(value, (int, float)):
                return None  # a value only the streaming detectors can judge
            values[row] = float(value)
            present[row] = True
        cols.values[name] = values
        cols.present[name] = present
    return ColumnarLog(
        path=str(path),
        format="sapper",
        records=LazyRecords(cols),  # type: ignore[arg-type]
        findings=list(parser.findings),
        meta=dict(parser.meta),
        notes=list(parser.notes),
        attempts=[Attempt(1, 0, n, int(steps[0]), int(steps[-1]))],
        columns=cols,
    )
