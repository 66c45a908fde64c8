"""Following a run whose reader opens its own files (a format with ``read_mode`` "poll").

TensorBoard has its own follower (:mod:`.events`, frame by frame). Any other format
whose parser reads a run folder or one of its files itself (see
:class:`sapper.logs.formats.LogFormat`) is followed by asking its parser, on each poll,
for what is new; the run counts as written to whenever a poll returns records.
"""

from __future__ import annotations

import time
from pathlib import Path

from sapper.logs.base import LogParser
from sapper.logs.fields import FieldMap
from sapper.logs.formats import LogFormat
from sapper.logs.limits import refuse_special
from sapper.runtime.records import StepRecord
from sapper.watch.follow import Follower

__all__ = ["PollFollower"]


class PollFollower(Follower):
    """Follows one run of a ``poll`` format (a folder, or one file of it)."""

    def __init__(
        self, path: str | Path, kind: LogFormat, mapping: dict[str, FieldMap] | None = None
    ) -> None:
        super().__init__(str(path))
        self.path = Path(path)
        self.kind = kind
        self.mapping = dict(mapping or {})
        self._parser: LogParser | None = None

    @property
    def format(self) -> str | None:
        return self.kind.name

    @property
    def parser(self) -> LogParser | None:
        return self._parser

    def poll(self) -> list[StepRecord]:
        if self._parser is None:
            if not self.path.exists():
                return []
            refuse_special(self.path)  # a FIFO would block the parser's first read
            self._parser = self.kind.parser(self.path, self.mapping)
        records: list[StepRecord] = self._parser.poll()  # type: ignore[attr-defined]
        if records:
            self._saw_data(time.monotonic())
        return records

    def close(self) -> list[StepRecord]:
        out = self.poll()
        return out + (self._parser.finish() if self._parser is not None else [])
