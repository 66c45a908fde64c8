"""Which follower a path needs, decided once the path shows what it is.

``sapper watch`` is often started before the job writes anything: the log file, the
TensorBoard folder or the Trainer's output folder may not exist yet, or hold only a
header. :class:`AutoFollower` waits (one ``stat`` per poll) until the path can be
recognized — a folder with ``trainer_state.json``/``checkpoint-N`` or event files, a
file whose first bytes are an event record, or complete text lines the log detector
recognizes — and then hands every call to the follower for that format.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import BinaryIO

from sapper.errors import InputError
from sapper.logs import LogParser
from sapper.logs.detect import decode_head, detect_text
from sapper.logs.fields import FieldMap
from sapper.logs.limits import refuse_special
from sapper.logs.registry import find_log_format, log_formats, recognise_bytes, recognise_dir
from sapper.runtime.records import StepRecord
from sapper.watch.events import EVENTS_MARK, EventsFollower, is_event_header
from sapper.watch.follow import DETECT_LIMIT, FileFollower, Follower, StreamFollower
from sapper.watch.poll import PollFollower
from sapper.watch.snapshot import STATE_FILE, SnapshotFollower, newest_state

__all__ = ["AutoFollower", "open_follower"]


def open_follower(
    path: str | Path,
    fmt: str | None = None,
    mapping: dict[str, FieldMap] | None = None,
    stdin: BinaryIO | None = None,
) -> Follower:
    """The follower for ``path`` (``-`` is standard input); ``fmt`` skips detection."""
    kind = find_log_format(fmt) if fmt is not None else None
    if str(path) == "-":
        if kind is not None and kind.read_mode != "lines":
            raise InputError(
                f"a {fmt} log cannot be read from a pipe",
                field="--log-format",
                value=fmt,
                expected="a text log on stdin (Megatron, CSV, JSON lines, sapper run log)",
            )
        return StreamFollower(stdin if stdin is not None else sys.stdin.buffer, fmt, mapping)
    path = Path(path)
    if fmt == "tensorboard":
        return EventsFollower(path, mapping)
    if fmt == "trainer_state":
        return SnapshotFollower(path, mapping)
    if kind is not None and kind.read_mode == "poll":
        return PollFollower(path, kind, mapping)
    if fmt is not None:
        return FileFollower(path, fmt, mapping)
    return AutoFollower(path, mapping)


class AutoFollower(Follower):
    """Waits for ``path`` to become recognizable, then delegates to the right follower."""

    def __init__(self, path: Path, mapping: dict[str, FieldMap] | None = None) -> None:
        super().__init__(str(path))
        self.path = path
        self.mapping = dict(mapping or {})
        self.inner: Follower | None = None
        self._undetected: InputError | None = None  # why the content is not recognized yet

    @property
    def format(self) -> str | None:
        return self.inner.format if self.inner is not None else None

    @property
    def parser(self) -> LogParser | None:
        return self.inner.parser if self.inner is not None else None

    def poll(self) -> list[StepRecord]:
        if self.inner is None:
            self.inner = self._resolve()
            if self.inner is None:
                return []
        return self._sync(self.inner.poll())

    def pending(self) -> bool | None:
        return self.inner.pending() if self.inner is not None else None

    def settle(self) -> list[StepRecord]:
        return self._sync(self.inner.settle()) if self.inner is not None else []

    def close(self) -> list[StepRecord]:
        if self.inner is None:
            if self._undetected is not None:
                raise self._undetected
            what = "no log appeared in this folder" if self.path.is_dir() else "did not appear"
            raise InputError(f"{what} before the watch ended", file=self.name)
        return self._sync(self.inner.close())

    def _sync(self, records: list[StepRecord]) -> list[StepRecord]:
        inner = self.inner
        assert inner is not None
        self.last_data, self.quiet_since = inner.last_data, inner.quiet_since
        self.ended, self.waiting, self.behind = inner.ended, inner.waiting, inner.behind
        self.events.extend(inner.events)
        inner.events.clear()
        return records

    def _resolve(self) -> Follower | None:
        path = self.path
        if path.is_dir():
            if newest_state(path) is not None:
                return SnapshotFollower(path, self.mapping)
            try:
                has_events = any(EVENTS_MARK in e.name and e.is_file() for e in os.scandir(path))
            except OSError:
                has_events = False
            if has_events:
                return EventsFollower(path, self.mapping)
            kind = recognise_dir(path)  # another reader's run folder (W&B, MLflow ...)
            if kind is not None and kind.read_mode == "poll" and kind.name != "tensorboard":
                return PollFollower(path, kind, self.mapping)
            for kind in log_formats():  # a parent of such runs (wandb/, mlruns/ ...)
                if kind.read_mode == "poll" and kind.name != "tensorboard" and kind.runs_in:
                    if kind.runs_in(path):
                        return PollFollower(path, kind, self.mapping)
            runs = sorted({p.parent for p in path.glob(f"*/*{EVENTS_MARK}*") if p.is_file()})
            if len(runs) == 1:  # e.g. the Trainer's output_dir/runs/<date_host>
                self.events.append(f"following the TensorBoard run {runs[0]}")
                return EventsFollower(runs[0], self.mapping)
            if runs:
                raise InputError(
                    f"holds {len(runs)} TensorBoard runs; watch one of them",
                    file=self.name,
                    expected=", ".join(str(r) for r in runs[:5]),
                )
            self.waiting = f"waiting for {STATE_FILE} or event files in {path}"
            return None
        if EVENTS_MARK in path.name and path.is_file():
            return EventsFollower(path, self.mapping)
        if path.name == STATE_FILE and path.is_file():
            return SnapshotFollower(path, self.mapping)
        refuse_special(path)  # a FIFO would block here for good, a device never end
        try:
            with path.open("rb") as fh:
                head = fh.read(DETECT_LIMIT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=self.name) from None
        return self._from_head(path, head)

    def _from_head(self, path: Path, head: bytes) -> Follower | None:
        if is_event_header(head):
            return EventsFollower(path, self.mapping)
        kind = recognise_bytes(head, path) if len(head) >= 12 else None
        if kind is not None and kind.read_mode == "poll" and kind.name != "tensorboard":
            return PollFollower(path, kind, self.mapping)
        text = decode_head(head, path)  # in its encoding, NUL blocks left out
        if "\n" not in text:
            self.waiting = f"{path.name} has no complete line yet"
            return None
        complete = text[: text.rfind("\n") + 1]
        try:
            fmt = detect_text(complete, path)
        except InputError as exc:
            if len(head) >= DETECT_LIMIT:
                raise
            self._undetected = exc
            self.waiting = f"{path.name}: format not recognized yet ({exc.problem})"
            return None
        if fmt == "trainer_state":
            return SnapshotFollower(path, self.mapping)
        return FileFollower(path, fmt, self.mapping)

