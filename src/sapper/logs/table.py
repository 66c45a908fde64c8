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

from sapper.errors import InputError
from sapper.logs.base import LogData, LogParser, coerce, put_mapped, to_float
from sapper.logs.counters import FLAG_NAMES
from sapper.logs.fields import LAYER_KEYS, STEP_NAMES, FieldMap, normalize_name, resolve
from sapper.runtime.records import StepRecord

__all__ = ["TableParser", "read_table"]

_WANDB_RUN = re.compile(r"^(?P<run>.+?) - (?P<metric>.+)$")
_BAND = ("__MIN", "__MAX")
_STEP_KEYS = {normalize_name(n): i for i, n in enumerate(STEP_NAMES)}


class _Columns:
    """How each source column maps to a record field, decided once per column name."""

    def __init__(self, parser: LogParser) -> None:
        self.parser = parser
        self.notes = parser.notes
        self.targets: dict[str, FieldMap | None] = {}
        self.step_column: str | None = None
        self.runs: list[str] = []
        self._taken: dict[tuple[str, str], str] = {}

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
            what = f"{fm.field} {fm.key!r}" if fm.key else fm.field
            self.notes.append(
                f"columns {owner!r} and {name!r} both mean {what}; read {owner!r} "
                f"(use --map {name!r}={fm.field} to choose the other)"
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
        for name, count in self._bad_values.items():
            self.notes.append(f"column {name!r}: {count} value(s) were not numbers and skipped")
        if len(self.columns.runs) > 1:
            others = ", ".join(repr(r) for r in self.columns.runs[1:])
            self.notes.append(
                f"the table holds {len(self.columns.runs)} runs; read {self.columns.runs[0]!r}, "
                f"not {others}"
            )
        if self.columns.step_column is None and self._row:
            self.notes.append("no step column (step, iteration, _step ...): rows numbered from 1")
        return super().finish()

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
            _, first = pending.pop(0)
            if self.delimiter is None:
                self.delimiter = "\t" if first.count("\t") > first.count(",") else ","
            self._header = [h.strip() for h in next(csv.reader([first], delimiter=self.delimiter))]
            self.columns.resolve(self._header)
            self.meta["columns"] = list(self._header)
        width = len(self._header)
        numbers = [n for n, _ in pending]
        rows = csv.reader([t for _, t in pending], delimiter=self.delimiter)
        for number, row in zip(numbers, rows, strict=False):
            if len(row) > width or len(row) < 2 <= width:
                self._bad.append(number)
                continue
            self._put(dict(zip(self._header, row, strict=False)))

    # ---- JSON lines -----------------------------------------------------------------
    def _feed_jsonl(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._line += 1
            text = line.strip()
            if not text:
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
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
    def _put(self, row: dict[str, Any]) -> None:
        self._row += 1
        cols = self.columns
        if cols.step_column is not None:
            step_value = to_float(row.get(cols.step_column))
            if step_value is None or step_value != step_value:
                return  # a row of another metric group (W&B logs them on their own rows)
            step = int(step_value)
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
                if value is not None and not name.endswith(_BAND):
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
            else:
                values[target.field] = coerce(target.field, value * target.factor)
        if values or extra:
            self.merger.put(step, values, extra)


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


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def read_table(path: str | Path, mapping: dict[str, FieldMap] | None = None) -> LogData:
    """Read a CSV or JSON-lines table (the kind follows the file's content)."""
    from sapper.logs.source import read_log

    return read_log(path, mapping=mapping)
