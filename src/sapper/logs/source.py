"""A log on disk, read once (``sapper analyze``) or followed as it grows (``sapper watch``).

:class:`LogSource` owns the file handle and the parser: :meth:`LogSource.poll` reads
whatever was appended since the last call (bytes decoded incrementally, a torn last line
held back) and returns the steps now complete; :meth:`LogSource.close` flushes the rest.
A ``trainer_state.json`` is rewritten rather than appended, so it is re-read when it
changes. :func:`read_log` is the one-shot convenience over both.
"""

from __future__ import annotations

import codecs
from dataclasses import replace
from pathlib import Path
from typing import Any

from sapper.errors import InputError
from sapper.logs.base import LineBuffer, LogData, LogParser, gc_paused
from sapper.logs.detect import detect_format
from sapper.logs.fields import FieldMap
from sapper.logs.limits import (
    MAX_LOG_BYTES,
    MAX_STATE_BYTES,
    check_regular,
    open_log,
    sniff_encoding,
    too_big,
)
from sapper.logs.registry import find_log_format
from sapper.runtime.records import StepRecord

__all__ = ["CHUNK_BYTES", "LogSource", "decode_text", "make_parser", "read_log"]

#: Bytes read at once from a growing log; each read's complete lines are one ``feed``.
CHUNK_BYTES = 8 << 20


def make_parser(fmt: str, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> Any:
    """The parser for ``fmt`` (one of :data:`~sapper.logs.detect.FORMATS`)."""
    return find_log_format(fmt).parser(Path(path), mapping)


def _decoder(head: bytes) -> codecs.IncrementalDecoder:
    """An incremental decoder for the encoding the first bytes show (a UTF-16 CSV from a
    Windows tool starts with its byte-order mark); undecodable bytes become U+FFFD."""
    return codecs.getincrementaldecoder(sniff_encoding(head))(errors="replace")


def decode_text(data: bytes) -> str:
    """A whole file's bytes as text, in the encoding its byte-order mark says, without
    NUL characters (a crashed node leaves blocks of them)."""
    text = data.decode(sniff_encoding(data), errors="replace").lstrip("\ufeff")
    return text.replace("\x00", "") if "\x00" in text else text


class LogSource:
    """One log file or run folder, read incrementally the way its format says
    (:attr:`~sapper.logs.formats.LogFormat.read_mode`)."""

    def __init__(
        self,
        path: str | Path,
        fmt: str | None = None,
        mapping: dict[str, FieldMap] | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            kind = find_log_format(fmt or detect_format(self.path))
            if kind.read_mode != "poll" and kind.runs_in is not None:
                runs = kind.runs_in(self.path)  # the file inside (a Trainer's state)
                if runs:
                    self.path = runs[0]
            fmt = kind.name
        info = check_regular(self.path)  # a FIFO or a device: refused before it is opened
        size = info.st_size
        if self.path.is_dir():  # a run folder its parser opens: every file in it counts
            size = sum(
                check_regular(entry, "a file of a run folder").st_size
                for entry in self.path.iterdir()
                if not entry.is_dir()
            )
        if size > MAX_LOG_BYTES:
            raise too_big(str(self.path), MAX_LOG_BYTES, size)
        self.format = fmt or detect_format(self.path)
        self.kind = find_log_format(self.format)
        self.parser: LogParser = self.kind.parser(self.path, mapping)
        self._offset = 0
        self._decoder: codecs.IncrementalDecoder | None = None
        self._lines = LineBuffer()
        self._stamp: tuple[float, int] | None = None

    @property
    def notes(self) -> list[str]:
        return self.parser.notes

    def poll(self) -> list[StepRecord]:
        """Steps completed by what was written since the last call."""
        mode = self.kind.read_mode
        if mode == "poll":
            return self.parser.poll()  # type: ignore[attr-defined, no-any-return]
        if mode == "snapshot":
            return self._poll_snapshot(self.parser)
        out: list[StepRecord] = []
        try:
            with gc_paused(), open_log(self.path) as fh:
                fh.seek(self._offset)
                while chunk := fh.read(CHUNK_BYTES):
                    self._offset += len(chunk)
                    if self._offset > MAX_LOG_BYTES:  # it said less than it held (/proc)
                        raise too_big(str(self.path), MAX_LOG_BYTES)
                    if self._decoder is None:
                        self._decoder = _decoder(chunk)
                    lines = self._lines.push(self._decoder.decode(chunk))
                    out.extend(self.parser.feed(lines))
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=str(self.path)) from None
        return out

    def _poll_snapshot(self, parser: Any) -> list[StepRecord]:
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime, stat.st_size)
            if stamp == self._stamp:
                return []
            self._stamp = stamp
            with open_log(self.path, MAX_STATE_BYTES) as fh:
                data = fh.read(MAX_STATE_BYTES + 1)
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=str(self.path)) from None
        if len(data) > MAX_STATE_BYTES:
            raise too_big(str(self.path), MAX_STATE_BYTES)
        return parser.parse(decode_text(data))

    def close(self) -> list[StepRecord]:
        """End of input: the records held back (the torn last line is judged here)."""
        mode = self.kind.read_mode
        if mode == "snapshot":
            self.parser.note_unused_mapping()
            return []
        out: list[StepRecord] = []
        if mode == "lines":
            tail = self._decoder.decode(b"", final=True) if self._decoder is not None else ""
            rest = self._lines.push(tail) + self._lines.rest()
            out.extend(self.parser.feed(rest))
            note = self._lines.note()
            if note:
                self.parser.notes.append(note)
        out.extend(self.parser.finish())
        return out

    def data(self, records: list[StepRecord]) -> LogData:
        return LogData(
            path=str(self.path),
            format=self.format,
            records=records,
            findings=list(self.parser.findings),
            meta=dict(self.parser.meta),
            notes=list(self.parser.notes),
            attempts=[replace(a) for a in self.parser.attempts],
        )


def read_log(
    path: str | Path,
    fmt: str | None = None,
    mapping: dict[str, FieldMap] | None = None,
) -> LogData:
    """Read a whole log. Raises :class:`InputError` when it holds no step at all; notes
    on the result say what was skipped when only part of it could be read."""
    source = LogSource(path, fmt, mapping)
    records = source.poll()
    records.extend(source.close())
    data = source.data(records)
    if not records:
        why = f" ({'; '.join(data.notes)})" if data.notes else ""
        raise InputError(
            f"no training steps found in this {source.format} log{why}",
            file=str(source.path),
            expected="step records with at least a step number",
        )
    return data
