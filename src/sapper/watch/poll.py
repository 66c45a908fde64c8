"""Following a run whose reader opens its own files (a format with ``read_mode`` "poll").

TensorBoard has its own follower (:mod:`.events`, frame by frame). Any other format
whose parser reads a run folder or one of its files itself (a W&B or MLflow run, see
:class:`sapper.logs.formats.LogFormat`) is followed by asking its parser, on each poll,
for what is new; the run counts as written to whenever a poll returns records.

The path may name the run, one of its files, or a folder the run will appear in (``wandb/``
before ``wandb.init`` has made it): the follower waits until the format's ``runs_in``
shows exactly one run, or a ``latest-run`` link (W&B's own) says which of several, and
until the run folder holds what its recogniser needs (the tracker makes the folder before
its files).
"""

from __future__ import annotations

import time
from pathlib import Path

from sapper.errors import InputError
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
        self._run()  # a folder holding several runs is refused now, not at the first poll

    @property
    def format(self) -> str | None:
        return self.kind.name

    @property
    def parser(self) -> LogParser | None:
        return self._parser

    def _run(self) -> Path | None:
        """The run to read, once there is one (None while waiting)."""
        if not self.path.exists():
            return None
        if not self.path.is_dir():
            return self.path
        recognise = self.kind.recognise_dir
        if recognise is not None and recognise(self.path) >= 0.9:
            return self.path
        runs = self.kind.runs_in(self.path) if self.kind.runs_in is not None else []
        if len(runs) > 1:
            for base in (self.path, *runs[0].parents):
                latest = base / "latest-run"
                if latest.is_dir():
                    return latest
                if base == self.path:
                    break
            raise InputError(
                f"holds {len(runs)} {self.kind.name} runs; watch one of them",
                file=str(self.path),
                expected=", ".join(str(r) for r in runs[:5]),
            )
        if runs and (recognise is None or recognise(runs[0]) >= 0.9):
            return runs[0]
        return None

    def poll(self) -> list[StepRecord]:
        if self._parser is None:
            run = self._run()
            if run is None:
                return []
            refuse_special(run)  # a FIFO would block the parser's first read
            self._parser = self.kind.parser(run, self.mapping)
        records: list[StepRecord] = self._parser.poll()  # type: ignore[attr-defined]
        if records:
            self._saw_data(time.monotonic())
        return records

    def close(self) -> list[StepRecord]:
        out = self.poll()
        if self._parser is None:
            raise InputError(
                f"no {self.kind.name} run appeared before the watch ended", file=self.name
            )
        return out + self._parser.finish()
