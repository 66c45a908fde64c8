"""What every log reader shares: the parser protocol, the step merger, the result.

Readers are incremental so ``sapper watch`` can follow a growing file with the same code
that ``sapper analyze`` runs once: a parser takes new lines with :meth:`LogParser.feed`
and returns the records that are complete, and :meth:`LogParser.finish` flushes what it
held back at the end of input. Logs are sparse and split one step over several lines or
tags (Megatron's validation line, HF's eval entry, one TensorBoard event per tag), so
values are merged per step by :class:`StepMerger`, which emits a step once a later step
shows it is complete.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, ClassVar

from sapper.logs.counters import FLAG_NAMES, CounterReader
from sapper.logs.fields import FieldMap, normalize_name, resolve
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = [
    "DICT_EXTRAS",
    "SPARSE_RECORDS",
    "Attempt",
    "AttemptTracker",
    "LineBuffer",
    "LogData",
    "LogParser",
    "StepMerger",
    "coerce",
    "gc_paused",
    "new_record",
    "put_mapped",
    "to_float",
]


@dataclass
class Attempt:
    """One run of the job inside a log: a rollback and resume starts the next attempt,
    which logs step numbers the previous one already logged. Its records are
    ``LogData.records[start:stop]``, steps ascending."""

    number: int
    start: int
    stop: int
    first_step: int
    last_step: int


@dataclass
class LogData:
    """One log read into step records, with what reading it found."""

    path: str
    format: str
    records: list[StepRecord]
    #: Findings already stored in the log (a sapper run log keeps the live monitor's).
    findings: list[Finding] = field(default_factory=list)
    #: Facts the log states about the run (max steps, logging interval, the plan ...).
    meta: dict[str, Any] = field(default_factory=dict)
    #: What could not be read, and what was done about it, one line each.
    notes: list[str] = field(default_factory=list)
    #: The attempts in file order; empty means one attempt over all records.
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def first_step(self) -> int | None:
        return self.records[0].step if self.records else None

    @property
    def last_step(self) -> int | None:
        return self.records[-1].step if self.records else None


#: ``StepRecord.extra`` keys holding a dict that several lines or tags of one step fill
#: together (one TensorBoard tag per eval set or layer): merged, not replaced.
DICT_EXTRAS = frozenset({"eval_losses", "grad_norm_layers"})


class AttemptTracker:
    """Numbers the records a parser emits into attempts: :meth:`restart` says the next
    record starts a new one (a rollback and resume), :meth:`emitted` counts records."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.count = 0
        self._new = True

    def restart(self) -> None:
        self._new = True

    def emitted(self, records: list[StepRecord]) -> None:
        for rec in records:
            if self._new or not self.attempts:
                self.attempts.append(
                    Attempt(len(self.attempts) + 1, self.count, self.count, rec.step, rec.step)
                )
                self._new = False
            attempt = self.attempts[-1]
            self.count += 1
            attempt.stop = self.count
            if rec.step > attempt.last_step:
                attempt.last_step = rec.step


class LogParser:
    """Base of the incremental parsers: feed lines, get the records that are complete."""

    #: The format name ``detect_format`` returns for this parser.
    format: ClassVar[str] = ""
    #: Whether the source writes steps in order (see :class:`StepMerger`).
    ordered: ClassVar[bool] = True

    def __init__(self, source: str = "<input>", mapping: dict[str, FieldMap] | None = None) -> None:
        #: The file being read, for error messages.
        self.source = source
        self.notes: list[str] = []
        self.meta: dict[str, Any] = {}
        self.findings: list[Finding] = []
        self.merger = StepMerger(self.notes, ordered=self.ordered)
        #: ``--map`` source key -> target; looked up by :meth:`mapped`.
        self.mapping = dict(mapping or {})
        self._normalized = {normalize_name(k): fm for k, fm in self.mapping.items()}
        #: Source keys the log holds (tracked only while a mapping is given).
        self.keys_seen: set[str] = set()

    @property
    def attempts(self) -> list[Attempt]:
        """The attempts of the records emitted so far (see :class:`Attempt`)."""
        return self.merger.tracker.attempts

    def mapped(self, key: str) -> FieldMap | None:
        """The ``--map`` target of a source key, by its exact or its normalized name."""
        if not self.mapping:
            return None
        fm = self.mapping.get(key)
        return fm if fm is not None else self._normalized.get(normalize_name(key))

    def series_target(self, name: str, kind: str, taken: dict[str, str]) -> FieldMap | None:
        """The record field a named series fills (a TensorBoard tag, an MLflow metric),
        for the caller to decide once per name: ``--map`` first, then the field names;
        a second series meaning a field already ``taken`` is noted and left out, and
        skipped-step and work counters are set up for the series that feed them."""
        if self.mapping:
            self.keys_seen.add(name)
        fm = self.mapped(name) or resolve(name)
        if fm is None or fm.field in ("ignore", "step"):
            return None
        owner = taken.setdefault(f"{fm.field}/{fm.key}", name)
        if owner != name:
            what = f"{fm.field} {fm.key!r}" if fm.key else fm.field
            self.notes.append(f"{kind} {owner!r} and {name!r} both mean {what}; read {owner!r}")
            return None
        if fm.field == "skipped":
            flag = normalize_name(name.rpartition("/")[2]) in FLAG_NAMES
            self.merger.counters.configure_skipped(name, "flag" if flag else "auto")
        elif fm.field in ("tokens", "samples"):
            self.merger.counters.configure_work(fm.field, name)
        return fm

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        """Consume complete lines (without or with their newline); return finished steps."""
        raise NotImplementedError

    def finish(self) -> list[StepRecord]:
        """End of input: return the steps held back."""
        self.note_unused_mapping()
        return self.merger.flush()

    def note_unused_mapping(self) -> None:
        """One note per ``--map`` source key the log never held: a typo must not pass
        silently as "no finding"."""
        seen = {normalize_name(k) for k in self.keys_seen}
        for key in self.mapping:
            if key in self.keys_seen or normalize_name(key) in seen:
                continue
            shown = sorted(self.keys_seen)
            listed = ", ".join(shown[:12])
            if len(shown) > 12:
                listed += f" ... ({len(shown)} in all)"
            self.notes.append(
                f"--map {key}: no such key in {self.source}; keys seen: {listed or 'none'}"
            )


class StepMerger:
    """Collects values for each step into one record and emits records in step order.

    A step is emitted when a later step appears (its lines are then complete) or on
    :meth:`flush`. In an ordered log (text, tables, ``log_history``) a step at or below
    the last one means the run was restarted from a checkpoint and logged those steps
    again: the held steps are emitted, and the repeated steps start a new attempt
    (:class:`AttemptTracker`), so both the rolled-back steps and their replay are kept in
    file order. Values that belong to a step already printed (Megatron's validation and
    memory lines) are put with ``annex=True`` and never start an attempt. TensorBoard
    interleaves tags, each from its first step, so there (``ordered=False``) a step at or
    below the last emitted one is dropped with a note, as before.
    """

    def __init__(self, notes: list[str], *, ordered: bool = True) -> None:
        self.notes = notes
        self.ordered = ordered
        self.tracker = AttemptTracker()
        self.counters = CounterReader(notes)
        self._pending: dict[int, StepRecord] = {}
        self._out: list[StepRecord] = []  # emitted by put() when an attempt ended
        self._top: int | None = None
        self._last: int | None = None
        self._replay: list[int] | None = None  # unordered: [first, last] repeated step
        self._settled: int | None = None  # the step :meth:`settle` emitted last
        self._settled_keys: frozenset[str] = frozenset()
        self._stray = 0  # annexed values for a step no longer held
        self._whole: int | None = None  # the step of the last whole line put

    def put(
        self,
        step: int,
        values: dict[str, Any],
        extra: dict[str, Any] | None = None,
        *,
        keep_max: bool = False,
        annex: bool = False,
        whole: bool = False,
    ) -> None:
        """Merge ``values`` into ``step``'s record; a later value replaces an earlier one,
        or, with ``keep_max``, the larger wins (memory reported by several ranks).
        ``annex``: the values belong to a step already printed, never a restart.
        ``whole``: the values are the step's complete line (Megatron's iteration line),
        so a second whole line of a held step is that step logged again: a restart."""
        top = self._top
        fast = (
            top is None or step > top or (step == top and step in self._pending)
            if self.ordered
            else step in self._pending or self._last is None or step > self._last
        )
        if whole:
            if fast and step == self._whole and step in self._pending:
                self._restart()
            self._whole = step
        if not fast and not self._admit(step, values, extra, annex):
            return
        if not self.ordered and fast:
            self._end_replay()
        if self._settled is not None and step > self._settled:
            self._settled = None
        if self._top is None or step > self._top:
            self._top = step
        rec = self._pending.get(step)
        if rec is None:
            rec = self._pending[step] = new_record(step)
        if not keep_max:
            fields = rec.__dict__
            for key, value in values.items():
                if value is not None:
                    fields[key] = value
        else:
            for key, value in values.items():
                if value is None:
                    continue
                old = getattr(rec, key)
                if old is not None and not old < value:
                    continue
                setattr(rec, key, value)
        if extra:
            into = rec.extra
            for key, value in extra.items():
                if key in DICT_EXTRAS and value.__class__ is dict and key in into:
                    into[key] = {**into[key], **value}
                else:
                    into[key] = value

    def _admit(
        self, step: int, values: dict[str, Any], extra: dict[str, Any] | None, annex: bool
    ) -> bool:
        """Whether ``step`` can take values now; starts a new attempt when it repeats."""
        pending, last = self._pending, self._last
        late = step == self._settled and step == last
        if annex:
            if step in pending or last is None or step > last or late:
                return True  # late: a second record of the settled step (see settle())
            self._stray += 1
            return False
        if not self.ordered:
            if late and self._replay is None:
                return True
            self._note_replay(step)
            return False
        keys = {k for k, v in values.items() if v is not None} | set(extra or ())
        if late and not keys & self._settled_keys:
            return True  # more values of the settled step (a second line of it)
        self._restart()
        return True

    def _restart(self) -> None:
        self._out.extend(self._emit(sorted(self._pending)))
        self.tracker.restart()
        self.counters.restart()
        self._top = self._last = self._settled = None
        self._settled_keys = frozenset()

    def ready(self) -> list[StepRecord]:
        """Records complete because a later step exists (or because an attempt ended)."""
        out, self._out = self._out, []
        if len(self._pending) < 2:
            return out
        top = max(self._pending)
        return out + self._emit([s for s in sorted(self._pending) if s < top])

    def flush(self) -> list[StepRecord]:
        self._end_replay()
        if self._stray:
            self.notes.append(
                f"{self._stray} validation or memory line(s) named a step that was not held "
                "any more and were skipped"
            )
            self._stray = 0
        out, self._out = self._out, []
        return out + self._emit(sorted(self._pending))

    def settle(self) -> list[StepRecord]:
        """Emit every held step now, for a follower whose writer has gone quiet (the last
        step's finding must not wait for the next step). Values that still arrive for the
        last emitted step (Megatron prints the validation loss after its iteration line)
        come out later as a second record of that step holding only those values."""
        out = self.flush()
        if out:
            last = out[-1]
            self._settled = last.step
            self._settled_keys = frozenset(last.__dict__) - {"step", "extra", "time"} | frozenset(
                last.extra
            )
        return out

    def _emit(self, steps: list[int]) -> list[StepRecord]:
        out = [self._pending.pop(s) for s in steps]
        if out:
            apply = self.counters.apply
            for rec in out:
                apply(rec)
            self.tracker.emitted(out)
            self._last = out[-1].step
        if not self._pending:
            self._top = self._last
        return out

    def _note_replay(self, step: int) -> None:
        if self._replay is None:
            self._replay = [step, step]
        else:
            self._replay[0] = min(self._replay[0], step)
            self._replay[1] = max(self._replay[1], step)

    def _end_replay(self) -> None:
        if self._replay is not None:
            lo, hi = self._replay
            span = f"step {lo}" if lo == hi else f"steps {lo}–{hi}"
            self.notes.append(
                f"{span} logged again after step {self._top} (a restart from a checkpoint?); "
                "kept the first occurrence"
            )
            self._replay = None


_new = StepRecord.__new__
#: Every StepRecord field but ``step`` and ``extra`` has its default on the class (a
#: dataclass stores plain defaults there), so a record read from a log may hold only the
#: fields the log has in its ``__dict__``; the others read as the class's ``None``.
SPARSE_RECORDS = all(
    f.name in ("step", "extra") or f.name in vars(StepRecord) for f in dataclass_fields(StepRecord)
)


def new_record(step: int) -> StepRecord:
    """``StepRecord(step=step)`` without running the dataclass's ``__init__`` over two
    dozen defaults (it runs once per step read)."""
    if not SPARSE_RECORDS:
        return StepRecord(step=step)
    rec = _new(StepRecord)
    rec.__dict__ = {"step": step, "extra": {}}
    return rec


class LineBuffer:
    """Splits appended text into complete lines, holding a torn last line back.

    A line longer than ``max_chars`` (:data:`sapper.logs.limits.MAX_LINE_CHARS`) is
    dropped, even while it is still being written, so a file without newlines (or a
    100 MB line) holds no more than ``max_chars`` in memory; :attr:`overlong` counts
    them. NUL characters are removed: a crashed node leaves blocks of them in a log,
    and they carry nothing."""

    def __init__(self, max_chars: int | None = None) -> None:
        from sapper.logs.limits import MAX_LINE_CHARS

        self._tail = ""
        self.max_chars = MAX_LINE_CHARS if max_chars is None else max_chars
        #: Lines skipped for being longer than ``max_chars``.
        self.overlong = 0
        self._skipping = False  # inside an overlong line: drop up to its newline

    def push(self, text: str) -> list[str]:
        if "\x00" in text:
            text = text.replace("\x00", "")
        if self._skipping:
            cut = text.find("\n")
            if cut < 0:
                return []
            self._skipping = False
            text = text[cut + 1 :]
        text = self._tail + text
        lines = text.split("\n")
        self._tail = lines.pop()
        limit = self.max_chars
        if len(self._tail) > limit:
            self._tail = ""
            self._skipping = True
            self.overlong += 1
        if len(text) > limit and lines and max(map(len, lines)) > limit:
            self.overlong += sum(len(line) > limit for line in lines)
            lines = [line for line in lines if len(line) <= limit]
        return lines

    def rest(self) -> list[str]:
        """The unterminated last line, if any (end of input)."""
        tail, self._tail = self._tail, ""
        self._skipping = False
        return [tail] if tail.strip() else []

    def note(self) -> str | None:
        """What was skipped, for the reader's notes (None: nothing)."""
        if not self.overlong:
            return None
        return (
            f"skipped {self.overlong} line(s) longer than {self.max_chars:,} characters "
            "(see Limits in docs/analyze.md)"
        )


_NONFINITE = {
    "nan": math.nan,
    "-nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-inf": -math.inf,
    "-infinity": -math.inf,
}


def to_float(value: Any) -> float | None:
    """A number from a log cell: ints, floats, numeric strings, "nan"/"inf" spellings,
    booleans as 0/1; ``None`` for empty cells and anything else (an object, a list, a
    string that is no number). A number beyond the float range is ``±inf``, as
    ``float("1e400")`` is; a digit string too long to be a number is ``None``."""
    cls = value.__class__
    if cls is float:  # the common cells first: a decoded JSON number, a CSV number
        return value
    if cls is str:
        if len(value) > _MAX_NUMBER_CHARS:
            return None
        try:  # float() itself takes surrounding blanks and the nan/inf spellings
            return float(value)
        except ValueError:
            pass
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int past 1.8e308
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > _MAX_NUMBER_CHARS:
            return None
        special = _NONFINITE.get(text.lower())
        if special is not None:
            return special
        try:
            return float(text)
        except ValueError:
            return None
    return None


#: Longest text read as a number: the longest float repr is 24 characters; 1,000 leaves
#: room for any real spelling while a 100 MB digit string costs nothing.
_MAX_NUMBER_CHARS = 1000
_INT_FIELDS = frozenset({"tokens", "samples", "skipped_total"})


def coerce(field_name: str, value: float) -> Any:
    """A float read from a log, in the type the StepRecord field holds: counts become
    ints (``None`` when not finite, negative or past int64). ``skipped`` stays a whole
    number (a flag, a count or a running total: :class:`CounterReader` tells them apart
    when the record is emitted) or becomes a bool when it is not one."""
    if field_name not in _INT_FIELDS and field_name != "skipped":
        return value
    from sapper.logs.limits import to_count

    if field_name == "skipped":
        if not math.isfinite(value):
            return None
        count = to_count(value) if value == int(value) else None
        return count if count is not None else bool(value)
    return to_count(value)


def put_mapped(
    fm: FieldMap, value: float | None, values: dict[str, Any], extra: dict[str, Any]
) -> None:
    """Store a source value where ``fm`` says: a record field (in its unit and type), one
    entry of a dict in ``extra`` (a named eval set, a layer), or nowhere (``ignore``)."""
    if value is None or fm.field in ("ignore", "step"):
        return
    value = value * fm.factor
    if fm.field in DICT_EXTRAS:
        extra.setdefault(fm.field, {})[fm.key] = value
    else:
        values[fm.field] = coerce(fm.field, value)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while records are built or walked: a million
    records are millions of objects with no cycles, and the collector's passes over them
    cost more than the work itself (4× when parsing a million-step log)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
