"""sapper's own JSONL run log, written by the live monitor.

The contract (shared with the monitor and ``sapper watch``): one JSON object per line,
``{"kind": "meta", "version": 1, ...}`` once at the top, ``{"kind": "step", ...}`` per
logged step (``StepRecord.to_json``), ``{"kind": "finding", ...}`` per finding the live
monitor raised (kept, so the report can show what fired during the run). Non-finite
floats are the strings ``"nan"``, ``"inf"``, ``"-inf"``. The writer appends while
training runs, so a torn last line is normal after a crash and is skipped with a note.

Lines are decoded in batches (one ``json.loads`` over many lines is several times faster
than one per line) so a million-step log reads in seconds; a batch with a bad line is
decoded line by line to find it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sapper.logs.base import LogData, LogParser
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = ["RunLogParser", "read_sapper_log"]

_NAMES = frozenset(f.name for f in fields(StepRecord)) - {"extra"}
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _value(value: Any) -> Any:
    if value.__class__ is str:
        return _NONFINITE.get(value, value)
    if value.__class__ is list:
        return [_NONFINITE.get(v, v) if v.__class__ is str else v for v in value]
    return value


def _step_record(obj: dict[str, Any]) -> StepRecord:
    """``StepRecord.from_json`` without its per-call overhead (it runs a million times)."""
    extra = obj.pop("extra", None) or {}
    for key in obj.keys() - _NAMES:
        extra[key] = obj.pop(key)
    return StepRecord(**{k: _value(v) for k, v in obj.items()}, extra=extra)


class RunLogParser(LogParser):
    """Incremental parser of sapper run logs."""

    format = "sapper"

    def __init__(self, source: str = "<input>") -> None:
        super().__init__(source)
        self._line = 0
        self._bad: list[int] = []
        self._last: int | None = None
        self._replayed = 0

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        texts = [line.strip() for line in lines]
        numbers = [self._line + 1 + i for i, t in enumerate(texts) if t]
        self._line += len(texts)
        try:
            objs = json.loads("[" + ",".join(t for t in texts if t) + "]")
        except json.JSONDecodeError:
            objs, numbers = self._one_by_one(texts, numbers)
        out: list[StepRecord] = []
        for obj, line in zip(objs, numbers, strict=True):
            if not isinstance(obj, dict):
                self._bad.append(line)
                continue
            kind = obj.pop("kind", None)
            if kind == "step":
                self._step(obj, out, line)
            elif kind == "finding":
                self._finding(obj, line)
            elif kind == "meta":
                self.meta.update(obj)
            else:
                self._bad.append(line)
        return out

    def _one_by_one(self, texts: list[str], numbers: list[int]) -> tuple[list[Any], list[int]]:
        objs, good = [], []
        for text, line in zip((t for t in texts if t), numbers, strict=True):
            try:
                objs.append(json.loads(text))
                good.append(line)
            except json.JSONDecodeError:
                self._bad.append(line)
        return objs, good

    def _step(self, obj: dict[str, Any], out: list[StepRecord], line: int) -> None:
        try:
            rec = _step_record(obj)
        except TypeError:
            self._bad.append(line)
            return
        if not isinstance(rec.step, int) or isinstance(rec.step, bool):
            self._bad.append(line)
            return
        if self._last is not None and rec.step <= self._last:
            self._replayed += 1
            return
        self._last = rec.step
        out.append(rec)

    def _finding(self, obj: dict[str, Any], line: int) -> None:
        try:
            self.findings.append(Finding.model_validate(obj))
        except ValidationError:
            self._bad.append(line)

    def finish(self) -> list[StepRecord]:
        if self._bad:
            last = self._bad[-1] == self._line
            shown = ", ".join(map(str, self._bad[:5])) + (" ..." if len(self._bad) > 5 else "")
            what = "a torn last line (the run was still writing or crashed)" if (
                last and len(self._bad) == 1
            ) else f"{len(self._bad)} unreadable line(s): {shown}"
            self.notes.append(f"skipped {what}")
        if self._replayed:
            self.notes.append(
                f"{self._replayed} step record(s) repeated an earlier step (a restart from a "
                "checkpoint?); kept the first occurrence"
            )
        return []


def read_sapper_log(path: str | Path) -> LogData:
    """Read a sapper JSONL run log."""
    from sapper.logs.source import read_log

    return read_log(path, fmt="sapper")
