"""Following a TensorBoard run: new events in every event file, new event files as they appear.

A run folder gains event files over its life (a restart, a second writer), and each
file grows by TFRecord frames: a little-endian u64 length, the masked CRC32C of that
length, the serialized ``Event`` and its own CRC. Each file keeps its offset, so a poll
reads only the bytes added since the last one; a frame cut short by the writer stays in
the buffer until its remaining bytes arrive. The length CRC is checked before trusting a
length (a damaged file must not make sapper wait for gigabytes that never come); a
damaged file is reported once and left alone. Decoded events go to the TensorBoard
reader's :meth:`~sapper.logs.TensorBoardParser.feed_events`, which maps tags to record
fields exactly as ``sapper analyze`` does.

``SummaryWriter`` buffers events and writes them every ``flush_secs`` (120 s by default)
or on ``flush()``: findings cannot come sooner than the training script writes them.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO

from sapper.errors import InputError
from sapper.logs import LogParser, TensorBoardParser
from sapper.logs.fields import FieldMap
from sapper.logs.limits import refuse_special
from sapper.runtime.records import StepRecord
from sapper.watch.follow import CHUNK, Follower

__all__ = ["EVENTS_MARK", "EventsFollower", "is_event_header", "masked_crc32c"]

#: Every TensorBoard event file has this in its name.
EVENTS_MARK = "tfevents"
_HEADER = 12  # u64 length + u32 masked CRC of the length
_FOOTER = 4  # u32 masked CRC of the data


def _crc32c_table() -> list[int]:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """CRC-32C of ``data``, masked as TFRecord stores it. Computed here: the tensorboard
    package's own helper sits behind an import that takes most of a second, and only
    12-byte headers are checked."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def is_event_header(head: bytes) -> bool:
    """The first 12 bytes are a TFRecord frame header whose length checksum holds."""
    return len(head) >= _HEADER and masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


#: Frame headers already checked -> whether the checksum held. A run's events have a few
#: lengths, so the checksum (Python, a table step per byte) is computed once per length.
_CHECKED: dict[bytes, bool] = {}
_CHECKED_MAX = 4096


def _header_ok(header: bytes) -> bool:
    ok = _CHECKED.get(header)
    if ok is None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        ok = _CHECKED[header] = is_event_header(header)
    return ok


class _EventFile:
    """One event file read frame by frame from where the last poll stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes read from the file, including the buffered partial frame
        self.buffer = b""
        self.damaged = False
        self.bad_events = 0
        self.behind = False  # bytes left to read after this poll's share
        self._fh: BinaryIO | None = None

    def read(self) -> tuple[list[Any], bool]:
        """The events completed since the last call, and whether any byte was added."""
        if self.damaged:
            return [], False
        if self._fh is None:
            refuse_special(self.path)  # a FIFO named like an event file would block
            try:
                self._fh = self.path.open("rb")
            except FileNotFoundError:
                return [], False
            except OSError as exc:
                raise InputError(f"cannot read it ({exc.strerror})", file=str(self.path)) from None
        size = os.fstat(self._fh.fileno()).st_size
        if size < self.offset:  # rewritten from scratch
            self.offset, self.buffer = 0, b""
        if size == self.offset:
            return [], False
        self._fh.seek(self.offset)
        data = self._fh.read(min(CHUNK, size - self.offset))
        self.offset += len(data)
        self.behind = self.offset < size
        self.buffer += data
        events = self._frames()
        if self.damaged:
            self.behind = False
        return events, bool(data)

    def pending(self) -> bool | None:
        """Whether the file holds bytes not read yet (None: not opened yet)."""
        if self.damaged:
            return False
        if self._fh is None:
            return None
        return os.fstat(self._fh.fileno()).st_size != self.offset

    def _frames(self) -> list[Any]:
        from tensorboard.compat.proto.event_pb2 import Event

        buf, pos, events = self.buffer, 0, []
        while len(buf) - pos >= _HEADER:
            header = buf[pos : pos + _HEADER]
            if not _header_ok(header):
                self.damaged = True
                break
            (length,) = struct.unpack("<Q", header[:8])
            end = pos + _HEADER + length + _FOOTER
            if len(buf) < end:
                break  # the writer has not finished this frame yet
            try:
                events.append(Event.FromString(buf[pos + _HEADER : end - _FOOTER]))
            except Exception:  # protobuf's DecodeError; a damaged frame is skipped
                self.bad_events += 1
            pos = end
        self.buffer = buf[pos:]
        return events

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class EventsFollower(Follower):
    """Follows a TensorBoard run folder (or a single event file)."""

    def __init__(self, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> None:
        super().__init__(str(path))
        self.path = Path(path)
        self._parser = TensorBoardParser(self.path, mapping)
        self._files: dict[Path, _EventFile] = {}
        self._reported: set[Path] = set()
        self.waiting = f"waiting for event files in {self.path}"

    @property
    def format(self) -> str | None:
        return "tensorboard"

    @property
    def parser(self) -> LogParser | None:
        return self._parser

    def _paths(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        try:
            names = [e.name for e in os.scandir(self.path) if EVENTS_MARK in e.name and e.is_file()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise InputError(f"cannot list it ({exc.strerror})", file=self.name) from None
        return [self.path / n for n in sorted(names)]

    def poll(self) -> list[StepRecord]:
        now = time.monotonic()
        events: list[Any] = []
        grew: list[Path] = []
        for path in self._paths():
            ef = self._files.get(path)
            if ef is None:
                ef = self._files[path] = _EventFile(path)
                if len(self._files) > 1:
                    self.events.append(f"new event file {path.name}")
            got, added = ef.read()
            events += got
            if added:
                grew.append(path)
            if ef.damaged and path not in self._reported:
                self._reported.add(path)
                self.events.append(
                    f"{path.name}: damaged record at byte {ef.offset - len(ef.buffer):,}; "
                    "the rest of this file is skipped"
                )
        self.behind = any(ef.behind for ef in self._files.values())
        if grew:
            mtime = max(_mtime(p) for p in grew)
            self._saw_data(now, mtime)
        return self._parser.feed_events(events) if events else []

    def pending(self) -> bool | None:
        try:
            paths = self._paths()
        except InputError:
            return None
        if any(p not in self._files for p in paths):
            return True
        answers = [ef.pending() for ef in self._files.values()]
        return True if any(answers) else None if None in answers else False

    def close(self) -> list[StepRecord]:
        out = self.poll()
        if not self._files:
            raise InputError("no event file appeared before the watch ended", file=self.name)
        while self.behind:
            out += self.poll()
        bad = sum(f.bad_events for f in self._files.values())
        if bad:
            self._parser.notes.append(f"{bad} event(s) could not be decoded and were skipped")
        for ef in self._files.values():
            ef.close()
        # not parser.finish(): that re-reads the run through the accumulator
        return out + self._parser.merger.flush()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
