"""Tables of metrics: CSV exported from W&B (or any dashboard) and JSON lines.

Column names are mapped to :class:`StepRecord` fields through :mod:`sapper.logs.fields`
(``train/loss``, ``lm loss``, ``grad-norm``, ``learning_rate``, ``loss_scale``,
``tokens_per_sec`` ...); ``--map col=field`` (:func:`fields.parse_mapping`) names the
rest or overrides a guess. The step comes from the first of ``global_step``, ``step``,
``iteration``, ``_step`` ... that exists. A W&B panel export (``Step, run - train/loss,
run - train/loss__MIN, run - train/loss__MAX``) has its run prefix removed and its
min/max band columns ignored; when it holds several runs the first is read and a note
names the others. Empty cells are missing values (logs are sparse); rows and lines that
cannot be read are counted in a note and skipped.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip, quote
from sapper.logs.base import LogParser, coerce, put_mapped, to_float
from sapper.logs.counters import FLAG_NAMES
from sapper.logs.fields import (
    LAYER_KEYS,
    STEP_NAMES,
    FieldMap,
    describe,
    memory_unit,
    nearest_field,
    normalize_name,
    resolve,
)
from sapper.logs.formats import LogFormat, first_line, first_object
from sapper.logs.limits import MAX_NESTING, json_int, nested_too_deep, to_count
from sapper.runtime.records import StepRecord

__all__ = ["CSV_FORMAT", "FORMATS", "JSONL_FORMAT", "TableParser", "looks_delimited"]

_WANDB_RUN = re.compile(r"^(?P<run>.+?) - (?P<metric>.+)$")
_BAND = ("__MIN", "__MAX")
_STEP_KEYS = {normalize_name(n): i for i, n in enumerate(STEP_NAMES)}
#: Columns named in notes about bad values; a wide hostile table gets one line for the rest.
_MAX_COLUMN_NOTES = 10
#: Unmapped columns kept per table (per-layer metrics of a large model are a few hundred).
MAX_EXTRA_COLUMNS = 2000


class _Columns:
    """How each source column maps to a record field, decided once per column name."""

    def __init__(self, parser: LogParser) -> None:
        self.parser = parser
        self.notes = parser.notes
        self.targets: dict[str, FieldMap | None] = {}
        self.step_column: str | None = None
        self.runs: list[str] = []
        self._taken: dict[tuple[str, str], str] = {}
        self._clashes = 0

    def resolve(self, names: list[str]) -> None:
        """Decide the step column and each column's field: the first run, and of two
        columns meaning the same field the plainer name (``train/loss`` over
        ``train/train_loss``), then the first."""
        if self.parser.mapping:
            self.parser.keys_seen.update(names)
        for name in sorted(names, key=self._rank):
            if name in self.targets:
                continue
            self.targets[name] = self._target(name)
        if self.step_column is None:
            mapped = self.parser.mapped
            user = [n for n in names if (mapped(n) or FieldMap("")).field == "step"]
            ranked = sorted(
                (n for n in names if _STEP_KEYS.get(normalize_name(n)) is not None),
                key=lambda n: _STEP_KEYS[normalize_name(n)],
            )
            choice = (user or ranked or [None])[0]
            if choice is not None:
                self.step_column = choice
                self.targets[choice] = None

    def _rank(self, name: str) -> int:
        if self.parser.mapped(name) is not None:
            return -1
        match = _WANDB_RUN.match(name)
        fm = resolve(match["metric"] if match else name) or resolve(name)
        return fm.rank if fm is not None else 1 << 30

    def _target(self, name: str) -> FieldMap | None:
        fm = self.parser.mapped(name)
        if fm is not None:
            return None if fm.field in ("ignore", "step") else self._claim(fm, name)
        if name.endswith(_BAND):
            return None
        metric = name
        match = _WANDB_RUN.match(name)
        if match and resolve(match["metric"]) is not None:
            run, metric = match["run"], match["metric"]
            if run not in self.runs:
                self.runs.append(run)
            if run != self.runs[0]:
                return None
        fm = resolve(metric)
        claimed = None if fm is None else self._claim(fm, name)
        counters = self.parser.merger.counters
        if claimed is not None and claimed.field == "skipped":
            flag = normalize_name(metric) in FLAG_NAMES
            counters.configure_skipped(name, "flag" if flag else "auto")
        elif claimed is not None and claimed.field in ("tokens", "samples"):
            counters.configure_work(claimed.field, name)
        return claimed

    def _claim(self, fm: FieldMap, name: str) -> FieldMap | None:
        owner = self._taken.get((fm.field, fm.key))
        if owner is not None and owner != name:
            self._clashes += 1
            if self._clashes <= _MAX_COLUMN_NOTES:
                what = f"{fm.field} {quote(fm.key)}" if fm.key else fm.field
                self.notes.append(
                    f"columns {quote(owner)} and {quote(name)} both mean {what}; read "
                    f"{quote(owner)} (use --map {quote(name)}={fm.field} to choose the other)"
                )
            return None
        self._taken[(fm.field, fm.key)] = name
        return fm


class TableParser(LogParser):
    """Incremental parser of CSV (``kind="csv"``) or JSON-lines (``kind="jsonl"``) tables."""

    format = "table"

    def __init__(
        self,
        kind: str = "csv",
        mapping: dict[str, FieldMap] | None = None,
        delimiter: str | None = None,
        source: str = "<input>",
    ) -> None:
        super().__init__(source, mapping)
        self.kind = kind
        self.format = kind
        self.columns = _Columns(self)
        self.delimiter = delimiter
        self._header: list[str] | None = None
        self._line = 0
        self._row = 0
        self._bad: list[int] = []
        self._bad_values: dict[str, int] = {}
        self._unknown_keys: set[str] = set()
        self._bad_steps = 0
        self._extra_names: dict[str, bool] = {}
        self._extra_dropped = 0
        #: Per memory column named without its unit, the factor its values showed it
        #: needs (``max_memory_allocated`` in bytes), decided on its first value.
        self._units: dict[str, FieldMap] = {}

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        if self.kind == "jsonl":
            self._feed_jsonl(lines)
        else:
            self._feed_csv(lines)
        return self.merger.ready()

    def finish(self) -> list[StepRecord]:
        if self._header is None and self.kind == "csv":
            raise InputError(
                "no header row", file=self.source, expected="a CSV table with a header"
            )
        if self._bad:
            lines = ", ".join(map(str, self._bad[:5])) + (" ..." if len(self._bad) > 5 else "")
            what = "not JSON objects" if self.kind == "jsonl" else "malformed rows"
            self.notes.append(f"{len(self._bad)} line(s) were {what} and were skipped: {lines}")
        if self._extra_dropped:
            self.notes.append(
                f"{self._extra_dropped} more columns that are no StepRecord field were not "
                f"kept (the first {MAX_EXTRA_COLUMNS} are, in StepRecord.extra)"
            )
        if self._bad_steps:
            self.notes.append(
                f"{self._bad_steps} row(s) had a step that is not an integer in 0 … 2^63-1 "
                "and were skipped"
            )
        for name, count in list(self._bad_values.items())[:_MAX_COLUMN_NOTES]:
            self.notes.append(
                f"column {quote(name)}: {count} value(s) were not numbers in range and skipped"
            )
        if len(self._bad_values) > _MAX_COLUMN_NOTES:
            self.notes.append(
                f"... and {len(self._bad_values) - _MAX_COLUMN_NOTES} more columns with values "
                "that were not numbers"
            )
        if len(self.columns.runs) > 1:
            others = clip(", ".join(quote(r) for r in self.columns.runs[1:6]))
            self.notes.append(
                f"the table holds {len(self.columns.runs)} runs; read "
                f"{quote(self.columns.runs[0])}, not {others}"
            )
        if self.columns.step_column is None and self._row:
            self.notes.append("no step column (step, iteration, _step ...): rows numbered from 1")
        self._mapping_notes()
        return super().finish()

    def _mapping_notes(self) -> None:
        """Say how the columns whose names are not the fields' own were read, and list
        the numeric columns no field took, each with the field it may mean (``--map``)."""
        read = []
        for name, fm in self.columns.targets.items():
            if fm is None or self.mapped(name) is not None:
                continue
            said = describe(name, self._units.get(name, fm))
            if said is not None:
                read.append(said)
        if read:
            shown = ", ".join(read[:_MAX_COLUMN_NOTES])
            more = (f" and {len(read) - _MAX_COLUMN_NOTES} more"
                    if len(read) > _MAX_COLUMN_NOTES else "")
            self.notes.append(f"columns read as: {shown}{more}")
        unknown = []
        for name in self._extra_names:
            if normalize_name(name) in LAYER_KEYS or self.mapped(name) is not None:
                continue
            near = nearest_field(name)
            if near is not None:
                unknown.append(f"{quote(name)} (may be {near})")
        if unknown:
            shown = ", ".join(unknown[:_MAX_COLUMN_NOTES])
            more = (f" and {len(unknown) - _MAX_COLUMN_NOTES} more"
                    if len(unknown) > _MAX_COLUMN_NOTES else "")
            self.notes.append(
                f"numeric columns no field reads, kept as extras: {shown}{more} "
                "(--map COLUMN=FIELD reads one as that field)"
            )

    # ---- CSV ------------------------------------------------------------------------
    def _feed_csv(self, lines: Iterable[str]) -> None:
        pending = []
        for line in lines:
            self._line += 1
            if not line.strip():
                continue
            pending.append((self._line, line.rstrip("\r\n")))
        if not pending:
            return
        if self._header is None:
            number, first = pending.pop(0)
            if self.delimiter is None:
                self.delimiter = "\t" if first.count("\t") > first.count(",") else ","
            self._header = self._header_row(number, first)
            self.columns.resolve(self._header)
            self.meta["columns"] = list(self._header)
        width = len(self._header)
        for number, row in self._rows(pending):
            if row is None or len(row) > width or len(row) < 2 <= width:
                self._bad.append(number)
                continue
            self._put(dict(zip(self._header, row, strict=False)))

    def _header_row(self, number: int, text: str) -> list[str]:
        cursor = _Cursor([text, ""])
        try:
            names = next(csv.reader(cursor, delimiter=self.delimiter))
            if cursor.at != 1:
                raise csv.Error("a quoted column name does not close on the line")
            return [h.strip() for h in names]
        except (csv.Error, StopIteration) as exc:  # a lone \r, a name past csv's field limit
            why = str(exc) or "no columns"
            if "new-line character" in why:
                why = "a carriage return (\\r) inside the line, not at its end"
            raise InputError(
                f"the header row cannot be read as CSV ({why})",
                file=self.source,
                field=f"line {number}",
                value=text,
                expected="a first line of column names separated by commas or tabs, lines "
                "ending in \\n or \\r\\n",
            ) from None

    def _rows(self, pending: list[tuple[int, str]]) -> Iterable[tuple[int, list[str] | None]]:
        """The parsed rows, each from its own line; ``None`` for one the csv module
        refuses (a stray ``\r`` in an unquoted field, a field past its size limit) or
        that does not end on its line (a quote that never closes would otherwise take the
        lines after it as its text): a bad row costs only itself, and reading goes on at
        the next line."""
        cursor = _Cursor([t for _, t in pending])
        reader = csv.reader(cursor, delimiter=self.delimiter)
        while cursor.at < len(pending):
            start = cursor.at
            row: list[str] | None
            try:
                row = next(reader)
            except (csv.Error, StopIteration):
                row = None
            if row is None or cursor.at != start + 1:
                yield pending[start][0], None
                cursor.at = start + 1
                reader = csv.reader(cursor, delimiter=self.delimiter)  # no state carried
                continue
            yield pending[start][0], row

    # ---- JSON lines -----------------------------------------------------------------
    def _feed_jsonl(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._line += 1
            text = line.strip()
            if not text:
                continue
            try:
                obj = None if nested_too_deep(text) else json.loads(text, parse_int=json_int)
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
                obj = None
            if not isinstance(obj, dict):
                self._bad.append(self._line)
                continue
            flat = _flatten(obj)
            new = [k for k in flat if k not in self.columns.targets]
            if new:
                self.columns.resolve(new)
            self._put(flat)

    # ---- rows -----------------------------------------------------------------------
    def _keep_extra(self, name: str) -> bool:
        """Whether an unmapped column is kept in ``StepRecord.extra``: the first
        MAX_EXTRA_COLUMNS are, so a table of a million columns costs bounded memory per
        row (the others are counted in a note)."""
        keep = self._extra_names.get(name)
        if keep is None:
            keep = self._extra_names[name] = len(self._extra_names) < MAX_EXTRA_COLUMNS
            if not keep:
                self._extra_dropped += 1
        return keep

    def _put(self, row: dict[str, Any]) -> None:
        self._row += 1
        cols = self.columns
        if cols.step_column is not None:
            raw_step = row.get(cols.step_column)
            if raw_step is None or raw_step == "":
                return  # a row of another metric group (W&B logs them on their own rows)
            step_value = to_float(raw_step)
            if step_value is not None and step_value != step_value:
                return  # NaN: as empty (pandas writes a missing value so)
            count = None if step_value is None else to_count(step_value)
            if count is None:
                self._bad_steps += 1
                return
            step = count
        else:
            step = self._row
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, raw in row.items():
            if name == cols.step_column or raw is None or raw == "":
                continue
            target = cols.targets.get(name)
            value = to_float(raw)
            if target is None:
                if value is not None and not name.endswith(_BAND) and self._keep_extra(name):
                    extra[name] = value
                elif raw.__class__ is list and normalize_name(name) in LAYER_KEYS:
                    extra["grad_norm_layers"] = _layer_list(raw)
                continue
            if target.field == "skipped" and _is_flag(raw):
                values["skipped"] = raw if raw.__class__ is bool else raw.strip().lower() == "true"
                continue
            if value is None:
                self._bad_values[name] = self._bad_values.get(name, 0) + 1
                continue
            if target.key:
                put_mapped(target, value, values, extra)
                continue
            target = self._unit_of(name, target, value)
            scaled = coerce(target.field, value * target.factor)
            if scaled is None:
                self._bad_values[name] = self._bad_values.get(name, 0) + 1
                continue
            values[target.field] = scaled
        if values or extra:
            self.merger.put(step, values, extra)


    def _unit_of(self, name: str, target: FieldMap, value: float) -> FieldMap:
        """A memory column's map with the unit its first value betrays (see
        :func:`sapper.logs.fields.memory_unit`); other columns as mapped."""
        known = self._units.get(name)
        if known is not None:
            return known
        if target.field.startswith("memory_") and self.mapped(name) is None:
            guess = memory_unit(target, value)
            known = target if guess is None else FieldMap(target.field, guess[0], target.rank)
            self._units[name] = known
            return known
        return target


class _Cursor:
    """The lines a csv reader reads, one by one, from a position the caller can set back
    (to the line after a bad row)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.at = 0

    def __iter__(self) -> _Cursor:
        return self

    def __next__(self) -> str:
        if self.at >= len(self.lines):
            raise StopIteration
        self.at += 1
        return self.lines[self.at - 1]


def _is_flag(raw: Any) -> bool:
    """A boolean cell (JSON ``true``, CSV ``True``/``false``): a per-step flag."""
    return raw.__class__ is bool or (raw.__class__ is str and raw.strip().lower() in _BOOLS)


_BOOLS = frozenset({"true", "false"})


def _layer_list(values: list[Any]) -> dict[str, float]:
    """A list of per-layer norms, layer ``i`` named ``layers.i``."""
    out = {}
    for i, raw in enumerate(values):
        value = to_float(raw)
        if value is not None:
            out[f"layers.{i}"] = value
    return out


def _flatten(obj: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """Nested objects as ``outer/inner`` keys (W&B's ``{"train": {"loss": ...}}``); the
    depth is bounded by the line's nesting check, and again here."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < MAX_NESTING:
            out.update(_flatten(value, name + "/", depth + 1))
        else:
            out[name] = value
    return out


def looks_delimited(lines: list[str]) -> bool:
    """The first line and at least half of the next 49 hold as many commas (or tabs)."""
    for sep in (",", "\t"):
        width = lines[0].count(sep)
        if width == 0:
            continue
        rows = lines[1:50]
        if rows and sum(r.count(sep) == width for r in rows) >= max(1, len(rows) // 2):
            return True
    return False


def _numeric_share(lines: list[str]) -> float:
    """Of the cells in the rows after the header, the share that are numbers or empty:
    a metrics table is mostly numbers; lines of ``key value, key value`` text that
    happen to hold as many commas each (nanoGPT's ``iter 10: loss 3.22, time 893ms``,
    the Trainer's printed dicts) are not."""
    sep = "\t" if lines[0].count("\t") > lines[0].count(",") else ","
    cells = [c.strip().strip('"') for row in lines[1:50] for c in row.split(sep)]
    if not cells:
        return 0.0
    return sum(not c or to_float(c) is not None for c in cells) / len(cells)


def _head_lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if line.strip():
            out.append(line)
            if len(out) >= 50:
                break
    return out


def _recognise_csv(text: str, path: Path) -> float:
    """A delimited header over rows that are mostly numbers; a ``.csv``/``.tsv`` name
    with a comma on its first line (a table of one row). Ranked above Megatron's line:
    text appended to a table is noted as bad rows."""
    lines = _head_lines(text)
    if not lines or lines[0].lstrip().startswith("{"):
        return 0.0
    csv_name = path.suffix.lower() in (".csv", ".tsv")
    if looks_delimited(lines):
        return 0.9 if csv_name or _numeric_share(lines) >= 0.3 else 0.2
    return 0.5 if csv_name and "," in lines[0] else 0.0


def _recognise_jsonl(text: str, path: Path) -> float:
    """JSON objects, one a line (the run log and trainer_state rank higher); a
    damaged first line of a ``.jsonl`` file with more lines after it (the reader skips
    it with a note)."""
    line = first_line(text)
    if not line.startswith("{"):
        return 0.0
    if first_object(line) is not None:
        return 0.85  # a JSON first line decides, whatever lines follow
    named = path.suffix.lower() in (".jsonl", ".ndjson")
    return 0.5 if named and len(_head_lines(text)) > 1 else 0.0


def _csv_parser(path: Path, mapping: dict[str, FieldMap] | None) -> TableParser:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else None
    return TableParser("csv", mapping, delimiter=delimiter, source=str(path))


CSV_FORMAT = LogFormat(
    name="csv",
    title="a CSV metrics table (e.g. a W&B export)",
    looks_for="a header row, then rows of numbers with as many commas or tabs",
    parser=_csv_parser,
    recognise_text=_recognise_csv,
)
JSONL_FORMAT = LogFormat(
    name="jsonl",
    title="a JSON-lines metrics table",
    looks_for="one JSON object a line with metric keys",
    parser=lambda path, mapping: TableParser("jsonl", mapping, source=str(path)),
    recognise_text=_recognise_jsonl,
)
#: Both table formats (one reader, two layouts).
FORMATS = (CSV_FORMAT, JSONL_FORMAT)
