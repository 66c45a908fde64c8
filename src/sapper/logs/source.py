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
from sapper.logs.detect import FORMATS, detect_format
from sapper.logs.fields import FieldMap
from sapper.logs.limits import (
    MAX_LOG_BYTES,
    MAX_STATE_BYTES,
    check_regular,
    open_log,
    sniff_encoding,
    too_big,
)
from sapper.logs.megatron import MegatronParser
from sapper.logs.mlflow import FORMAT as MLFLOW_FORMAT
from sapper.logs.mlflow import MlflowParser
from sapper.logs.runlog import RunLogParser
from sapper.logs.table import TableParser
from sapper.logs.tensorboard import TensorBoardParser
from sapper.logs.trainer_state import TrainerStateParser
from sapper.logs.wandb import FORMAT as WANDB_FORMAT
from sapper.logs.wandb import WandbParser
from sapper.runtime.records import StepRecord

__all__ = ["LogSource", "decode_text", "make_parser", "read_log"]

_CHUNK = 8 << 20
#: Folder formats whose parser reads its own files (LogFormat.read_mode "poll").
_POLLED_FORMATS = {f.name: f for f in (WANDB_FORMAT, MLFLOW_FORMAT)}


def make_parser(fmt: str, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> Any:
    """The parser for ``fmt`` (one of :data:`FORMATS`)."""
    source = str(path)
    if fmt == "sapper":
        return RunLogParser(source, mapping)
    if fmt == "megatron":
        return MegatronParser(source, mapping)
    if fmt == "trainer_state":
        return TrainerStateParser(source, mapping)
    if fmt in ("csv", "jsonl"):
        delimiter = "\t" if Path(path).suffix.lower() == ".tsv" else None
        return TableParser(fmt, mapping, delimiter=delimiter, source=source)
    if fmt == "tensorboard":
        return TensorBoardParser(path, mapping)
    if fmt in _POLLED_FORMATS:  # until the registry dispatches on LogFormat.read_mode
        return _POLLED_FORMATS[fmt].parser(Path(path), mapping)
    raise InputError("unknown log format", field="--log-format", value=fmt,
                     expected=" / ".join(FORMATS))


def _decoder(head: bytes) -> codecs.IncrementalDecoder:
    """An incremental decoder for the encoding the first bytes show (a UTF-16 CSV from a
    Windows tool starts with its byte-order mark); undecodable bytes become U+FFFD."""
    return codecs.getincrementaldecoder(sniff_encoding(head))(errors="replace")


def decode_text(data: bytes) -> str:
    """A whole file's bytes as text, in the encoding its byte-order mark says, without
    NUL characters (a crashed node leaves blocks of them)."""
    text = data.decode(sniff_encoding(data), errors="replace").lstrip("\ufeff")
    return text.replace("\x00", "") if "\x00" in text else text


_POLLED = (TensorBoardParser, WandbParser, MlflowParser)


class LogSource:
    """One log file or TensorBoard run, read incrementally."""

    def __init__(
        self,
        path: str | Path,
        fmt: str | None = None,
        mapping: dict[str, FieldMap] | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir() and fmt not in ("tensorboard", *_POLLED_FORMATS):
            inner = self.path / "trainer_state.json"
            if fmt in (None, "trainer_state") and inner.is_file():
                self.path = inner
        info = check_regular(self.path)  # a FIFO or a device: refused before it is opened
        size = info.st_size
        if self.path.is_dir():  # a TensorBoard run: every event file in it is opened
            size = sum(
                check_regular(entry, "an event file").st_size
                for entry in self.path.iterdir()
                if "tfevents" in entry.name
            )
        if size > MAX_LOG_BYTES:
            raise too_big(str(self.path), MAX_LOG_BYTES, size)
        self.format = fmt or detect_format(self.path)
        self.parser: LogParser = make_parser(self.format, self.path, mapping)
        self._offset = 0
        self._decoder: codecs.IncrementalDecoder | None = None
        self._lines = LineBuffer()
        self._stamp: tuple[float, int] | None = None

    @property
    def notes(self) -> list[str]:
        return self.parser.notes

    def poll(self) -> list[StepRecord]:
        """Steps completed by what was written since the last call."""
        if isinstance(self.parser, _POLLED):
            return self.parser.poll()
        if isinstance(self.parser, TrainerStateParser):
            return self._poll_snapshot(self.parser)
        out: list[StepRecord] = []
        try:
            with gc_paused(), open_log(self.path) as fh:
                fh.seek(self._offset)
                while chunk := fh.read(_CHUNK):
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

    def _poll_snapshot(self, parser: TrainerStateParser) -> list[StepRecord]:
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
        if isinstance(self.parser, TrainerStateParser):
            self.parser.note_unused_mapping()
            return []
        out: list[StepRecord] = []
        if not isinstance(self.parser, _POLLED):
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
