"""Following a Hugging Face ``trainer_state.json``, which is rewritten, not appended.

The Trainer writes the whole state (with the full ``log_history``) into every
``checkpoint-N`` folder at each save, and into the output folder at the end. So the
follower watches the newest of those files, re-reads it when its modification time or
size changes, and hands the text to :meth:`TrainerStateParser.parse`, which returns only
the steps after the last one it returned: detectors never see a step twice, and a new
checkpoint folder simply continues the stream.

The Trainer writes the file in place, so a poll can catch it half-written: text that is
not yet valid JSON is read again at the next poll, and only a file that stays broken
across two polls is salvaged (every complete entry, with a note).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from sapper.errors import InputError
from sapper.logs import LogParser, TrainerStateParser
from sapper.logs.fields import FieldMap
from sapper.runtime.records import StepRecord
from sapper.watch.follow import Follower

__all__ = ["STATE_FILE", "SnapshotFollower", "newest_state"]

STATE_FILE = "trainer_state.json"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


def newest_state(folder: Path) -> Path | None:
    """The most recently written ``trainer_state.json`` in an output folder: the newest
    ``checkpoint-N`` one while training runs, the folder's own at the end."""
    candidates: list[Path] = []
    top = folder / STATE_FILE
    if top.is_file():
        candidates.append(top)
    try:
        numbered = [
            (int(m.group(1)), p)
            for p in folder.iterdir()
            if (m := _CHECKPOINT.search(p.name)) and (p / STATE_FILE).is_file()
        ]
    except OSError:
        numbered = []
    if numbered:
        candidates.append(max(numbered)[1] / STATE_FILE)
    best: tuple[float, Path] | None = None
    for path in candidates:
        try:
            stamp = path.stat().st_mtime
        except OSError:
            continue
        if best is None or stamp > best[0]:
            best = (stamp, path)
    return best[1] if best else None


class SnapshotFollower(Follower):
    """Follows a ``trainer_state.json`` file, or the Trainer's output folder."""

    def __init__(self, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> None:
        super().__init__(str(path))
        self.path = Path(path)
        self._parser = TrainerStateParser(self.name, mapping)
        self._stamp: tuple[str, int, int] | None = None
        self._broken: tuple[str, int, int] | None = None
        self._current: Path | None = None
        if self.path.suffix.lower() != ".json":
            self.waiting = f"waiting for {STATE_FILE} in {self.path}"

    @property
    def format(self) -> str | None:
        return "trainer_state"

    @property
    def parser(self) -> LogParser | None:
        return self._parser

    def _target(self) -> Path | None:
        if self.path.is_dir():
            return newest_state(self.path)
        return self.path if self.path.is_file() else None

    def poll(self) -> list[StepRecord]:
        target = self._target()
        if target is None:
            return []
        try:
            st = target.stat()
            stamp = (str(target), st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return []
            text = target.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []  # an old checkpoint deleted (save_total_limit) between two calls
        except OSError as exc:
            raise InputError(f"cannot read it ({exc.strerror})", file=str(target)) from None
        if not text.strip():
            return []  # opened for writing, not written yet
        if not _complete(text) and stamp != self._broken:
            self._broken = stamp  # being written: look again at the next poll
            return []
        self._stamp = stamp
        if target != self._current:
            if self._current is not None:
                self.events.append(f"now following {target}")
            self._current = target
            self._parser.source = str(target)
        records = self._parser.parse(text)
        self._saw_data(time.monotonic(), st.st_mtime)
        return records

    def settle(self) -> list[StepRecord]:
        return []  # every snapshot is parsed whole: nothing is held back

    def close(self) -> list[StepRecord]:
        out = self.poll()
        if self._current is None:
            raise InputError(f"no {STATE_FILE} appeared before the watch ended", file=self.name)
        return out


def _complete(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True
