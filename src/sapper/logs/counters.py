"""Counts that a log may print per record or as a running total, read as what they are.

A skip counter can be printed three ways: a flag per step (``skipped: true``), the count
of the interval since the last line (Megatron-LM's "number of skipped iterations"), or a
running total (DeepSpeed's ``skipped=N``, many hand-written loggers). Read as a flag, a
running total marks every step after the first overflow as skipped: a healthy fp16 run
gets "50 of the last 50 steps were skipped". The reader cannot know the convention in
advance, so each column is judged from its own values, record by record (``sapper
watch`` sees them in chunks):

* a column that never decreases within an attempt is a running total, and its increases
  are the new counts (a total restarts with its attempt, so a reset is never negative);
* a column that falls is a per-record count from then on (a total cannot fall);
* the same non-zero value twice while the loss scale fell is two skips in a row (a
  dynamic loss scaler halves its scale on a skipped step), so per-record counts;
* a column the format documents as per-interval stays so unless a value exceeds the
  steps since the previous record, which only a running total can do;
* a column of booleans, or named as a per-step flag (``overflow``, ``step_skipped``),
  is a flag.

Both readings agree while the column is 0 or after a single increase, so the judgement
only matters, and a note names the column, once the readings part.
"""

from __future__ import annotations

import math
from typing import Any

from sapper.runtime.records import StepRecord

__all__ = ["FLAG_NAMES", "NO_LOSS", "CounterReader"]

#: ``extra`` marker a Megatron iteration line without any loss carries until the record
#: is emitted (see :meth:`CounterReader._nan_loss`); it never reaches a detector.
NO_LOSS = "_no_loss"

#: Normalized column names that only ever mean "this step was skipped".
FLAG_NAMES = frozenset({"skipped_step", "step_skipped", "overflow", "is_overflow"})

AUTO = "auto"
INTERVAL = "interval"
TOTAL = "total"
FLAG = "flag"


class _Column:
    __slots__ = ("label", "mode", "prev", "prev_scale", "prev_step", "total")

    def __init__(self, label: str, mode: str) -> None:
        self.label = label
        self.mode = mode
        self.prev: int | None = None
        self.prev_step: int | None = None
        self.prev_scale: float | None = None
        #: New counts summed over the attempt (delivered as ``skipped_total``).
        self.total = 0


class CounterReader:
    """Judges the count columns of one log and rewrites each emitted record with the
    new count it holds (see the module docstring); :meth:`restart` at each attempt."""

    def __init__(self, notes: list[str]) -> None:
        self.notes = notes
        self._skipped = _Column("skipped", AUTO)
        #: ``tokens`` / ``samples`` columns of a table or TensorBoard run, which may be the
        #: amount consumed so far rather than per step (see :meth:`_judge_work`).
        self._work: dict[str, _Column] = {}
        #: Megatron's "number of nan iterations", read from ``extra``; off by default.
        self._nan: _Column | None = None
        self._nan_noted = False

    def configure_skipped(self, label: str, mode: str = AUTO) -> None:
        """Name the column the ``skipped`` field came from and how to read it at first:
        ``auto`` (running total while it never decreases), ``interval`` (per-interval
        count unless a value cannot be one) or ``flag``."""
        self._skipped.label = label
        self._skipped.mode = mode

    def configure_nan(self, label: str) -> None:
        """Read ``extra["nan_iterations"]`` (a per-interval count by default) too; a new
        NaN iteration makes a missing loss NaN (Megatron drops a NaN average)."""
        self._nan = _Column(label, INTERVAL)

    def configure_work(self, field: str, label: str) -> None:
        """Judge the ``tokens`` or ``samples`` field, read from column ``label``."""
        self._work[field] = _Column(label, AUTO)

    def restart(self) -> None:
        """A new attempt: totals start again from the attempt's first value."""
        for col in (self._skipped, self._nan, *self._work.values()):
            if col is not None:
                col.prev = col.prev_step = col.prev_scale = None
                col.total = 0

    def apply(self, rec: StepRecord) -> None:
        """Rewrite ``rec`` in place (called once per record, in file order)."""
        fields = rec.__dict__
        raw = fields.get("skipped")
        span = None
        if raw is not None and raw.__class__ is not bool:
            prev_step = self._skipped.prev_step
            span = rec.step - prev_step if prev_step is not None else None
            self._apply_skipped(rec, fields, raw)
        if self._work:
            for name, col in self._work.items():
                value = fields.get(name)
                if value is not None:
                    self._apply_work(rec, fields, name, col, value)
        nan = self._nan
        if nan is not None:
            extra = rec.extra
            value = extra.get("nan_iterations")
            new = None
            if value is not None:
                new = self._judge(nan, value, rec.step)
                extra["nan_iterations"] = new if new is not None else 0
            no_loss = extra.pop(NO_LOSS, False)
            if fields.get("loss") is None and (new or no_loss):
                skipped = extra.get("skipped_in_interval") or 0
                covered = skipped >= span if span else skipped > 0
                if new or not covered:
                    self._nan_loss(fields, rec.step, new, skipped)

    def _nan_loss(self, fields: dict[str, Any], step: int, nan: int | None, skipped: int) -> None:
        """Megatron prints an interval's loss average only when it is above (or at) 0, so
        a NaN average leaves the loss out of the line; all iterations skipped do too. A
        line without a loss whose skipped iterations do not cover its interval is a NaN
        loss, even when the NaN counter reads 0 (it does under DeepSpeed, and where the
        NaN check runs only with a grad scaler)."""
        fields["loss"] = math.nan
        if not nan and not self._nan_noted:
            self._nan_noted = True
            self.notes.append(
                f"step {step}: the iteration line has no loss while {skipped} skipped "
                "iteration(s) do not cover its interval: read as a NaN loss (Megatron drops "
                "a NaN average from the line, and its NaN counter read 0)"
            )

    def _apply_work(
        self, rec: StepRecord, fields: dict[str, Any], name: str, col: _Column, value: int
    ) -> None:
        """A ``tokens``/``samples`` column that counts the work done so far becomes the
        work per step: its increase over the steps since the previous record (the total
        itself is kept in ``extra``). It is read as a total once it grew on two records in
        a row to at least one token or sample per step of the run; a value that does not
        grow (a constant batch) makes it a per-step column for good."""
        prev, prev_step = col.prev, col.prev_step
        col.prev, col.prev_step = value, rec.step
        if col.mode == INTERVAL or prev is None or prev_step is None:
            if col.mode == TOTAL:  # an attempt's first total: a baseline
                rec.extra[f"{name}_total"] = value
                del fields[name]
            return
        span = rec.step - prev_step
        if value <= prev or span <= 0:
            if col.mode == TOTAL:
                self.notes.append(
                    f"column {col.label!r} stopped growing at step {rec.step}: read as the "
                    f"{name} of each step from there on"
                )
            col.mode = INTERVAL
            return
        if col.mode == AUTO:
            col.total += 1  # increases in a row
            if col.total < 2 or value < rec.step:
                return
            col.mode = TOTAL
            self.notes.append(
                f"column {col.label!r} grows with the step ({value:,} at step {rec.step:,}): "
                f"read as the {name} consumed so far; each record's {name} per step is its "
                "increase"
            )
        rec.extra[f"{name}_total"] = value
        fields[name] = (value - prev) // span

    def _apply_skipped(self, rec: StepRecord, fields: dict[str, Any], raw: Any) -> None:
        col = self._skipped
        if col.mode == FLAG:
            fields["skipped"] = bool(raw)
            return
        new = self._judge(col, raw, rec.step, fields.get("loss_scale"))
        if new is None:  # the first value of a running total: a baseline, no count yet
            del fields["skipped"]
        else:
            fields["skipped"] = new > 0
            rec.extra["skipped_in_interval"] = new
            col.total += new
        if "skipped_total" not in fields:
            fields["skipped_total"] = col.total

    def _judge(
        self, col: _Column, raw: Any, step: int, scale: float | None = None
    ) -> int | None:
        """The new count ``raw`` stands for; ``None`` for a running total's baseline."""
        try:
            value = int(raw)
        except (TypeError, ValueError, OverflowError):
            return None
        if value != raw or value < 0:  # not a count: a flag (or a mean) after all
            col.mode = FLAG
            return 1 if raw else 0
        prev, prev_step, prev_scale = col.prev, col.prev_step, col.prev_scale
        col.prev, col.prev_step, col.prev_scale = value, step, scale
        if prev is None:
            return None if col.mode == TOTAL and value > 0 else value
        if col.mode == AUTO and value == prev > 0 and _fell(prev_scale, scale):
            # The same count again while the loss scale fell: a dynamic scaler halves its
            # scale on skipped steps, so these are per-record counts (two skips in a row),
            # not a total that stood still.
            col.mode = INTERVAL
            return value
        if value < prev:  # a running total cannot fall
            if col.mode != INTERVAL:
                col.mode = INTERVAL
                self.notes.append(
                    f"column {col.label!r} fell from {prev} to {value} at step {step}: read "
                    "as a count per record, not a running total"
                )
            return value
        if col.mode == INTERVAL:
            span = step - prev_step if prev_step is not None else 0
            if value > prev and span > 0 and value > span:
                col.mode = TOTAL
                self.notes.append(
                    f"column {col.label!r} reached {value} at step {step}, more than the "
                    f"{span} step(s) since the previous record: read as a running total"
                )
                return value - prev
            return value
        if col.mode == AUTO and prev > 0:
            col.mode = TOTAL
            self.notes.append(
                f"column {col.label!r} never decreases: read as a running total (each "
                "record's new count is its increase)"
            )
        return value - prev


def _fell(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and after < before
