"""A log held as columns: one numpy array per StepRecord field, plus the few records
that carry more than numbers.

``sapper analyze`` on a million-step log spends its time in Python objects: one
StepRecord per step, one ``update`` call per detector per record. Held as columns, the
detectors that have a vectorised twin (``sapper.logs.columnar.twins``) read whole arrays,
and the others are fed records built only for the rows that hold what they read.
:class:`LazyRecords` keeps ``LogData.records`` a sequence of StepRecords for everything
else (the report, ``--merge``), building each record when it is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, overload

import numpy as np

from sapper.logs.base import LogData, new_record
from sapper.runtime.records import StepRecord

__all__ = [
    "BOOL_FIELDS",
    "FLOAT_FIELDS",
    "INT_FIELDS",
    "ColumnarLog",
    "Columns",
    "LazyRecords",
    "RowRecords",
    "columns_from_records",
    "strictly_ascending",
]

#: StepRecord fields that hold one number, by the type the streaming readers give them.
INT_FIELDS: tuple[str, ...] = ("tokens", "samples", "skipped_total")
BOOL_FIELDS: tuple[str, ...] = ("skipped",)
FLOAT_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in fields(StepRecord)
    if f.name not in ("step", "extra", "lrs", *INT_FIELDS, *BOOL_FIELDS)
)
_SCALARS = (*FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS)


@dataclass
class Columns:
    """The rows of one log: ``steps`` and, per field present anywhere, its values
    (float64, NaN where a row lacks it) and where it is present (a logged NaN is
    present, a missing value is not)."""

    steps: np.ndarray
    values: dict[str, np.ndarray] = field(default_factory=dict)
    present: dict[str, np.ndarray] = field(default_factory=dict)
    #: Rows whose whole record is known (extras, per-group LRs): row index -> record.
    full: dict[int, StepRecord] = field(default_factory=dict)
    #: Every row's record, when the columns were built from records (exact replays).
    source: Sequence[StepRecord] | None = None
    #: ``StepRecord.extra`` numbers that no detector reads (Megatron's consumed samples,
    #: its per-interval counts): name -> values (NaN where absent) and where present.
    #: They are part of every record built here, never of the partial records a
    #: detector is fed, so a row holding only these is not a row "with extras".
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    extras_present: dict[str, np.ndarray] = field(default_factory=dict)
    #: The names in ``extras`` whose values are ints.
    int_extras: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.steps)

    def has(self, name: str) -> np.ndarray:
        """Where ``name`` is present (all False for a field the log never has)."""
        mask = self.present.get(name)
        return mask if mask is not None else np.zeros(len(self.steps), dtype=bool)

    def get(self, name: str) -> np.ndarray:
        """``name``'s values, NaN where absent."""
        vals = self.values.get(name)
        return vals if vals is not None else np.full(len(self.steps), np.nan)

    def slice(self, start: int, stop: int) -> Columns:
        """Rows ``start:stop`` (one attempt of a restarted run)."""
        return Columns(
            steps=self.steps[start:stop],
            values={k: v[start:stop] for k, v in self.values.items()},
            present={k: v[start:stop] for k, v in self.present.items()},
            full={i - start: r for i, r in self.full.items() if start <= i < stop},
            source=None if self.source is None else self.source[start:stop],
            extras={k: v[start:stop] for k, v in self.extras.items()},
            extras_present={k: v[start:stop] for k, v in self.extras_present.items()},
            int_extras=self.int_extras,
        )

    def take(self, rows: np.ndarray) -> Columns:
        """The rows ``rows`` (distinct row numbers), in that order: an attempt after the
        history it resumes from."""
        rows = np.asarray(rows, dtype=np.int64)
        full: dict[int, StepRecord] = {}
        if self.full and len(rows):
            order = np.argsort(rows, kind="stable")
            ranked = rows[order]
            for row, rec in self.full.items():
                at = int(np.searchsorted(ranked, row))
                if at < len(ranked) and ranked[at] == row:
                    full[int(order[at])] = rec
        source = self.source
        return Columns(
            steps=self.steps[rows],
            values={k: v[rows] for k, v in self.values.items()},
            present={k: v[rows] for k, v in self.present.items()},
            full=dict(sorted(full.items())),
            source=None if source is None else [source[i] for i in rows.tolist()],
            extras={k: v[rows] for k, v in self.extras.items()},
            extras_present={k: v[rows] for k, v in self.extras_present.items()},
            int_extras=self.int_extras,
        )

    def record(self, row: int) -> StepRecord:
        """Row ``row`` as the StepRecord a streaming reader gives."""
        if self.source is not None:
            return self.source[row]
        rec = self.full.get(row)
        if rec is not None:
            return rec
        rec = self.partial(row, _SCALARS)
        if self.extras:
            extra = rec.extra
            ints = self.int_extras
            for name, mask in self.extras_present.items():
                if mask[row]:
                    value = float(self.extras[name][row])
                    extra[name] = int(value) if name in ints else value
        return rec

    def partial(self, row: int, names: Sequence[str]) -> StepRecord:
        """A record of row ``row`` with only ``names`` (and the row's extras, if any, but
        not the ``extras`` columns no detector reads): what a detector that reads only
        those fields needs."""
        full = self.full.get(row) if self.source is None else self.source[row]
        if full is not None:
            return full
        rec = new_record(int(self.steps[row]))
        d = rec.__dict__
        for name in names:
            mask = self.present.get(name)
            if mask is None or not mask[row]:
                continue
            value = float(self.values[name][row])
            if name in INT_FIELDS:
                d[name] = int(value) if value == value and abs(value) != np.inf else None
            elif name in BOOL_FIELDS:
                d[name] = bool(value) if value == value else None
            else:
                d[name] = value
        return rec


class LazyRecords(Sequence[StepRecord]):
    """``LogData.records`` over :class:`Columns`: records built when asked for."""

    def __init__(self, columns: Columns) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns)

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[StepRecord]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self.columns.record(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self.columns.record(index)

    def __iter__(self) -> Iterator[StepRecord]:
        record = self.columns.record
        for i in range(len(self)):
            yield record(i)


class RowRecords(Sequence[StepRecord]):
    """Some rows of :class:`Columns` as records, built when asked for: the history a
    resumed attempt starts from, which the columnar detectors take as rows."""

    def __init__(self, columns: Columns, rows: np.ndarray) -> None:
        self.columns = columns
        self.rows = np.asarray(rows, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[StepRecord]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self.columns.record(int(i)) for i in self.rows[index]]
        return self.columns.record(int(self.rows[index]))

    def __iter__(self) -> Iterator[StepRecord]:
        record = self.columns.record
        for i in self.rows.tolist():
            yield record(i)


@dataclass
class ColumnarLog(LogData):
    """A LogData read into columns; ``records`` is a :class:`LazyRecords` over them."""

    columns: Columns | None = None

    @property
    def first_step(self) -> int | None:
        return (
            int(self.columns.steps[0]) if self.columns is not None and len(self.columns) else None
        )

    @property
    def last_step(self) -> int | None:
        return (
            int(self.columns.steps[-1]) if self.columns is not None and len(self.columns) else None
        )


def _number(value: Any) -> float:
    """A field value (int, float or bool) as a float64."""
    return value if value.__class__ is float else float(value)


def strictly_ascending(steps: np.ndarray) -> bool:
    """Steps that only go up: one attempt, which is all the columnar path takes."""
    return len(steps) < 2 or bool(np.all(steps[1:] > steps[:-1]))


#: ``StepRecord.extra`` keys that a detector, a twin or the diagnosis reads (the test
#: ``test_extras_read_are_listed`` scans their sources for the keys they look up), and
#: the prefixes of key families read as a whole. A row whose extras hold none of them
#: (a reader's own numbers: an epoch, perplexity, tokens per GPU) is no row "with
#: extras": the detectors that read extras have nothing to read there.
READ_EXTRAS = frozenset({
    "activation_std", "autocast_dtype", "clip_before_unscale", "clip_coef", "compute_dtype",
    "cpu_wait_s", "epoch", "eval_losses", "grad_accum", "grad_norm_layers", "grad_sampled",
    "grad_zero_share", "huge_grads", "huge_params", "loss_normalised", "loss_weight",
    "loss_weight_from", "max_position", "micro_tokens", "model_params",
    "model_params_with_grad", "nonfinite_first_step", "nonfinite_grad_module",
    "nonfinite_grads", "nonfinite_module", "nonfinite_module_input_finite",
    "nonfinite_params", "norm_placement", "num_blocks", "opt_model_params", "opt_params",
    "opt_params_with_grad", "opt_trainable_params", "param_dtype", "position_kind",
    "position_limit", "position_reuse", "position_rope_factor", "position_seq_len",
    "position_site", "position_source", "position_trained", "sample_hashes",
    "scaled_grads_step", "scaler_checked", "scheduler_steps", "trainable_params",
    "zero_grad_params",
})
READ_EXTRA_PREFIXES = ("nonfinite_", "huge_", "position_", "opt_", "grad_", "loss_weight")
#: Ints past this are not kept exactly in a float64 column.
_EXACT_INT = 2**53


def _unread(name: str, value: Any, epoch_read: bool) -> bool:
    """Whether an extra is a number no detector reads (``epoch`` is read only beside
    per-sample hashes: it restarts the duplicate-data window)."""
    if value.__class__ is not float and value.__class__ is not int:
        return False
    if name == "epoch":
        return not epoch_read
    return name not in READ_EXTRAS and not name.startswith(READ_EXTRA_PREFIXES)


def columns_from_records(records: Sequence[StepRecord]) -> Columns | None:
    """Columns over records another reader built (Megatron, TensorBoard, a log with
    restarts): the replays feed the original records, so nothing is lost. ``None`` when
    a field holds something other than a number (a hand-edited log): only the streaming
    detectors know what they make of that. Extras that no detector reads (numbers of the
    reader's own: an epoch, a perplexity) become ``extras`` columns, so their rows are
    not rows with extras."""
    n = len(records)
    steps = np.fromiter((r.step for r in records), dtype=np.int64, count=n)
    cols = Columns(steps=steps, source=records)
    dicts = [r.__dict__ for r in records]
    for name in _SCALARS:
        raw = [d.get(name) for d in dicts]
        if all(v is None for v in raw):
            continue
        ok = [
            v is not None and (v.__class__ in (float, int, bool) or isinstance(v, (int, float)))
            for v in raw
        ]
        if not all(k or v is None for v, k in zip(raw, ok, strict=True)):
            return None
        cols.present[name] = np.fromiter(ok, dtype=bool, count=n)
        cols.values[name] = np.fromiter(
            (_number(v) if k else np.nan for v, k in zip(raw, ok, strict=True)),
            dtype=np.float64,
            count=n,
        )
    with_extra = [i for i, d in enumerate(dicts) if d.get("extra")]
    epoch_read = any("sample_hashes" in dicts[i]["extra"] for i in with_extra)
    kinds: dict[str, type] = {}  # name -> int or float, where every value is one
    mixed: set[str] = set()
    for i in with_extra:
        for name, value in dicts[i]["extra"].items():
            if not _unread(name, value, epoch_read) or (
                value.__class__ is int and abs(value) >= _EXACT_INT
            ):
                mixed.add(name)
            elif kinds.setdefault(name, value.__class__) is not value.__class__:
                mixed.add(name)
    kept = {name: i for i, name in enumerate(k for k in kinds if k not in mixed)}
    if kept:
        table = np.full((len(kept), n), np.nan)
        has = np.zeros((len(kept), n), dtype=bool)
    for i, d in enumerate(dicts):
        extra = d.get("extra")
        if d.get("lrs") is not None or (extra and not all(k in kept for k in extra)):
            cols.full[i] = records[i]
        elif extra:
            for name, value in extra.items():
                table[kept[name], i] = value
                has[kept[name], i] = True
    for name, row in kept.items():
        cols.extras[name] = table[row]
        cols.extras_present[name] = has[row]
    cols.int_extras = frozenset(k for k in kept if kinds[k] is int)
    return cols
