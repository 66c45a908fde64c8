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
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sapper.errors import quote
from sapper.logs.base import SPARSE_RECORDS, LogParser, put_mapped, to_float
from sapper.logs.fields import FieldMap
from sapper.logs.formats import LogFormat, first_line, first_object
from sapper.logs.limits import (
    MAX_COUNT,
    any_too_deep,
    json_int,
    nested_too_deep,
)
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = ["FORMAT", "RunLogParser"]

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


#: What each StepRecord field may hold, by name (the others hold a float).
_COUNTS = frozenset({"step", "tokens", "samples", "skipped_total"})
_PLAIN = frozenset({int, float})
#: ``StepRecord.extra`` entries other readers and the detectors share, each a
#: ``{name: number}`` map.
_NUMBER_MAPS = ("eval_losses", "grad_norm_layers")


def _valid(key: str, value: Any) -> Any:
    """``value`` as field ``key`` holds it, or ``_BAD`` when it cannot (a string, an
    object, a list where a number belongs, a count out of range)."""
    if value is None:
        return None
    if key in _COUNTS:
        if value.__class__ is int and 0 <= value <= MAX_COUNT:
            return value
        return _BAD
    if key == "skipped":
        return value if value.__class__ is bool or value in (0, 1) else _BAD
    if key == "lrs":
        if value.__class__ is list and all(to_float(v) is not None for v in value[:_LRS]):
            return [to_float(v) for v in value[:_LRS]]
        return _BAD
    if value.__class__ is bool:
        return _BAD
    number = to_float(value) if value.__class__ is not str or value in _NONFINITE else None
    return _BAD if number is None else number


_BAD = object()
_LRS = 1024  # learning rates per step at most (one per parameter group)


def _number_map(value: Any) -> dict[str, float] | None:
    if value.__class__ is not dict:
        return None
    out = {}
    for name, v in value.items():
        number = None if v.__class__ is bool else to_float(v)
        if number is not None:
            out[name] = number
    return out


def _step_record(obj: dict[str, Any], nonfinite: bool, bad: Counter[str]) -> StepRecord | None:
    """``StepRecord.from_json`` without its per-call overhead (it runs a million times):
    the record's ``__dict__`` is filled directly. ``nonfinite`` says whether the line
    spells a float as "nan"/"inf"; most lines do not and skip the conversion. A field
    holding what it cannot (a string, an object, a list where a number belongs) is left
    out and counted in ``bad`` by name; ``None`` when ``extra`` is not an object."""
    extra = obj.pop("extra", None) or {}
    if extra.__class__ is not dict:
        return None
    if not _NAMES.issuperset(obj):
        for key in obj.keys() - _NAMES:
            extra[key] = obj.pop(key)
    get = obj.get
    if (
        not _PLAIN.issuperset(map(type, obj.values()))
        or "skipped" in obj
        or "lrs" in obj
        or get("tokens", 0).__class__ is not int
        or get("samples", 0).__class__ is not int
        or get("skipped_total", 0).__class__ is not int
    ):
        checked = {k: _valid(k, v) for k, v in obj.items()}
        for key in [k for k, v in checked.items() if v is _BAD]:
            del checked[key]
            bad[key] += 1
        obj = checked
    elif nonfinite:
        obj = {k: _value(v) for k, v in obj.items()}
    for name in _NUMBER_MAPS:
        if name in extra:
            numbers = _number_map(extra[name])
            if numbers is None:
                del extra[name]
                bad[f"extra.{name}"] += 1
            else:
                extra[name] = numbers
    obj["extra"] = extra
    if not SPARSE_RECORDS:
        obj = {**_DEFAULTS, **obj}
    rec = _new(StepRecord)
    # A field the line leaves out reads as the class-level default, so the record keeps
    # the decoded dict as is: no copy of ~25 keys per record.
    rec.__dict__ = obj
    return rec


class RunLogParser(LogParser):
    """Incremental parser of sapper run logs."""

    format = "sapper"

    def __init__(self, source: str = "<input>", mapping: dict[str, FieldMap] | None = None) -> None:
        super().__init__(source, mapping)
        self._line = 0
        self._bad: list[int] = []
        self._last: int | None = None
        self._bad_fields: Counter[str] = Counter()  # field name -> values left out
        #: Restarts seen so far, and the attempt each stored finding was written in: a
        #: resumed run logs a finding again at the same step, in its own attempt.
        self._restarts = 0
        self._finding_attempts: list[int] = []

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        texts = lines if isinstance(lines, list) else list(lines)
        first = self._line + 1
        self._line += len(texts)
        kept = [t for t in texts if t and not t.isspace()]
        # Line numbers are only needed for notes; without blank lines they are implicit.
        numbers: Sequence[int] = (
            range(first, first + len(texts))
            if len(kept) == len(texts)
            else [first + i for i, t in enumerate(texts) if t and not t.isspace()]
        )
        batch = "[" + ",".join(kept) + "]"
        try:
            if any_too_deep(kept):
                raise RecursionError  # found line by line below
            objs = json.loads(batch, parse_int=json_int)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            objs, numbers, kept = self._one_by_one(kept, numbers)
        # The lines that spell a non-finite float as a string: usually none, so no scan.
        special: set[int] = set()
        if '"nan"' in batch or 'inf"' in batch:
            special = {n for n, t in zip(numbers, kept, strict=True) if '"nan"' in t or 'inf"' in t}
        out: list[StepRecord] = []
        last = self._last
        tracker = self.merger.tracker
        mark = 0
        for obj, line in zip(objs, numbers, strict=True):
            if obj.__class__ is not dict:
                self._bad.append(line)
                continue
            kind = obj.pop("kind", None)
            if kind == "step":
                step = obj.get("step")
                if step.__class__ is not int or not 0 <= step <= MAX_COUNT:
                    self._bad.append(line)
                    continue
                rec = _step_record(obj, line in special, self._bad_fields)
                if rec is None:  # "extra" that is not an object
                    self._bad.append(line)
                    continue
                if last is not None and step <= last:  # resumed from a checkpoint
                    tracker.emitted(out[mark:])
                    mark = len(out)
                    tracker.restart()
                    self._restarts += 1
                if self.mapping:
                    self._map(rec)
                out.append(rec)
                last = step
            elif kind == "finding":
                self._finding(obj, line)
            elif kind == "meta":
                self.meta.update(obj)  # read by name only (``plan``, validated there)
            else:
                self._bad.append(line)
        tracker.emitted(out[mark:])
        self._last = last
        return out

    def _map(self, rec: StepRecord) -> None:
        """Apply ``--map`` to a record: a source key (a field or an ``extra`` entry) moves
        to its target."""
        fields = rec.__dict__
        extra = rec.extra
        self.keys_seen.update(k for k in fields if k not in ("step", "extra"))
        self.keys_seen.update(extra)
        for key in self.mapping:
            if key in extra:
                raw = extra.pop(key)
            elif key in fields and key not in ("step", "extra"):
                raw = fields.pop(key)
            else:
                continue
            values: dict[str, Any] = {}
            put_mapped(self.mapping[key], to_float(raw), values, extra)
            fields.update(values)

    def _one_by_one(
        self, texts: list[str], numbers: Sequence[int]
    ) -> tuple[list[Any], list[int], list[str]]:
        """Decode line by line after a batch failed: the good lines, the bad ones noted."""
        objs, good, good_texts = [], [], []
        for text, line in zip(texts, numbers, strict=True):
            try:
                if nested_too_deep(text):
                    raise RecursionError
                objs.append(json.loads(text, parse_int=json_int))
            except (ValueError, RecursionError):
                self._bad.append(line)
                continue
            good.append(line)
            good_texts.append(text)
        return objs, good, good_texts

    def _finding(self, obj: dict[str, Any], line: int) -> None:
        try:
            self.findings.append(Finding.model_validate(obj))
        except ValidationError:
            self._bad.append(line)
            return
        self._finding_attempts.append(self._restarts + 1)

    def finish(self) -> list[StepRecord]:
        if self._restarts:  # tagged as analyze tags the findings of each attempt
            self.findings[:] = [
                f
                if "attempt" in f.data
                else f.model_copy(update={"data": {**f.data, "attempt": n}})
                for f, n in zip(self.findings, self._finding_attempts, strict=True)
            ]
        if self._bad:
            last = self._bad[-1] == self._line
            shown = ", ".join(map(str, self._bad[:5])) + (" ..." if len(self._bad) > 5 else "")
            what = (
                "a torn last line (the run was still writing or crashed)"
                if (last and len(self._bad) == 1)
                else f"{len(self._bad)} unreadable line(s): {shown}"
            )
            self.notes.append(f"skipped {what}")
        if self._bad_fields:
            shown = ", ".join(f"{quote(k)} ×{n}" for k, n in self._bad_fields.most_common(10))
            self.notes.append(
                f"left out {self._bad_fields.total()} value(s) that were not numbers in range "
                f"where a number belongs: {shown}"
            )
        self.note_unused_mapping()
        return []


_KINDS = frozenset({"meta", "step", "finding"})


def _recognise(text: str, path: Path) -> float:
    """A run log's first line is one of its own records: ``{"kind": "meta", ...}``."""
    obj = first_object(first_line(text))
    return 1.0 if obj is not None and obj.get("kind") in _KINDS else 0.0


FORMAT = LogFormat(
    name="sapper",
    title="a sapper run log (JSONL)",
    looks_for='JSON lines whose first record says "kind": "meta", "step" or "finding"',
    parser=lambda path, mapping: RunLogParser(str(path), mapping),
    recognise_text=_recognise,
)
