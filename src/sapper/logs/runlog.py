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
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sapper.logs.base import LogData, LogParser
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = ["RunLogParser", "read_sapper_log"]

_NAMES = frozenset(f.name for f in fields(StepRecord)) - {"extra"}
_DEFAULTS = {f.name: f.default for f in fields(StepRecord) if f.default is not MISSING}
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_new = StepRecord.__new__


def _value(value: Any) -> Any:
    if value.__class__ is str:
        return _NONFINITE.get(value, value)
    if value.__class__ is list:
        return [_NONFINITE.get(v, v) if v.__class__ is str else v for v in value]
    return value


def _step_record(obj: dict[str, Any], nonfinite: bool) -> StepRecord:
    """``StepRecord.from_json`` without its per-call overhead (it runs a million times):
    the record's ``__dict__`` is filled directly. ``nonfinite`` says whether the batch
    held any "nan"/"inf" string at all; most batches hold none and skip the scan."""
    extra = obj.pop("extra", None) or {}
    if not _NAMES.issuperset(obj):
        for key in obj.keys() - _NAMES:
            extra[key] = obj.pop(key)
    if nonfinite:
        obj = {k: _value(v) for k, v in obj.items()}
    rec = _new(StepRecord)
    rec.__dict__ = {**_DEFAULTS, **obj, "extra": extra}
    return rec


class RunLogParser(LogParser):
    """Incremental parser of sapper run logs."""

    format = "sapper"

    def __init__(self, source: str = "<input>") -> None:
        super().__init__(source)
        self._line = 0
        self._bad: list[int] = []
        self._last: int | None = None
        self._replayed = 0
        self._nonfinite = False

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        texts = [line.strip() for line in lines]
        numbers = [self._line + 1 + i for i, t in enumerate(texts) if t]
        self._line += len(texts)
        batch = "[" + ",".join(t for t in texts if t) + "]"
        self._nonfinite = '"nan"' in batch or 'inf"' in batch
        try:
            objs = json.loads(batch)
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
        step = obj.get("step")
        if step.__class__ is not int:
            self._bad.append(line)
            return
        try:
            rec = _step_record(obj, self._nonfinite)
        except (TypeError, AttributeError):  # "extra" that is not an object
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
