"""sapper's JSONL run log read into columns with polars.

The run log's step lines are flat objects of numbers (``StepRecord.to_json``), written
by one writer in one spelling, so polars decodes them in its own threads at a few
hundred MB/s against the standard library's tens. What is not such a plain line, a
meta or finding line, a step with extras or per-group LRs, a non-finite float spelled
as a string, anything unreadable, goes through :class:`sapper.logs.runlog.RunLogParser`
line by line, with its own line number, so notes, findings and meta come out as the
streaming reader has them. A step that does not go past the one before it starts a new
attempt (a run resumed from a checkpoint logs its steps again), as
:class:`~sapper.logs.runlog.RunLogParser` splits them, and the findings stored in the
log are tagged with the attempt they were written in, so a resumed log stays in columns.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from sapper.logs.base import Attempt
from sapper.logs.columnar import DEFAULT_MIN_BYTES
from sapper.logs.columnar.frame import (
    BOOL_FIELDS,
    FLOAT_FIELDS,
    INT_FIELDS,
    ColumnarLog,
    Columns,
    LazyRecords,
)
from sapper.logs.limits import MAX_COUNT
from sapper.logs.runlog import RunLogParser
from sapper.runtime.records import StepRecord

__all__ = ["MIN_BYTES", "ReadStopped", "read_runlog_columnar"]

#: Below this size the streaming reader is as fast and the polars import is not worth it.
MIN_BYTES = DEFAULT_MIN_BYTES
#: Above this share of lines the streaming parser must read (steps with extras, written
#: by a live monitor on every step) in the first block, the streaming reader is faster.
SPECIAL_SHARE = 0.25
#: Text read and decoded at once: bounds the memory a long log's text takes. Under
#: glibc's largest mmap threshold (32 MB), so each block's buffer reuses the pages of
#: the one before instead of being mapped fresh (and faulted in) every time.
BLOCK_BYTES = 16 << 20
#: Blocks decoded at once by polars (which releases the GIL while it decodes), so a
#: long log's read uses two cores; each block in flight holds its text and its rows.
DECODE_WORKERS = min(2, os.cpu_count() or 1)
#: The most of a file's start read to find its first line (a meta line is far shorter).
_HEAD_BYTES = 1 << 16
#: polars' allocator (jemalloc) keeps the pages a block's decoding freed for ten seconds
#: by default, so a long log's read held some 100 MB it no longer used at the peak;
#: returned at once, each block's decoding took fresh pages from the kernel again (a
#: third of the read's time in page faults). Kept a tenth of a second, the next block
#: reuses them and the peak stays within some 20 MB of the prompt return; unless the
#: user's environment says otherwise. Set before polars is first imported (its
#: allocator reads it then); a process that imported polars already keeps its own.
_ALLOCATOR_ENV = ("_RJEM_MALLOC_CONF", "dirty_decay_ms:100,muzzy_decay_ms:0")

_SCALARS = (*FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS)
#: In a block polars cannot decode whole (a torn or unreadable line), the lines tried
#: one by one: a step as the writer starts it, with no nesting (after the first
#: character) and no non-finite float spelled as a string (json_decode stops on those).
_PLAIN_HEAD = r'^\{"kind": "step", "step": -?\d+(, "|\}$)'
_NESTED = r"[\[{]"
_NOT_PLAIN = ('"nan"', 'inf"', '"NaN"', "Infinity")
#: Lines whose keys decide which fields polars decodes; a line with another key fails
#: the key count and is read by the streaming parser, so the sample only has to be
#: typical, not complete.
_SAMPLE = 100
_DTYPES = {
    **{name: (lambda pl: pl.Float64) for name in (*FLOAT_FIELDS, *INT_FIELDS)},
    **{name: (lambda pl: pl.Boolean) for name in BOOL_FIELDS},
}


class ReadStopped(Exception):
    """A read told to stop before its end (an early read nobody will take)."""


def _sample_lines(data: bytes) -> Iterator[bytes]:
    """Some lines of a block: its first ``_SAMPLE`` and one after each of ``_SAMPLE``
    evenly spread offsets, cut from the bytes (no line split of the whole block)."""
    size, start = len(data), 0
    for _ in range(_SAMPLE):
        if start >= size:
            break
        end = data.find(b"\n", start)
        end = size if end < 0 else end
        yield data[start:end]
        start = end + 1
    for k in range(1, _SAMPLE):
        start = data.find(b"\n", k * size // _SAMPLE) + 1
        if start <= 0:
            break
        end = data.find(b"\n", start)
        yield data[start : end if end >= 0 else size]


def _sample_fields(data: bytes) -> set[str]:
    """The StepRecord fields some lines of a block hold (its first and a spread)."""
    names: set[str] = set()
    for text in _sample_lines(data):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            names.update(k for k in obj if k in _DTYPES)
    return names


#: The bytes compared at once by :func:`_count_bytes`: its scratch mask stays small
#: (no fresh pages for each block) and in the cache.
_COUNT_BYTES = 1 << 20


def _count_bytes(data: bytes, *wanted: bytes) -> list[int]:
    """How many times each byte of ``wanted`` occurs in ``data``, counted by numpy a
    slice at a time into one scratch mask: faster than ``bytes.count`` and, unlike it,
    without holding the interpreter's lock while it compares, so the main thread goes on
    while a worker checks its block."""
    view = np.frombuffer(data, dtype=np.uint8)
    mask = np.empty(min(len(view), _COUNT_BYTES), dtype=bool)
    counts = [0] * len(wanted)
    for lo in range(0, len(view), _COUNT_BYTES):
        part = view[lo : lo + _COUNT_BYTES]
        out = mask[: len(part)]
        for k, byte in enumerate(wanted):
            np.equal(part, byte[0], out=out)
            counts[k] += int(np.count_nonzero(out))
    return counts


def _all_plain(data: bytes, frame: Any) -> bool:
    """Whether every line of a block (ending with a newline) is a plain step that
    ``frame``, its rows decoded by polars, holds whole: one row per line, and as many
    values decoded as the block has colons. Every key is followed by a colon (whatever
    the spacing) and a value is decoded only for a key, so a line never has fewer
    colons than values decoded from it: equal totals mean that on every line each
    key was decoded and no colon lies elsewhere, which the line-by-line key count of
    the general path then finds too. Counting one byte over the block costs a
    fraction of splitting it into lines and counting each."""
    newlines, colons = _count_bytes(data, b"\n", b":")
    if frame.height != newlines:
        return False  # a blank line (polars skips it)
    decoded = sum(frame.height - frame[c].null_count() for c in frame.columns)
    if decoded != colons:
        return False
    kind, step = frame["kind"], frame["step"]
    if kind.null_count() or step.null_count() or not (kind == "step").all():
        return False
    if frame.height and step.min() < 0:
        return False
    for name in INT_FIELDS:
        if name in frame.columns:
            col = frame[name].drop_nulls()
            if len(col) and (
                col.min() < 0 or col.max() > MAX_COUNT or not (col == col.floor()).all()
            ):
                return False
    return True


def _read_block(pl: Any, data: bytes, schema: dict[str, Any]) -> Any:
    """Every line of a block decoded by polars in one pass (the fast way); ``None``
    when a line is not JSON at all (polars stops there)."""
    try:
        return pl.read_ndjson(data, schema=schema, ignore_errors=True)
    except Exception:
        return None


def _decode_file(pl: Any, frame: Any, lines: Any) -> Any:
    """``frame`` (the block as :func:`_read_block` decoded it) with the block's line
    index of each row; ``None`` when the rows do not line up with the non-blank lines."""
    if frame is None:
        return None
    if frame.height == len(lines):
        index = np.arange(len(lines))
    else:  # polars skips blank lines
        kept = (lines.is_not_null() & ~lines.str.contains(r"^\s*$")).fill_null(False)
        index = np.flatnonzero(kept.to_numpy())
        if frame.height != len(index):
            return None
    return frame.with_columns(pl.Series("i", index))


def _decode_lines(pl: Any, lines: Any, newline_end: bool, schema: dict[str, Any]) -> Any:
    """The lines that look like plain steps, decoded one string at a time by polars (a
    block with torn or unreadable lines, which stop the block reader). json_decode has
    no ``ignore_errors``: lines it would stop on (non-finite strings, nesting) are left
    out first."""
    line = pl.col("line")
    look = line.str.contains(_PLAIN_HEAD) & ~line.str.slice(1).str.contains(_NESTED)
    for text in _NOT_PLAIN:
        look = look & ~line.str.contains(text, literal=True)
    if not newline_end:  # a torn last line is the streaming parser's to judge
        look = look & (pl.int_range(pl.len()) < len(lines) - 1)
    mask = pl.DataFrame({"line": lines}).select(look.fill_null(False)).to_series().to_numpy()
    index = np.flatnonzero(mask)
    try:
        return (
            pl.DataFrame({"line": lines.gather(index)})
            .select(pl.col("line").str.json_decode(pl.Struct(schema)).alias("r"))
            .unnest("r")
            .with_columns(pl.Series("i", index))
        )
    except Exception:  # a plain-looking line that is not JSON after all
        return None


def _blocks(path: Path, size: int, pos: int = 0) -> Iterator[tuple[bytes, bool]]:
    """The file from byte ``pos`` in blocks of whole lines (``BLOCK_BYTES`` or so), and
    whether the block ends with a newline (only the last may not: a torn last line).
    Each block is read from where the last one's final newline left off, so no text is
    copied twice."""
    want = BLOCK_BYTES
    with path.open("rb") as fh:
        while pos < size:
            cut = _last_newline(fh, pos, want) if pos + want < size else -1
            if cut > 0:  # read up to it: no block copied to cut its torn line off
                fh.seek(pos)
                chunk = fh.read(cut)
                if len(chunk) == cut:
                    yield chunk, True
                    pos, want = pos + cut, BLOCK_BYTES
                    continue
            fh.seek(pos)
            chunk = fh.read(want)
            if not chunk:
                return
            if pos + len(chunk) >= size:  # the end of the file
                yield chunk, chunk.endswith(b"\n")
                return
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:  # a line longer than a block: read a larger one
                want *= 2
                continue
            yield (chunk if cut == len(chunk) else chunk[:cut]), True
            pos, want = pos + cut, BLOCK_BYTES


def _last_newline(fh: Any, pos: int, want: int) -> int:
    """The length of the block of whole lines in the ``want`` bytes from ``pos``, found
    in their last ``_HEAD_BYTES``; -1 when no newline lies there (a long line: the
    caller reads the whole block to find one)."""
    start = max(pos, pos + want - _HEAD_BYTES)
    fh.seek(start)
    tail = fh.read(pos + want - start)
    at = tail.rfind(b"\n")
    return -1 if at < 0 else start - pos + at + 1


_Decoded = tuple[dict[str, Any], Any, bool]


def _decode_block(pl: Any, data: bytes, newline_end: bool) -> _Decoded:
    """A block's schema (from its sample), its rows as polars decodes the whole block
    (``None`` when it cannot, or the block ends in a torn line) and whether every line
    is a plain step held whole: the work of a block that depends on no other block, so
    it may run in a worker thread while the reader takes the blocks before it."""
    sample = _sample_fields(data)
    schema = {
        "kind": pl.Utf8,
        "step": pl.Int64,
        **{name: _DTYPES[name](pl) for name in _SCALARS if name in sample},
    }
    whole = _read_block(pl, data, schema) if newline_end else None
    return schema, whole, whole is not None and _all_plain(data, whole)


class _Parser(RunLogParser):
    """The streaming parser of the lines that are no plain step, which also keeps the
    line of each finding it stores: it sees only some of the steps, so the attempt a
    finding was written in is counted over all of them once the log is read."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.finding_lines: list[int] = []

    def _finding(self, obj: dict[str, Any], line: int) -> None:
        before = len(self.findings)
        super()._finding(obj, line)
        if len(self.findings) > before:
            self.finding_lines.append(line)

    def count_attempts(self, restart_lines: np.ndarray) -> None:
        """The restarts of the whole log (rows whose step does not go past the one
        before, at ``restart_lines``: 0-based file lines) and each finding's attempt, as
        the streaming parser counts them line by line (its lines are 1-based)."""
        self._restarts = len(restart_lines)
        at = np.searchsorted(restart_lines, np.asarray(self.finding_lines, np.int64) - 1)
        self._finding_attempts = (at + 1).tolist()


def _attempts(steps: np.ndarray) -> tuple[list[Attempt], np.ndarray]:
    """The attempts of rows whose steps ascend but where a step repeats or falls (a run
    resumed from a checkpoint), split as :class:`RunLogParser` splits them, and the rows
    that start a new one."""
    n = len(steps)
    back = np.flatnonzero(steps[1:] <= steps[:-1]) + 1
    starts = [0, *back.tolist()]
    attempts = [
        Attempt(number, lo, hi, int(steps[lo]), int(steps[hi - 1]))
        for number, (lo, hi) in enumerate(zip(starts, [*starts[1:], n], strict=True), 1)
    ]
    return attempts, back


class _Reader:
    """Collects the rows of every block: plain lines into the columns of a
    :class:`_Store`, the others as the streaming parser's records, in file order."""

    def __init__(self, pl: Any, path: Path, size: int = 0) -> None:
        self.pl = pl
        self.parser = _Parser(str(path))
        self.size = size
        self.line0 = 0
        self.kept = 0  # blocks whose plain rows were kept
        self.store = _Store()  # the plain rows' columns
        self.full: list[tuple[int, StepRecord]] = []  # (line index, record)

    def _mostly_special(self, plain: int, lines: int) -> bool:
        """Whether the first block holds mostly lines for the streaming parser (which
        then reads the log faster), the header line it took counted among them."""
        if self.kept:
            return False
        return plain < (1 - SPECIAL_SHARE) * (lines + self.line0)

    def header(self, path: Path) -> int:
        """The file's first line read by the streaming parser when it is no step (the
        monitor's meta line), so the first block can be taken whole like the others:
        the bytes it took (0 when the first line is left to the blocks)."""
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES)
        end = head.find(b"\n")
        if end < 0 or b'"kind": "step"' in head[:end]:
            return 0
        try:
            text = head[:end].decode("utf-8")
        except UnicodeDecodeError:
            return 0  # the blocks' reader says what is wrong with it
        parser = self.parser
        parser._line = 0
        self.full.extend(enumerate(parser.feed([text])))
        self.line0 = 1
        return end + 1

    def block(self, data: bytes, newline_end: bool, decoded: _Decoded | None = None) -> bool:
        """Read one block; ``False`` when this reader cannot take the log. ``decoded``:
        the block as :func:`_decode_block` decoded it (in another thread), if it was."""
        pl = self.pl
        schema, whole, plain = decoded or _decode_block(pl, data, newline_end)
        if plain:
            # Every line a plain step (a long run's usual block): its rows as decoded.
            if self._mostly_special(whole.height, whole.height):
                return False
            self._keep(whole, len(data), whole.height)
            self.line0 += whole.height
            return True
        try:
            lines = pl.read_csv(
                io.BytesIO(data),
                has_header=False,
                separator="\x1f",
                quote_char=None,
                new_columns=["line"],
                schema={"line": pl.Utf8},
            )["line"]
        except Exception:  # a line polars cannot split (a \x1f in it)
            return False
        n_lines = len(lines)
        # A line is plain when polars decodes a value for every key it has (its colons,
        # counted here: one per key, whatever the spacing, and none elsewhere in a plain
        # line) and it is a step with an integer step number: a key outside the schema
        # (extras, per-group LRs, a stranger's field) or a value of another type ("nan",
        # a string, a float step) fails the count, and the line goes to the streaming
        # parser. :func:`_all_plain` counts the same over a whole block.
        keys = lines.str.count_matches(":", literal=True).fill_null(0).to_numpy()
        frame = _decode_file(pl, whole, lines)
        if frame is None:
            frame = _decode_lines(pl, lines, newline_end, schema)
        if frame is None:
            return False
        index = frame["i"].to_numpy()
        fields_ = [c for c in frame.columns if c != "i"]
        decoded = frame.select(
            pl.sum_horizontal([pl.col(c).is_not_null() for c in fields_])
        ).to_series()
        ok = (
            (decoded.to_numpy() == keys[index])
            & (frame["kind"] == "step").fill_null(False).to_numpy()
            & (frame["step"] >= 0).fill_null(False).to_numpy()
        )
        # A count the streaming parser would leave out and note (negative, fractional,
        # past int64) sends its line there, so the notes say the same.
        for name in INT_FIELDS:
            if name in fields_:
                col = frame[name]
                fine = col.is_null() | ((col >= 0) & (col <= MAX_COUNT) & (col == col.floor()))
                ok &= fine.fill_null(False).to_numpy()
        if not ok.all():
            frame = frame.filter(pl.Series(ok))
        plain_idx = frame["i"].to_numpy().astype(np.int64)
        if self._mostly_special(len(plain_idx), n_lines):
            return False
        self._keep(frame, len(data), n_lines)
        other = np.ones(n_lines, dtype=bool)
        other[plain_idx] = False
        other_idx = np.flatnonzero(other)
        texts = lines.gather(other_idx).to_list() if len(other_idx) else []
        parser = self.parser
        # Each run of consecutive such lines is fed at once (a monitor that logs extras on
        # every step makes one run of the whole block), its line numbers the file's. Its
        # records keep their order and lie between the plain lines around the run.
        texts = [t if t is not None else "" for t in texts]
        cuts = np.flatnonzero(np.diff(other_idx) != 1) + 1 if len(other_idx) else []
        for lo, hi in zip([0, *cuts], [*cuts, len(other_idx)], strict=True):
            if lo == hi:
                continue
            first = int(other_idx[lo])
            parser._line = self.line0 + first
            for k, rec in enumerate(parser.feed(texts[lo:hi])):
                self.full.append((self.line0 + first + k, rec))
        self.line0 += n_lines
        return True

    def _keep(self, frame: Any, nbytes: int, n_lines: int) -> None:
        """The plain rows of a block of ``nbytes`` and ``n_lines`` (``frame``, its
        column ``i`` their line in the block; without it, row k is the block's line k)
        copied into the store, which the first block sizes for the whole file."""
        store = self.store
        if not self.kept and nbytes:
            store.reserve(int(self.size / nbytes * n_lines * 1.05) + 1024)
        self.kept += 1
        h = frame.height
        lo = store.n
        store.reserve(lo + h)
        hi = lo + h
        if "i" in frame.columns:
            store.lines[lo:hi] = frame["i"].to_numpy()
            store.lines[lo:hi] += self.line0
        else:
            store.lines[lo:hi] = np.arange(self.line0, self.line0 + h)
        store.steps[lo:hi] = frame["step"].to_numpy()
        seen = set()
        for name in frame.columns:
            if name in ("kind", "step", "i"):
                continue
            col = frame[name]
            nulls = col.null_count()
            if nulls == h:
                continue
            values, present = store.field(name)
            values[lo:hi] = col.cast(self.pl.Float64).to_numpy()
            present[lo:hi] = True if nulls == 0 else col.is_not_null().to_numpy()
            seen.add(name)
        for name in store.values.keys() - seen:  # a field other blocks have, this one not
            store.values[name][lo:hi] = np.nan
            store.present[name][lo:hi] = False
        store.n = hi

    def result(self, path: Path) -> ColumnarLog | None:
        parser = self.parser
        store = self.store
        n_plain = store.n
        n = n_plain + len(self.full)
        if n == 0:
            return None
        dense = not self.full
        k = len(self.full)
        full_lines = np.fromiter((i for i, _ in self.full), np.int64, count=k)
        full_steps = np.fromiter((r.step for _, r in self.full), np.int64, count=k)
        runs: list[tuple[int, int, int]] | None = None
        plain_rows: np.ndarray | None = None
        few = None if dense else _few_between(store.lines[:n_plain], full_lines)
        # room for the parser's rows in the store's own arrays: the plain rows after
        # each are moved up in place (usually a few, near the end), nothing is copied
        spread = few is not None and store.cap >= n
        if dense:  # the plain rows are the rows
            line_of, steps = store.lines[:n], store.steps[:n]
            plain_rows = full_rows = np.zeros(0, dtype=np.int64)
        elif few is not None and spread:
            full_rows, runs = few
            line_of = _spread(store.lines, runs, full_rows, full_lines, n)
            steps = _spread(store.steps, runs, full_rows, full_steps, n)
        elif few is not None:  # a few lines read by the parser: the plain rows' runs
            full_rows, runs = few
            line_of = _merged(store.lines[:n_plain], full_lines, full_rows, runs, n)
            steps = _merged(store.steps[:n_plain], full_steps, full_rows, runs, n)
        else:
            line_of = np.concatenate([store.lines[:n_plain], full_lines])
            steps = np.concatenate([store.steps[:n_plain], full_steps])
            order = np.argsort(line_of, kind="stable")
            steps = steps[order]
            line_of = line_of[order]
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n)
            plain_rows = rank[:n_plain]
            full_rows = rank[n_plain:]
            runs = _runs(plain_rows)
        attempts, back = _attempts(steps)
        parser.count_attempts(line_of[back])
        parser._line = self.line0
        parser.finish()
        cols = Columns(steps=steps)
        for row, (_, rec) in zip(full_rows.tolist(), self.full, strict=True):
            cols.full[row] = rec
        for name in _SCALARS:
            # dropped by the store once assembled: a lower peak
            whole = store.pop_whole(name) if spread else None
            plain = store.pop(name) if not spread else (
                None if whole is None else (whole[0][:n_plain], whole[1][:n_plain])
            )
            from_full = [
                (row, getattr(rec, name))
                for row, (_, rec) in zip(full_rows.tolist(), self.full, strict=True)
                if getattr(rec, name) is not None
            ]
            if plain is None and not from_full:
                continue
            if dense and plain is not None:
                values, present = plain  # every row plain: the store's rows as they are
            elif whole is not None and runs is not None:  # the parser's rows, in place
                values = _spread(whole[0], runs, full_rows, np.nan, n)
                present = _spread(whole[1], runs, full_rows, False, n)
            else:
                values, present = _assemble(plain, plain_rows, full_rows, n, runs)
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
            attempts=attempts,
            columns=cols,
        )


class _Store:
    """The plain rows' steps, line numbers and fields, each in one array reserved for
    the whole log and written block by block: polars' memory of a block is free for the
    next block as soon as it is copied, and no column is assembled from pieces at the
    end. Reserved pages that are never written are never taken from the kernel, so an
    estimate of the rows that is too high costs nothing."""

    def __init__(self) -> None:
        self.n = 0
        self.cap = 0
        self.lines = np.empty(0, dtype=np.int64)  # file line of each row
        self.steps = np.empty(0, dtype=np.int64)
        self.values: dict[str, np.ndarray] = {}  # NaN where a row lacks the field
        self.present: dict[str, np.ndarray] = {}

    def reserve(self, rows: int) -> None:
        """Room for at least ``rows`` rows (twice as many when it must grow)."""
        if rows <= self.cap:
            return
        cap = max(rows, 2 * self.cap)
        n = self.n
        self.lines = _grown(self.lines, n, cap)
        self.steps = _grown(self.steps, n, cap)
        for name in self.values:
            self.values[name] = _grown(self.values[name], n, cap)
            self.present[name] = _grown(self.present[name], n, cap)
        self.cap = cap

    def field(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``name``'s values and presence, created absent on the rows before."""
        if name not in self.values:
            values = np.empty(self.cap)
            values[: self.n] = np.nan
            self.values[name] = values
            self.present[name] = np.zeros(self.cap, dtype=bool)
        return self.values[name], self.present[name]

    def pop(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``name``'s values and presence over the stored rows, let go by the store."""
        if name not in self.values:
            return None
        return self.values.pop(name)[: self.n], self.present.pop(name)[: self.n]

    def pop_whole(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``name``'s values and presence with all the room reserved (``cap`` rows),
        let go by the store."""
        if name not in self.values:
            return None
        return self.values.pop(name), self.present.pop(name)


def _grown(array: np.ndarray, n: int, cap: int) -> np.ndarray:
    """``array``'s first ``n`` items in a new array of ``cap``."""
    out = np.empty(cap, dtype=array.dtype)
    out[:n] = array[:n]
    return out


#: Above this many runs of consecutive plain rows (rows the streaming parser read lie
#: between them), a field's values are scattered row by row instead of run by run.
_MAX_RUNS = 4096


def _runs(rows: np.ndarray) -> list[tuple[int, int, int]] | None:
    """The runs of consecutive values in ascending ``rows``, as (first, end) positions
    in ``rows`` and the row the run starts at; ``None`` past :data:`_MAX_RUNS` (then
    scattered row by row)."""
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    if len(cuts) > _MAX_RUNS:
        return None
    bounds = [0, *cuts.tolist(), len(rows)]
    return [(lo, hi, int(rows[lo])) for lo, hi in pairwise(bounds) if lo < hi]


def _few_between(
    plain_lines: np.ndarray, full_lines: np.ndarray
) -> tuple[np.ndarray, list[tuple[int, int, int]]] | None:
    """Where the lines the streaming parser read go among the plain rows, when they are
    few (at most :data:`_MAX_RUNS`) and in file order, as :func:`_runs` gives them
    after a sort of every row's line: their rows (each after the plain rows of earlier
    lines and the parser's lines before it) and the runs of plain rows between them,
    found by a binary search each instead of a sort of a million lines."""
    k = len(full_lines)
    if k > _MAX_RUNS or (k > 1 and not (np.diff(full_lines) > 0).all()):
        return None
    at = np.searchsorted(plain_lines, full_lines).tolist()  # the plain rows before each
    full_rows = np.asarray(at, dtype=np.int64) + np.arange(k)
    bounds = [0, *at, len(plain_lines)]
    runs = [(lo, hi, lo + j) for j, (lo, hi) in enumerate(pairwise(bounds)) if lo < hi]
    return full_rows, runs


def _merged(
    plain: np.ndarray,
    full: np.ndarray,
    full_rows: np.ndarray,
    runs: list[tuple[int, int, int]],
    n: int,
) -> np.ndarray:
    """The ``n`` rows' values: ``plain``'s in their ``runs``, ``full``'s at ``full_rows``."""
    out = np.empty(n, dtype=plain.dtype)
    out[full_rows] = full
    for lo, hi, first in runs:
        out[first : first + hi - lo] = plain[lo:hi]
    return out


def _spread(
    arr: np.ndarray,
    runs: list[tuple[int, int, int]],
    full_rows: np.ndarray,
    full: np.ndarray | float | bool,
    n: int,
) -> np.ndarray:
    """:func:`_merged` in ``arr`` itself (the plain rows first, room for ``n`` rows
    after them): each run of plain rows moved up to its row, the last run first so no
    run is overwritten before it moves, then ``full`` put at ``full_rows``."""
    for lo, hi, first in reversed(runs):
        if first != lo:
            arr[first : first + hi - lo] = arr[lo:hi]
    arr[full_rows] = full
    return arr[:n]


def _assemble(
    plain: tuple[np.ndarray, np.ndarray] | None,
    plain_rows: np.ndarray | None,
    full_rows: np.ndarray,
    n: int,
    runs: list[tuple[int, int, int]] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One field's values and presence over all ``n`` rows from those of the plain
    lines (``None``: no plain line has the field), at ``plain_rows`` (ascending) or in
    ``runs`` of consecutive rows (see :func:`_runs`); ``full_rows``, the rows the
    streaming parser read, are left absent (the caller fills them in). The plain rows
    lie in runs between the few others, each copied as a slice."""
    values = np.empty(n)
    present = np.empty(n, dtype=bool)
    if plain is None:
        values.fill(np.nan)
        present.fill(False)
        return values, present
    values[full_rows] = np.nan
    present[full_rows] = False
    vals, has = plain
    if runs is None and plain_rows is not None:  # too many runs: row by row
        values[plain_rows] = vals
        present[plain_rows] = has
        return values, present
    for lo, hi, first in runs or ():
        values[first : first + hi - lo] = vals[lo:hi]
        present[first : first + hi - lo] = has[lo:hi]
    return values, present


def read_runlog_columnar(
    path: str | Path,
    *,
    min_bytes: int = MIN_BYTES,
    stop: threading.Event | None = None,
    started: threading.Event | None = None,
) -> ColumnarLog | None:
    """The run log at ``path`` in columns, or ``None`` when this path does not apply
    (no polars, a small file, a value only the streaming detectors judge): then the
    streaming reader reads it. A resumed run's attempts are split as that reader
    splits them.
    The file is read in blocks of ``BLOCK_BYTES``, so the text in memory stays bounded
    whatever the log's length; the columns take about 9 bytes per field and step.
    The result of an early read of the same file (:mod:`sapper.logs.columnar.early`,
    begun by the command line) is taken when there is one. ``stop``: set, the read ends
    at the next block with :class:`ReadStopped` (an early read nobody will take).
    ``started``: set once the first blocks are being decoded (polars' work, outside the
    interpreter's lock), or the read is over."""
    early = sys.modules.get("sapper.logs.columnar.early")
    if early is not None and stop is None:
        pending = early.claim(path, min_bytes)
        if pending is not None:
            return pending.wait()  # type: ignore[no-any-return]
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size < max(1, min_bytes):
        return None
    try:
        if "polars" not in sys.modules:
            os.environ.setdefault(*_ALLOCATOR_ENV)
        import polars as pl
    except ImportError:
        return None
    reader = _Reader(pl, path, size)
    try:
        blocks = _blocks(path, size, reader.header(path))
        if stop is not None:
            blocks = _until(blocks, stop)
        if not _read_blocks(pl, reader, blocks, size, started):
            return None
    except OSError:
        return None
    return reader.result(path)


def _until(
    blocks: Iterator[tuple[bytes, bool]], stop: threading.Event
) -> Iterator[tuple[bytes, bool]]:
    """``blocks`` until ``stop`` is set, then :class:`ReadStopped` (the read unwinds as
    after any error: its blocks in flight are let go)."""
    for block in blocks:
        if stop.is_set():
            raise ReadStopped
        yield block


def _read_blocks(
    pl: Any,
    reader: _Reader,
    blocks: Iterator[tuple[bytes, bool]],
    size: int,
    started: threading.Event | None = None,
) -> bool:
    """Every block through ``reader`` in file order, ``False`` at the first it cannot
    take. A log of more than one block has its blocks decoded by ``DECODE_WORKERS``
    threads ahead of the reader, which takes them in file order; at most
    ``DECODE_WORKERS`` + 1 blocks (text and rows) are held at once, so the memory stays
    bounded whatever the log's length. ``started`` is set once the first blocks are
    handed to the decoding threads (or read in this one)."""
    if DECODE_WORKERS < 2 or size <= BLOCK_BYTES:
        if started is not None:
            started.set()
        return all(reader.block(data, newline_end) for data, newline_end in blocks)
    ahead: deque[tuple[bytes, bool, Any]] = deque()
    with ThreadPoolExecutor(DECODE_WORKERS, thread_name_prefix="sapper-decode") as pool:
        try:
            while True:
                while len(ahead) < DECODE_WORKERS + 1:  # one more queued: no core idles
                    nxt = next(blocks, None)
                    if nxt is None:
                        break
                    ahead.append((*nxt, pool.submit(_decode_block, pl, *nxt)))
                if started is not None:
                    started.set()
                if not ahead:
                    return True
                data, newline_end, future = ahead.popleft()
                if not reader.block(data, newline_end, future.result()):
                    return False
                del data, future
        finally:
            for *_, future in ahead:
                future.cancel()
            ahead.clear()
