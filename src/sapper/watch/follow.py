"""Poll-based followers: what a growing log added since the last look, as step records.

``sapper watch`` runs next to a job it does not control, so it only reads: every poll
asks a follower for the bytes written since the previous poll and feeds the complete
lines to the log reader's incremental parser (:mod:`sapper.logs`); nothing is read
twice. Polling (a ``stat`` and a ``read`` per interval) works on every file system the
cluster may put the log on (NFS, Lustre, GPFS), where change notifications do not.

A text follower holds back a torn last line until its newline arrives, waits for a file
that does not exist yet, notices rotation (the name now points to another inode: the
old file is read to its end first) and truncation (the file shrank: read again from the
start). A stream follower reads a pipe (``torchrun ... | tee log | sapper watch -``) on a
background thread, so a quiet pipe never blocks the loop. Each follower records when it
last saw new data, from which the watcher decides when the writer has gone quiet
(:meth:`Follower.settle`) or gone (``--idle-timeout``).
"""

from __future__ import annotations

import codecs
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from sapper.errors import InputError
from sapper.logs import LogParser, make_parser
from sapper.logs.base import LineBuffer
from sapper.logs.detect import SUPPORTED, detect_text
from sapper.logs.fields import FieldMap
from sapper.logs.limits import MAX_LINE_CHARS, refuse_special, sniff_encoding
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = ["CHUNK", "DETECT_LIMIT", "FileFollower", "Follower", "StreamFollower", "TextFeed"]

#: Bytes of unrecognized text after which format detection gives up (Megatron prints
#: hundreds of argument lines before its first iteration line).
DETECT_LIMIT = 1 << 20
#: Bytes read per poll at most: catching up with a long log takes several quick polls,
#: so the view stays current and Ctrl-C is answered between them.
CHUNK = 4 << 20


class Follower:
    """What the watcher asks of every follower; subclasses implement :meth:`poll`."""

    def __init__(self, name: str) -> None:
        #: The path followed (``-`` for standard input), for messages.
        self.name = name
        #: Monotonic time when new data was last seen (``None``: nothing yet).
        self.last_data: float | None = None
        #: Monotonic estimate of the writer's last write (from the file's mtime when it is
        #: plausible), so a quiet writer is noticed within the poll that read its last line.
        self.quiet_since: float | None = None
        #: The input ended for good (a pipe closed): nothing more can come.
        self.ended = False
        #: More data is waiting to be read now (catching up): poll again at once.
        self.behind = False
        #: What the follower did that the user should know (rotation, truncation ...).
        self.events: list[str] = []
        #: Why nothing is read yet ("waiting for the file to appear"), or ``None``.
        self.waiting: str | None = f"waiting for {name} to appear"

    @property
    def format(self) -> str | None:
        """The log format once known (see :data:`sapper.logs.FORMATS`)."""
        return None

    @property
    def parser(self) -> LogParser | None:
        """The incremental parser, once the format is known."""
        return None

    def poll(self) -> list[StepRecord]:
        """Records completed by what was written since the last call."""
        raise NotImplementedError

    def pending(self) -> bool | None:
        """Whether the source holds data not read yet, found without reading it (a
        ``stat``); ``None`` when this follower cannot tell cheaply."""
        return None

    def settle(self) -> list[StepRecord]:
        """The writer went quiet: release the steps the parser holds back."""
        return self.parser.merger.settle() if self.parser is not None else []

    def close(self) -> list[StepRecord]:
        """End of following: the records still held back."""
        return self.parser.finish() if self.parser is not None else []

    @property
    def notes(self) -> list[str]:
        return self.parser.notes if self.parser is not None else []

    @property
    def findings(self) -> list[Finding]:
        """Findings stored in the log itself (the live monitor's, in a sapper run log)."""
        return self.parser.findings if self.parser is not None else []

    @property
    def meta(self) -> dict[str, Any]:
        return self.parser.meta if self.parser is not None else {}

    def _saw_data(self, now: float, mtime: float | None = None) -> None:
        self.last_data = now
        self.waiting = None
        since = now
        if mtime is not None:
            age = time.time() - mtime
            if 0.0 <= age < 3600.0:  # a clock skewed into the future, or absurd, is ignored
                since = now - age
        self.quiet_since = since


class TextFeed:
    """Bytes of a text log → complete lines → the parser (detected from the first lines)."""

    def __init__(self, name: str, fmt: str | None, mapping: dict[str, FieldMap]) -> None:
        self.name = name
        self.format = fmt
        self.mapping = mapping
        self.parser: LogParser | None = make_parser(fmt, name, mapping) if fmt else None
        self._head: list[str] = []
        self._head_bytes = 0
        self._raw_bytes = 0  # bytes pushed before the format was known
        #: Why the format is not known yet (the detector's last answer).
        self.undetected: InputError | None = None
        self._overlong = self._overlong_told = 0
        self._lines: LineBuffer | None = None
        self.reset()

    def reset(self) -> None:
        """Start a new byte stream (a rotated or truncated file); the parser keeps its
        state, so a step logged again starts a new attempt (a restart) rather than
        merging into the old one."""
        self._decoder: codecs.IncrementalDecoder | None = None  # chosen by the first bytes
        if getattr(self, "_lines", None) is not None:
            self._overlong += self._lines.overlong
        self._lines = LineBuffer()

    def push(self, data: bytes) -> list[StepRecord]:
        if self.parser is None:
            self._raw_bytes += len(data)
            if self._raw_bytes > 2 * DETECT_LIMIT and not self._head:
                # NULs, one endless line, binary: nothing a reader could ever recognize.
                raise InputError(
                    f"no complete text line in the first {self._raw_bytes:,} bytes",
                    file=self.name,
                    expected=SUPPORTED,
                )
        if self._decoder is None:
            if not data:
                return []
            self._decoder = codecs.getincrementaldecoder(sniff_encoding(data))(errors="replace")
        return self._feed(self._lines.push(self._decoder.decode(data)))

    def drain(self) -> list[StepRecord]:
        """The stream ended: its unterminated last line is complete after all."""
        tail = self._decoder.decode(b"", final=True) if self._decoder is not None else ""
        return self._feed(self._lines.push(tail) + self._lines.rest())

    def overlong_note(self) -> str | None:
        """Lines skipped for their length so far, for the watch's notes."""
        count = self._overlong + self._lines.overlong
        if count == self._overlong_told:
            return None
        self._overlong_told = count
        return f"skipped {count} line(s) longer than {MAX_LINE_CHARS:,} characters so far"

    def end(self) -> list[StepRecord]:
        """End of input: drain, then let the parser release what it holds."""
        out = self.drain()
        if self.parser is None:
            if self.undetected is not None and self._head:
                raise self.undetected
            raise InputError("no log line arrived before the watch ended", file=self.name)
        return out + self.parser.finish()

    def _feed(self, lines: list[str]) -> list[StepRecord]:
        if self.parser is not None and self._lines is not None and self._lines.overlong:
            note = self.overlong_note()
            if note:
                self.parser.notes.append(note)
        if not lines:
            return []
        if self.parser is None:
            self._head.extend(lines)
            self._head_bytes += sum(len(line) + 1 for line in lines)
            if not self._detect():
                return []
            lines, self._head = self._head, []
        return self.parser.feed(lines) if self.parser is not None else []

    def _detect(self) -> bool:
        text = "\n".join(self._head)
        if not text.strip():
            return False
        try:
            fmt = detect_text(text, self.name)
        except InputError as exc:
            if self._head_bytes >= DETECT_LIMIT:
                raise
            self.undetected = exc
            return False
        if fmt == "trainer_state":
            raise InputError(
                "a trainer_state.json is rewritten at each save and cannot be read from a "
                "stream",
                file=self.name,
                expected="the path of the trainer_state.json or of the output folder",
            )
        self.format, self.undetected = fmt, None
        self.parser = make_parser(fmt, self.name, self.mapping)
        return True


class FileFollower(Follower):
    """Follows one text log by name, like ``tail -F``."""

    def __init__(
        self, path: str | Path, fmt: str | None = None, mapping: dict[str, FieldMap] | None = None
    ) -> None:
        super().__init__(str(path))
        self.path = Path(path)
        self.feed = TextFeed(str(path), fmt, dict(mapping or {}))
        self._fh: BinaryIO | None = None
        self._id: tuple[int, int] | None = None
        self._offset = 0

    @property
    def parser(self) -> LogParser | None:
        return self.feed.parser

    @property
    def format(self) -> str | None:
        return self.feed.format

    def poll(self) -> list[StepRecord]:
        now = time.monotonic()
        out: list[StepRecord] = []
        if self._fh is None:
            if not self._open():
                return out
        else:
            out += self._rotated(now)
            if self._fh is None:
                return out
        self._truncated()
        out += self._read(now)
        if self.waiting is None and self.feed.undetected is not None:
            self.waiting = f"reading {self.path.name}: format not recognized yet"
        return out

    def pending(self) -> bool | None:
        if self._fh is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino) != self._id or st.st_size != self._offset

    def close(self) -> list[StepRecord]:
        if self._id is None:
            raise InputError("did not appear before the watch ended", file=self.name)
        out = self.poll()  # what was written since the last poll
        while self.behind and self._fh is not None:
            out += self._read(time.monotonic())
        out += self.feed.end()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        return out

    def _open(self) -> bool:
        refuse_special(self.path)  # opening a FIFO would block the watch for good
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            raise InputError(
                "a folder, not a text log", file=self.name,
                expected="a log file, or --log-format tensorboard / trainer_state",
            ) from None
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=self.name) from None
        st = os.fstat(fh.fileno())
        self._fh, self._id, self._offset = fh, (st.st_dev, st.st_ino), 0
        self.waiting = f"{self.path.name} is empty"
        return True

    def _rotated(self, now: float) -> list[StepRecord]:
        """The name points to a new file: finish the old one, then follow the new one."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []  # moved away, the new file not created yet: keep reading the old one
        except OSError as exc:  # the name now a link to itself, a folder without access
            raise InputError(f"cannot read it ({exc.strerror})", file=self.name) from None
        if (st.st_dev, st.st_ino) == self._id:
            return []
        out: list[StepRecord] = []
        while True:  # the old file to its end, before its name is given up
            out += self._read(now)
            if not self.behind:
                break
        out += self.feed.drain()
        assert self._fh is not None
        self._fh.close()
        self._fh = None
        self.feed.reset()
        self.events.append(f"{self.path.name} was rotated; following the new file")
        if self._open():
            self.waiting = None
        return out

    def _truncated(self) -> None:
        assert self._fh is not None
        size = os.fstat(self._fh.fileno()).st_size
        if size < self._offset:
            self.events.append(
                f"{self.path.name} was truncated ({self._offset:,} → {size:,} bytes); reading "
                "it again from the start (steps it logs again start a new attempt)"
            )
            self._offset = 0
            self.feed.reset()

    def _read(self, now: float) -> list[StepRecord]:
        fh = self._fh
        assert fh is not None
        fh.seek(self._offset)
        try:
            chunk = fh.read(CHUNK)
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=self.name) from None
        self.behind = len(chunk) == CHUNK
        if not chunk:
            return []
        self._offset += len(chunk)
        out = self.feed.push(chunk)
        self._saw_data(now, os.fstat(fh.fileno()).st_mtime)
        return out


class StreamFollower(Follower):
    """Follows a pipe (standard input); a reader thread hands over chunks as they arrive."""

    #: A pipe holds nothing written before the watch started: every finding is new.
    live = True

    def __init__(
        self,
        stream: BinaryIO,
        fmt: str | None = None,
        mapping: dict[str, FieldMap] | None = None,
        name: str = "-",
    ) -> None:
        super().__init__(name)
        self.feed = TextFeed("<stdin>" if name == "-" else name, fmt, dict(mapping or {}))
        self.waiting = "waiting for input on stdin" if name == "-" else f"waiting for {name}"
        self._queue: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._pump, args=(stream,), name="sapper-watch-stdin", daemon=True
        )
        self._thread.start()

    @property
    def parser(self) -> LogParser | None:
        return self.feed.parser

    @property
    def format(self) -> str | None:
        return self.feed.format

    def _pump(self, stream: BinaryIO) -> None:
        read = _reader(stream)
        try:
            while chunk := read():
                self._queue.put((time.monotonic(), chunk))
        except (OSError, ValueError):
            pass  # a closed or broken pipe ends the input like EOF
        self._queue.put(None)

    def poll(self) -> list[StepRecord]:
        out: list[StepRecord] = []
        while not self.ended:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.ended = True
                break
            arrived, chunk = item
            out += self.feed.push(chunk)
            self._saw_data(arrived)
        if self.waiting is None and self.feed.undetected is not None:
            self.waiting = "format not recognized yet"
        return out

    def pending(self) -> bool | None:
        return not self._queue.empty()

    def close(self) -> list[StepRecord]:
        return self.poll() + self.feed.end()


def _reader(stream: BinaryIO) -> Any:
    """A call returning whatever bytes are available (at most 64 KiB), b"" at EOF."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd is not None:
        return lambda: os.read(fd, 1 << 16)
    read1 = getattr(stream, "read1", None)
    if read1 is not None:
        return lambda: read1(1 << 16)
    return lambda: stream.read(1 << 16)
