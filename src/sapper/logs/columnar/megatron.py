"""Megatron-LM text logs read into columns for ``sapper analyze`` on long runs.

The streaming reader (:class:`sapper.logs.megatron.MegatronParser`) spends tens of
microseconds of Python on each iteration line: the segments split one by one, a
StepRecord per step, the merger and the counters record by record. This reader reads
the same bytes the same way (the same 8 MiB reads and decoding; NULs and overlong lines
as :class:`~sapper.logs.base.LineBuffer` treats them, so each batch of lines is the
batch the streaming reader is fed) and, batch by batch:

* one regular expression over the batch's text finds every line that holds
  ``iteration`` and cuts a plain iteration line (its first ``iteration N/ TOTAL |``
  followed by ``key: value |`` segments) into its head, step and segments;
* the segments of all plain lines are split at once (``str.split`` over their joined
  text), each key spelling is looked up once, and the values are converted by ``float``
  in one pass, into columns;
* every other line with ``iteration`` in it (a validation or memory line, an iteration
  line with a word where a number goes, a segment without a colon or with two) goes
  through the streaming parser's own code.

The steps are then merged as :class:`~sapper.logs.base.StepMerger` merges them (an
iteration line whose step does not rise starts a new attempt; a validation or memory
line joins the step it names while that step is held), a run of rising steps at once,
and the skipped and NaN counters are judged as :class:`~sapper.logs.counters.CounterReader`
judges them, over whole attempts. The records, notes, meta and attempts are the
streaming reader's (``tests/logs/test_megatron_columnar.py`` holds it to that); what
this reader does not follow (an encoding other than UTF-8, counts past 2**53) leaves the
file to the streaming reader.
"""

from __future__ import annotations

import codecs
import math
import re
from bisect import bisect_right
from collections.abc import Iterable
from itertools import compress, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from sapper.errors import InputError
from sapper.logs.base import DICT_EXTRAS, Attempt
from sapper.logs.columnar import DEFAULT_MIN_BYTES
from sapper.logs.columnar.frame import (
    BOOL_FIELDS,
    FLOAT_FIELDS,
    INT_FIELDS,
    READ_EXTRA_PREFIXES,
    READ_EXTRAS,
    ColumnarLog,
    Columns,
    LazyRecords,
)
from sapper.logs.counters import NO_LOSS
from sapper.logs.limits import MAX_LOG_BYTES, check_regular, open_log
from sapper.logs.limits import sniff_encoding as _sniff
from sapper.logs.megatron import (
    _AFTER_LOSSES,
    _EXTRA,
    _KEYS,
    _STAMP,
    MegatronParser,
    _unix,
)
from sapper.logs.source import CHUNK_BYTES

__all__ = ["COLUMN_EXTRAS", "MIN_BYTES", "read_megatron_columnar"]

#: Below this size the streaming reader is as fast.
MIN_BYTES = DEFAULT_MIN_BYTES
#: ``extra`` names kept as columns (numbers no detector reads): Megatron's named values,
#: its two counters, and the losses it prints beside the LM loss (``mtp_1_loss``,
#: ``load_balancing_loss``) unless their name starts like what a detector reads.
COLUMN_EXTRAS = frozenset({*_EXTRA.values(), "nan_iterations", "skipped_in_interval"})
#: ``extra`` names whose values are ints.
_INT_EXTRAS = frozenset({"nan_iterations", "skipped_in_interval"})
#: Counts past this are not kept exactly in float64 columns: the streaming reader reads
#: such a log.
_EXACT = 2**53
#: Key spellings remembered; a hostile log with more goes line by line past them.
MAX_SPELLINGS = 4096
_MAX_NUMBER_CHARS = 1000  # as sapper.logs.base.to_float

# A line holding ``iteration``: a plain iteration line (the head before its first
# ``iteration``, which must be one with a step and a total; the rest after the pipe), or
# any other (read by the streaming parser's code).
_LINE = re.compile(
    r"^([^i\n]*(?:i(?!teration)[^i\n]*)*)(?<!\w)(iteration +([0-9]{1,18}) */ *([0-9]{1,18}) *\|)"
    r"([^\n]*)$|^([^\n]*iteration[^\n]*)$",
    re.M,
)
# The first time stamp of each line (sapper.logs.megatron's _STAMP, searched in the head).
_STAMP_BODY = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\]"
_FIRST_STAMP = re.compile(
    rf"^(?:[^\[\n]|\[(?!{_STAMP_BODY}))*"
    r"(?:\[(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,]\d+)?\])?",
    re.M,
)
#: Every byte but the separators a plain line's rest is checked by (``|``, ``:``, newline).
_NOT_SEPS = bytes(b for b in range(256) if b not in b"|:\n")
#: Lines laid out alike in a row read a column at a time from this many.
_MIN_RUN = 4

# What a segment's key does (see MegatronParser._iteration).
_IGNORE, _FIELD, _SAMPLES, _SKIPPED, _NAN, _EXTRA_KEY, _LM_LOSS, _PLAIN_LOSS = range(8)


class _Spec:
    """One key spelling: what it fills, and what it says about a missing loss."""

    __slots__ = ("after", "factor", "kind", "mentions_loss", "name", "target")

    def __init__(self, raw: str) -> None:
        key = raw.strip()
        lower = key.lower()
        self.after = lower in _AFTER_LOSSES
        self.mentions_loss = "loss" in raw.lower().replace("loss scale", "")
        self.factor = 1.0
        self.target: str | None = None
        if lower in _KEYS:
            name, self.factor = _KEYS[lower]
            if name == "loss":
                self.kind = _LM_LOSS if lower == "lm loss" else _PLAIN_LOSS
                self.name = self.target = lower
            else:
                self.kind = _SAMPLES if name == "samples" else _FIELD
                self.name = self.target = name
        elif lower == "number of skipped iterations":
            self.kind, self.name = _SKIPPED, "skipped"
            self.target = self.name
        elif lower == "number of nan iterations":
            self.kind, self.name = _NAN, "nan_iterations"
            self.target = "extra." + self.name
        elif lower in _EXTRA:
            self.kind, self.name = _EXTRA_KEY, _EXTRA[lower]
            self.target = "extra." + self.name
        elif lower.endswith("loss"):
            self.kind, self.name = _EXTRA_KEY, lower.replace(" ", "_")
            self.target = "extra." + self.name
        else:
            self.kind, self.name = _IGNORE, ""


def _column_name(spec: _Spec) -> str:
    """Where a key's values go: a record field, ``extra.<name>``, or one of the two
    losses the line may print."""
    if spec.kind == _LM_LOSS:
        return "_lm"
    if spec.kind == _PLAIN_LOSS:
        return "_plain"
    if spec.kind in (_EXTRA_KEY, _NAN):
        return "extra." + spec.name
    return spec.name


def column_extra(name: str) -> bool:
    """Whether an ``extra`` name is kept as a column (see :data:`COLUMN_EXTRAS`)."""
    if name in COLUMN_EXTRAS:
        return True
    return (
        name.endswith("_loss")
        and name.replace("_", "").isalnum()
        and name.isascii()
        and name not in READ_EXTRAS
        and not name.startswith(READ_EXTRA_PREFIXES)
    )


_BATCH = 4096


class _Slots:
    """A growing int64 array (a slot's regular row, or -1; the steps emitted)."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.starts: list[int] = []
        self.tail: list[int] = []
        self.size = 0

    def _seal(self) -> None:
        if self.tail:
            self.starts.append(self.size - len(self.tail))
            self.parts.append(np.asarray(self.tail, dtype=np.int64))
            self.tail = []

    def add(self, value: int) -> int:
        self.tail.append(value)
        self.size += 1
        return self.size - 1

    def add_many(self, values: list[int]) -> None:
        """Append ints: a few at a time (a log that restarts on every line) are held as
        a list until there are enough for an array."""
        if len(values) >= _BATCH:
            self.extend(np.asarray(values, dtype=np.int64))
            return
        self.tail += values
        self.size += len(values)
        if len(self.tail) >= _BATCH:
            self._seal()

    def extend(self, values: np.ndarray) -> int:
        self._seal()
        self.starts.append(self.size)
        self.parts.append(values)
        self.size += len(values)
        return self.size - len(values)

    def get(self, slot: int) -> int:
        first = self.size - len(self.tail)
        if slot >= first:
            return self.tail[slot - first]
        part = bisect_right(self.starts, slot) - 1
        return int(self.parts[part][slot - self.starts[part]])

    def array(self) -> np.ndarray:
        self._seal()
        return np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.int64)


# A put: ("R", regular row) or ("D", values, extra, keep_max).
Put = tuple[Any, ...]


class _Merger:
    """:class:`~sapper.logs.base.StepMerger` (ordered, never settled) over slots: a slot
    is one step's record while it is held, its values the puts it was given."""

    def __init__(self) -> None:
        self.pending: dict[int, int] = {}  # step -> slot
        self.top: int | None = None
        self.last: int | None = None
        self.whole: int | None = None
        self.stray = 0
        self.slot_reg = _Slots()  # slot -> its only put's regular row, -1 otherwise
        self.puts: dict[int, list[Put]] = {}  # slot -> its puts, where not one regular row
        self.emitted_steps = _Slots()  # steps in the order the records are emitted
        self.emitted_slots = _Slots()
        self.count = 0
        self.restarts: list[int] = []  # records emitted before each restart

    def put(self, step: int, item: Put, *, annex: bool = False, whole: bool = False) -> None:
        pending = self.pending
        top = self.top
        fast = top is None or step > top or (step == top and step in pending)
        if whole:
            if fast and step == self.whole and step in pending:
                self._restart()
            self.whole = step
        if not fast and not self._admit(step, annex):
            return
        if self.top is None or step > self.top:
            self.top = step
        slot = pending.get(step)
        if slot is None:
            if item[0] == "R":
                pending[step] = self.slot_reg.add(item[1])
            else:
                slot = pending[step] = self.slot_reg.add(-1)
                self.puts[slot] = [item]
            return
        puts = self.puts.get(slot)
        if puts is None:
            self.puts[slot] = [("R", self._reg_of(slot)), item]
        else:
            puts.append(item)

    def _reg_of(self, slot: int) -> int:
        return self.slot_reg.get(slot)

    def run(self, steps: np.ndarray, rows: np.ndarray) -> None:
        """Regular rows whose steps rise above every held step: each a new slot."""
        slot0 = self.slot_reg.extend(rows)
        self.pending.update(zip(steps.tolist(), range(slot0, slot0 + len(rows)), strict=True))
        self.top = self.whole = int(steps[-1])

    def _admit(self, step: int, annex: bool) -> bool:
        if annex:
            if step in self.pending or self.last is None or step > self.last:
                return True
            self.stray += 1
            return False
        self._restart()
        return True

    def _restart(self) -> None:
        self._emit(sorted(self.pending))
        self.restarts.append(self.count)
        self.top = self.last = None

    def ready(self) -> None:
        if len(self.pending) < 2:
            return
        steps = sorted(self.pending)
        steps.pop()
        self._emit(steps)

    def flush(self) -> None:
        self._emit(sorted(self.pending))

    def _emit(self, steps: list[int]) -> None:
        if steps:
            slots = list(map(self.pending.pop, steps))
            self.emitted_steps.add_many(steps)
            self.emitted_slots.add_many(slots)
            self.count += len(steps)
            self.last = steps[-1]
        if not self.pending:
            self.top = self.last


class _SlowLines(MegatronParser):
    """The streaming parser's code for the lines that are not plain, its values handed
    to the columnar merger."""

    def __init__(self, source: str, merger: _Merger) -> None:
        super().__init__(source)
        self.into = merger

    def _put(
        self,
        step: int,
        values: dict[str, Any],
        extra: dict[str, Any] | None = None,
        *,
        keep_max: bool = False,
        annex: bool = False,
        whole: bool = False,
    ) -> None:
        self.into.put(step, ("D", values, extra or {}, keep_max), annex=annex, whole=whole)


class _Giveup(Exception):
    """The log holds something the columns cannot keep exactly."""


class _Reader:
    def __init__(self, path: Path) -> None:
        self.merger = _Merger()
        self.slow = _SlowLines(str(path), self.merger)
        self.spec_list: list[_Spec] = []
        self.spec_index: dict[bytes, int] = {}  # spelling -> index in spec_list, -1: not plain
        self.targets: dict[str, int] = {}
        self.regular = 0  # regular rows so far
        self.blocks: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []
        self.block_sizes: list[int] = []
        self.day_start: dict[str, float | None] = {}
        self.bad = 0

    # -- one batch of lines ------------------------------------------------------------

    def feed(self, text: str) -> None:
        rows = _LINE.findall(text) if "iteration" in text else []
        if rows:
            self._events(rows)
        self.merger.ready()

    def _events(self, rows: list[tuple[str, ...]]) -> None:
        heads, mids, steps, totals, rests, others = zip(*rows, strict=True)
        n = len(rows)
        cand = np.fromiter(map(bool, steps), dtype=bool, count=n)
        cand_idx = np.flatnonzero(cand)
        regular = np.zeros(n, dtype=bool)
        step_of = np.zeros(n, dtype=np.int64)
        parsed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if len(cand_idx):
            pick = cand.tolist()
            ok, parsed = self._parse(
                list(compress(heads, pick)),
                list(compress(rests, pick)),
            )
            regular[cand_idx[ok]] = True
            if not ok.all():  # those rows are read line by line: drop them here
                parsed = {k: (v[ok], m[ok]) for k, (v, m) in parsed.items()}
            step_of[cand_idx[ok]] = np.fromiter(
                map(int, compress(steps, regular.tolist())), dtype=np.int64, count=int(ok.sum())
            )
        reg_idx = np.flatnonzero(regular)
        first_reg = self.regular
        self.regular += len(reg_idx)
        self.blocks.append(parsed)
        self.block_sizes.append(len(reg_idx))
        reg_number = np.zeros(n, dtype=np.int64)
        reg_number[reg_idx] = np.arange(first_reg, first_reg + len(reg_idx))
        # Runs of regular rows with rising steps: the first goes through put(), the rest
        # are new slots at once.
        prev_reg = np.zeros(n, dtype=bool)
        prev_reg[1:] = regular[:-1]
        rising = np.zeros(n, dtype=bool)
        rising[1:] = step_of[1:] > step_of[:-1]
        starts = np.flatnonzero(~regular | ~(prev_reg & rising))
        merger, meta = self.merger, self.slow.meta
        ends = [*starts[1:].tolist(), n]
        for at, end in zip(starts.tolist(), ends, strict=True):
            if not regular[at]:
                line = others[at] or heads[at] + mids[at] + rests[at]
                self.slow.feed([line])
                continue
            if "train_iters" not in meta:
                meta["train_iters"] = int(totals[at])
            merger.put(int(step_of[at]), ("R", int(reg_number[at])), whole=True)
            if end > at + 1:
                merger.run(step_of[at + 1 : end], reg_number[at + 1 : end])

    def _parse(
        self, heads: list[str], rests: list[str]
    ) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """The plain lines among iteration lines (``ok``) and their values, per name:
        (values, present) over all of them (rows not ``ok`` hold nothing).

        A plain line's rest is ``key: value |`` parts, one colon each, then a blank part
        (or a last part with its colon and no pipe). The rests are joined with ``||``
        and split at every pipe and colon: each line gives ``key, value`` tokens, its
        blank part, and an empty token. Lines laid out alike in a row (the same number
        of parts) give their key and value tokens at a fixed stride: each key is checked
        for a whole run with one ``list.count``, each value column converted at once.
        Other lines are read token by token."""
        n = len(rests)
        ok = np.ones(n, dtype=bool)
        lengths = np.fromiter(map(len, rests), dtype=np.int64, count=n)
        # The separators of each line, in order: a plain line alternates ":|" from a colon.
        seps = "\n".join(rests).encode().translate(None, _NOT_SEPS)
        a = np.frombuffer(seps, dtype=np.uint8)
        ends = np.flatnonzero(a == 10)
        if len(ends) != n - 1:
            raise _Giveup
        count = np.diff(np.concatenate([[-1], ends, [len(a)]])) - 1  # separators per line
        if b"||" in seps or b"::" in seps or seps.startswith(b"|") or b"\n|" in seps:
            for i, line_seps in enumerate(seps.split(b"\n")):
                if b"||" in line_seps or b"::" in line_seps or line_seps.startswith(b"|"):
                    ok[i] = False
        flat = "||".join(rests).replace(":", "|").encode().split(b"|")
        stride = count + 2  # tokens per line: its parts' tokens, and the joiner's empty one
        if len(flat) != int(stride.sum()) - 1:
            raise _Giveup
        offset = np.zeros(n, dtype=np.int64)
        np.cumsum(stride[:-1], out=offset[1:])
        cols = _Cols(n)
        no_loss = np.zeros(n, dtype=bool)
        bad = np.zeros(n, dtype=np.int64)
        rest_lines = np.ones(n, dtype=bool)  # not read by a run
        # Runs of plain-looking lines with the same even number of separators.
        even = ok & (count % 2 == 0) & (lengths <= _MAX_NUMBER_CHARS)
        change = np.flatnonzero(
            np.concatenate([[True], (count[1:] != count[:-1]) | (even[1:] != even[:-1])])
        )
        for lo, hi in zip(change.tolist(), [*change[1:].tolist(), n], strict=True):
            if hi - lo >= _MIN_RUN and even[lo]:
                if self._run(flat, lo, hi, int(offset[lo]), int(count[lo]), cols, no_loss, bad, ok):
                    rest_lines[lo:hi] = False
        rest_lines &= ok
        if rest_lines.any():
            self._lines(flat, np.flatnonzero(rest_lines), offset, count, cols, no_loss, bad, ok)
        out = cols.result(ok)
        lm, plain = out.pop("_lm", None), out.pop("_plain", None)
        if lm is not None and plain is not None:
            out["loss"] = (np.where(lm[1], lm[0], plain[0]), lm[1] | plain[1])
        elif lm is not None or plain is not None:
            out["loss"] = lm or plain  # type: ignore[assignment]
        no_loss &= ok
        if no_loss.any():
            out[NO_LOSS] = (no_loss.astype(np.float64), no_loss)
        stamps = self._stamps(heads, ok)
        if stamps is not None:
            out["time"] = stamps
        self.bad += int(bad[ok].sum())
        return ok, out

    def _run(
        self,
        flat: list[bytes],
        lo: int,
        hi: int,
        start: int,
        count: int,
        cols: _Cols,
        no_loss: np.ndarray,
        bad: np.ndarray,
        ok: np.ndarray,
    ) -> bool:
        """Lines ``lo:hi``, each ``count`` separators (``count / 2`` parts, then a blank
        one), read a column at a time; False when their keys differ (read line by line)."""
        pairs = count // 2
        step = count + 2
        stop = start + step * (hi - lo)
        specs: list[_Spec] = []
        for j in range(pairs + 1):
            keys = flat[start + 2 * j : stop : step]
            first = keys[0]
            if keys.count(first) != len(keys):
                return False
            if j == pairs:  # the part after the last pipe
                if first.strip():
                    return False
                continue
            spec = self._spec(first)
            if spec is None:
                return False
            specs.append(spec)
        targets = [s.target for s in specs if s.target is not None]
        if len(set(targets)) != len(targets):  # two keys fill one thing: read line by line
            ok[lo:hi] = False
            return True
        rows = slice(lo, hi)
        for j, spec in enumerate(specs):
            texts = flat[start + 2 * j + 1 : stop : step]
            try:
                vals = np.fromiter(map(float, texts), dtype=np.float64, count=len(texts))
            except ValueError:
                vals = np.empty(len(texts))
                for i, text in enumerate(texts):
                    try:
                        vals[i] = float(text)
                    except ValueError:
                        vals[i] = np.nan
                        ok[lo + i] = False
            if spec.kind == _IGNORE:
                continue
            has = np.ones(hi - lo, dtype=bool)
            if spec.kind in (_SAMPLES, _SKIPPED, _NAN):
                vals, has = _counts(vals, has)
                if not has.all():
                    bad[rows] += ~has
                if spec.kind != _SAMPLES and has.any() and vals[has].max() >= _EXACT:
                    raise _Giveup
            elif spec.kind == _FIELD and spec.factor != 1.0:
                vals = vals * spec.factor
            cols.put_run(_column_name(spec), rows, vals, has)
        has_loss = any(s.kind in (_LM_LOSS, _PLAIN_LOSS) for s in specs)
        if not has_loss and any(s.after for s in specs) and not any(s.mentions_loss for s in specs):
            no_loss[rows] = True
        return True

    def _lines(
        self,
        flat: list[bytes],
        lines: np.ndarray,
        offset: np.ndarray,
        count: np.ndarray,
        cols: _Cols,
        no_loss: np.ndarray,
        bad: np.ndarray,
        ok: np.ndarray,
    ) -> None:
        """The plain-looking lines not read by a run, token by token."""
        pairs = (count[lines] + 1) // 2
        trailing = lines[count[lines] % 2 == 0]
        if len(trailing):
            tail = _gather(flat, offset[trailing] + count[trailing])
            blank = np.fromiter(
                (not t for t in map(bytes.strip, tail)), dtype=bool, count=len(tail)
            )
            ok[trailing[~blank]] = False
        line = np.repeat(lines, pairs)
        within = np.arange(len(line)) - np.repeat(np.cumsum(pairs) - pairs, pairs)
        key_at = np.repeat(offset[lines], pairs) + 2 * within
        keys = _gather(flat, key_at)
        texts = _gather(flat, key_at + 1)
        ids = self._key_ids(keys)
        if (ids < 0).any():
            ok[line[ids < 0]] = False
        numbers = np.empty(len(texts))
        for i, text in enumerate(texts):
            try:
                if len(text) > _MAX_NUMBER_CHARS:
                    raise ValueError
                numbers[i] = float(text)
            except ValueError:
                numbers[i] = np.nan
                ok[line[i]] = False
        keep = ok[line]
        line, ids, numbers = line[keep], ids[keep], numbers[keep]
        if not len(ids):
            return
        specs = self.spec_list
        targets = np.array([self._target(s) for s in specs], dtype=np.int64)[ids]
        named = targets >= 0
        if named.any():
            width = len(self.targets) + 1
            code = line[named] * width + targets[named]
            counts = np.bincount(code)
            twice = code[counts[code] > 1]
            if len(twice):
                ok[np.unique(twice // width)] = False
                keep = ok[line]
                line, ids, numbers = line[keep], ids[keep], numbers[keep]
        for index in np.unique(ids).tolist():
            spec = specs[index]
            if spec.kind == _IGNORE:
                continue
            where = ids == index
            vals = numbers[where]
            at = line[where]
            has = np.ones(len(vals), dtype=bool)
            if spec.kind in (_SAMPLES, _SKIPPED, _NAN):
                vals, has = _counts(vals, has)
                np.add.at(bad, at[~has], 1)
                if spec.kind != _SAMPLES and has.any() and vals[has].max() >= _EXACT:
                    raise _Giveup
            elif spec.kind == _FIELD and spec.factor != 1.0:
                vals = vals * spec.factor
            cols.put_rows(_column_name(spec), at, vals, has)
        flags = np.array([(s.kind in (_LM_LOSS, _PLAIN_LOSS), s.after, s.mentions_loss)
                          for s in specs], dtype=bool)[ids]
        per_line = np.zeros((len(ok), 3), dtype=bool)
        for k in range(3):
            per_line[line[flags[:, k]], k] = True
        chosen = np.zeros(len(ok), dtype=bool)
        chosen[lines] = True
        no_loss |= chosen & ~per_line[:, 0] & per_line[:, 1] & ~per_line[:, 2]

    def _spec(self, raw: bytes) -> _Spec | None:
        index = self.spec_index.get(raw)
        if index is None:
            index = self._key_ids([raw])[0]
        return None if index < 0 else self.spec_list[int(index)]

    def _target(self, spec: _Spec) -> int:
        if spec.target is None:
            return -1
        return self.targets.setdefault(spec.target, len(self.targets))

    def _key_ids(self, keys: list[bytes]) -> np.ndarray:
        index = self.spec_index
        ids = np.fromiter(map(index.get, keys, repeat(-2)), dtype=np.int64, count=len(keys))
        if (ids == -2).any():
            for raw in set(compress(keys, (ids == -2).tolist())):
                if len(index) >= MAX_SPELLINGS:
                    continue
                text = raw.decode()
                if not text.strip():
                    index[raw] = -1  # an empty key: the part is skipped, read line by line
                    continue
                index[raw] = len(self.spec_list)
                self.spec_list.append(_Spec(text))
            ids = np.fromiter(map(index.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))
        return ids

    def _stamps(self, heads: list[str], ok: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The time of each line from the first time stamp in its head
        (``[2024-08-01 09:44:55]``), as ``_unix`` reads it."""
        n = len(heads)
        if not n:
            return None
        same = _same_shape(heads)
        if same is not None:
            if same.shape[1] == 0 or _STAMP.search(heads[0]) is None:
                return None
            at = _STAMP.search(heads[0]).start()  # type: ignore[union-attr]
            d = same[:, at + 1 : at + 20].astype(np.int64) - 48
            day = d[:, 0] * 10**7 + d[:, 1] * 10**6 + d[:, 2] * 10**5 + d[:, 3] * 10**4
            day += d[:, 5] * 1000 + d[:, 6] * 100 + d[:, 8] * 10 + d[:, 9]
            h = d[:, 11] * 10 + d[:, 12]
            m = d[:, 14] * 10 + d[:, 15]
            sec = d[:, 17] * 10 + d[:, 18]
            days, inverse = np.unique(day, return_inverse=True)
            base = np.array([self._day(f"{v // 10**4:04d}-{v // 100 % 100:02d}-{v % 100:02d}")
                             for v in days.tolist()], dtype=np.float64)[inverse]
            t = base + (h * 3600 + m * 60 + sec)
            valid = ok & (h <= 23) & (m <= 59) & (sec <= 61) & ~np.isnan(base)
            return np.where(valid, t, np.nan), valid
        joined = "\n".join(heads)
        if "[" not in joined:
            return None
        found = _FIRST_STAMP.findall(joined)
        if len(found) != n:  # one match per line is what the pattern gives
            raise _Giveup
        days, clocks = zip(*found, strict=True)
        has = np.fromiter(map(bool, days), dtype=bool, count=n) & ok
        if not has.any():
            return None
        values = np.full(n, np.nan)
        present = np.zeros(n, dtype=bool)
        idx = np.flatnonzero(has)
        day_list = [days[i] for i in idx.tolist()]
        clock_list = [clocks[i] for i in idx.tolist()]
        base = np.array([self._day(d) for d in day_list], dtype=np.float64)
        clock_text = "".join(clock_list)
        if clock_text.isascii():
            digits = np.frombuffer(clock_text.encode(), dtype=np.uint8).reshape(-1, 8)
            digits = digits.astype(np.int64) - 48
            h = digits[:, 0] * 10 + digits[:, 1]
            m = digits[:, 3] * 10 + digits[:, 4]
            sec = digits[:, 6] * 10 + digits[:, 7]
            valid = (h <= 23) & (m <= 59) & (sec <= 61) & ~np.isnan(base)
            t = base + (h * 3600 + m * 60 + sec)
        else:
            t = np.array(
                [
                    math.nan if (u := _unix(d, c)) is None else u
                    for d, c in zip(day_list, clock_list, strict=True)
                ]
            )
            valid = ~np.isnan(t)
        values[idx[valid]] = t[valid]
        present[idx[valid]] = True
        return values, present

    def _day(self, day: str) -> float:
        """The Unix time of a day's start (NaN: not a date strptime takes)."""
        got = self.day_start.get(day)
        if got is None and day not in self.day_start:
            got = _unix(day, "00:00:00")
            if len(self.day_start) < 100_000:
                self.day_start[day] = got
        return math.nan if got is None else got

    # -- the end: rows, counters, notes --------------------------------------------------

    def regular_columns(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        total = self.regular
        names: list[str] = []
        for block in self.blocks:
            names += [k for k in block if k not in names]
        out = {}
        for name in names:
            v = np.full(total, np.nan)
            m = np.zeros(total, dtype=bool)
            at = 0
            for block, size in zip(self.blocks, self.block_sizes, strict=True):
                got = block.get(name)
                if got is not None:
                    v[at : at + size] = got[0]
                    m[at : at + size] = got[1]
                at += size
            out[name] = (v, m)
        self.blocks = []
        return out


class _Cols:
    """Per-name (values, present) arrays over the iteration lines of one batch."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.data: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _get(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        got = self.data.get(name)
        if got is None:
            got = self.data[name] = (np.full(self.n, np.nan), np.zeros(self.n, dtype=bool))
        return got

    def put_run(self, name: str, rows: slice, vals: np.ndarray, has: np.ndarray) -> None:
        v, m = self._get(name)
        v[rows] = np.where(has, vals, np.nan)
        m[rows] = has

    def put_rows(self, name: str, at: np.ndarray, vals: np.ndarray, has: np.ndarray) -> None:
        v, m = self._get(name)
        v[at[has]] = vals[has]
        m[at[has]] = True

    def result(self, ok: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The columns, with nothing on the lines that are not plain after all."""
        return {k: (v, m & ok) for k, (v, m) in self.data.items()}


def _counts(vals: np.ndarray, has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``to_count`` over numbers: whole counts in 0 ... 2**63-1 (truncated), else absent."""
    good = has & np.isfinite(vals) & (vals >= 0) & (vals < 2.0**63)
    return np.where(good, np.trunc(vals), np.nan), good


def _has_longer(text: str, limit: int) -> bool:
    """Whether a line of ``text`` is longer than ``limit``: one look for a newline per
    ``limit`` characters."""
    pos, end = 0, len(text)
    while end - pos > limit:
        cut = text.rfind("\n", pos, pos + limit + 1)
        if cut < 0:
            return True
        pos = cut + 1
    return False


def _same_shape(heads: list[str]) -> np.ndarray | None:
    """The heads as a byte matrix when they all read like the first one but for its
    ASCII digits (a time stamp, a rank), else None."""
    first = heads[0]
    width = len(first)
    joined = "".join(heads)
    if len(joined) != width * len(heads) or not joined.isascii():
        return None
    if width == 0:
        return np.zeros((len(heads), 0), dtype=np.uint8)
    table = np.frombuffer(joined.encode(), dtype=np.uint8).reshape(len(heads), width)
    model = table[0]
    digit = (model >= 48) & (model <= 57)
    if not (table[:, ~digit] == model[~digit]).all():
        return None
    sub = table[:, digit]
    if not ((sub >= 48) & (sub <= 57)).all():
        return None
    return table


def _gather(items: list[Any], at: np.ndarray) -> list[Any]:
    if len(at) == 0:
        return []
    if len(at) == 1:
        return [items[int(at[0])]]
    return list(itemgetter(*at.tolist())(items))


class _Text:
    """The lines of a file as :class:`~sapper.logs.source.LogSource` feeds them: each
    read's complete lines as one text, overlong lines left out and counted."""

    def __init__(self, limit: int | None = None) -> None:
        from sapper.logs import limits

        self.tail = ""
        self.skipping = False
        self.overlong = 0
        self.limit = limits.MAX_LINE_CHARS if limit is None else limit

    def push(self, text: str) -> str:
        if "\x00" in text:
            text = text.replace("\x00", "")
        if self.skipping:
            cut = text.find("\n")
            if cut < 0:
                return ""
            self.skipping = False
            text = text[cut + 1 :]
        text = self.tail + text
        cut = text.rfind("\n")
        if cut < 0:
            self.tail, block = text, ""
        else:
            self.tail, block = text[cut + 1 :], text[:cut]
        if len(self.tail) > self.limit:
            self.tail = ""
            self.skipping = True
            self.overlong += 1
        if cut >= 0 and _has_longer(block, self.limit):
            lines = block.split("\n")
            if max(map(len, lines)) > self.limit:
                kept = [line for line in lines if len(line) <= self.limit]
                self.overlong += len(lines) - len(kept)
                block = "\n".join(kept)
        return block

    def rest(self) -> str:
        tail, self.tail = self.tail, ""
        self.skipping = False
        return tail if tail.strip() else ""

    def note(self) -> str | None:
        if not self.overlong:
            return None
        return (
            f"skipped {self.overlong} line(s) longer than {self.limit:,} characters "
            "(see Limits in docs/analyze.md)"
        )


def read_megatron_columnar(
    path: str | Path, *, min_bytes: int = MIN_BYTES
) -> ColumnarLog | None:
    """The Megatron log at ``path`` in columns, or ``None`` when this path does not
    apply (a small file, one it cannot read exactly): then the streaming reader reads
    it. The text in memory is one read (8 MiB) at a time; the columns take about 9
    bytes per field and step."""
    path = Path(path)
    try:
        size = check_regular(path).st_size
    except InputError:
        return None
    if size < max(1, min_bytes) or size > MAX_LOG_BYTES or path.is_dir():
        return None
    reader = _Reader(path)
    text = _Text()
    decoder: codecs.IncrementalDecoder | None = None
    read = 0
    try:
        with open_log(path) as fh:
            while chunk := fh.read(CHUNK_BYTES):
                read += len(chunk)
                if read > MAX_LOG_BYTES:
                    return None
                if decoder is None:
                    encoding = _sniff(chunk)
                    if encoding != "utf-8":
                        return None
                    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
                reader.feed(text.push(decoder.decode(chunk)))
        tail = decoder.decode(b"", final=True) if decoder is not None else ""
        last = text.push(tail)
        rest = text.rest()
        reader.feed(f"{last}\n{rest}" if rest else last)
        return _result(path, reader, text)
    except (OSError, InputError, _Giveup):  # the streaming reader says what is wrong
        return None


def _result(path: Path, reader: _Reader, text: _Text) -> ColumnarLog | None:
    merger = reader.merger
    finish_at = merger.count  # records emitted before the end of input
    parser = reader.slow
    notes_before = list(parser.notes)
    parser.notes.clear()
    overlong = text.note()
    parser._bad_values += reader.bad
    parser.finish()  # its own note on values that were not numbers
    end_notes = list(parser.notes)
    stray = []
    if merger.stray:
        stray.append(
            f"{merger.stray} validation or memory line(s) named a step that was not held "
            "any more and were skipped"
        )
    merger.flush()
    n = merger.count
    if n == 0:
        return None
    steps = merger.emitted_steps.array()
    slots = merger.emitted_slots.array()
    slot_reg = merger.slot_reg.array()
    reg = slot_reg[slots]
    complex_rows: dict[int, list[Put]] = {}
    if merger.puts:
        is_complex = np.zeros(len(slot_reg), dtype=bool)
        is_complex[np.fromiter(merger.puts, dtype=np.int64, count=len(merger.puts))] = True
        rows_c = np.flatnonzero(is_complex[slots])
        for row in rows_c.tolist():
            complex_rows[row] = merger.puts[int(slots[row])]
        reg = reg.copy()
        reg[rows_c] = -1
    rows_of = _regular_rows(reader, complex_rows) if complex_rows else {}
    regular = reader.regular_columns()
    simple = reg >= 0
    src = reg[simple]
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}

    def col(name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in values:
            values[name] = np.full(n, np.nan)
            present[name] = np.zeros(n, dtype=bool)
        return values[name], present[name]

    for name, (v, m) in regular.items():
        cv, cm = col(name)
        cv[simple] = v[src]
        cm[simple] = m[src]
    del regular
    full_extra: dict[int, dict[str, Any]] = {}  # rows with extras the columns do not keep
    if complex_rows:
        for row, puts in complex_rows.items():
            fields, extra = _merge(puts, rows_of)
            for name, value in fields.items():
                cv, cm = col(name)
                cv[row] = float(value)
                cm[row] = True
            odd = {}
            for name, value in extra.items():
                if name == NO_LOSS or (column_extra(name) and _number(value)):
                    cv, cm = col(name if name == NO_LOSS else "extra." + name)
                    cv[row] = float(value)
                    cm[row] = True
                else:
                    odd[name] = value
            if odd:
                full_extra[row] = odd
    starts = sorted({0, *(r for r in merger.restarts if r < n)})
    notes = _counters(steps, starts, values, present, col)
    # Extras the columns cannot hold (a name a detector might read): those rows are
    # whole records.
    for name in [k for k in values if k.startswith("extra.")]:
        bare = name[len("extra.") :]
        if column_extra(bare):
            continue
        for row in np.flatnonzero(present[name]).tolist():
            full_extra.setdefault(row, {})[bare] = float(values[name][row])
        del values[name], present[name]
    record_values = {k: v for k, v in values.items() if not k.startswith("extra.")}
    extras = {k[6:]: v for k, v in values.items() if k.startswith("extra.")}
    extras_present = {k[6:]: m for k, m in present.items() if k.startswith("extra.")}
    cols = Columns(
        steps=steps,
        values=record_values,
        present={k: present[k] for k in record_values},
        extras=extras,
        extras_present=extras_present,
        int_extras=_INT_EXTRAS & extras.keys(),
    )
    for row, odd in sorted(full_extra.items()):
        rec = cols.record(row)
        rec.extra.update(odd)
        cols.full[row] = rec
    attempts = []
    for number, (lo, hi) in enumerate(zip(starts, [*starts[1:], n], strict=True), 1):
        attempts.append(Attempt(number, lo, hi, int(steps[lo]), int(steps[lo:hi].max())))
    before = [t for r, _, t in notes if r < finish_at]
    after = [t for r, _, t in notes if r >= finish_at]
    all_notes = [*notes_before, *before, *([overlong] if overlong else []), *end_notes, *stray,
                 *after]
    return ColumnarLog(
        path=str(path),
        format="megatron",
        records=LazyRecords(cols),  # type: ignore[arg-type]
        findings=[],
        meta=dict(parser.meta),
        notes=all_notes,
        attempts=attempts,
        columns=cols,
    )


_RECORD_FIELDS = frozenset((*FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS))


def _number(value: Any) -> bool:
    return value.__class__ in (int, float)


def _regular_rows(reader: _Reader, rows: dict[int, list[Put]]) -> dict[int, tuple[dict, dict]]:
    """The values of the regular rows that complex records hold, as dicts."""
    wanted = sorted({p[1] for puts in rows.values() for p in puts if p[0] == "R"})
    if not wanted:
        return {}
    out: dict[int, tuple[dict, dict]] = {g: ({}, {}) for g in wanted}
    at = 0
    idx = np.asarray(wanted, dtype=np.int64)
    for block, size in zip(reader.blocks, reader.block_sizes, strict=True):
        lo, hi = np.searchsorted(idx, [at, at + size])
        for g in idx[lo:hi].tolist():
            fields, extra = out[g]
            for name, (v, m) in block.items():
                if not m[g - at]:
                    continue
                value = float(v[g - at])
                if name == NO_LOSS:
                    extra[NO_LOSS] = True
                elif name in ("skipped", "samples"):
                    fields[name] = int(value)
                elif name == "extra.nan_iterations":
                    extra["nan_iterations"] = int(value)
                elif name.startswith("extra."):
                    extra[name[len("extra.") :]] = value
                else:
                    fields[name] = value
        at += size
    return out


def _merge(puts: Iterable[Put], rows_of: dict[int, tuple[dict, dict]]) -> tuple[dict, dict]:
    """One step's puts merged as StepMerger.put merges them."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for put in puts:
        if put[0] == "R":
            values, ex = rows_of[put[1]]
            keep_max = False
        else:
            _, values, ex, keep_max = put
        for key, value in values.items():
            if value is None:
                continue
            if keep_max:
                old = fields.get(key)
                if old is not None and not old < value:
                    continue
            fields[key] = value
        for key, value in ex.items():
            if key in DICT_EXTRAS and value.__class__ is dict and key in extra:
                extra[key] = {**extra[key], **value}
            else:
                extra[key] = value
    return fields, extra


def _judge(
    label: str, raw: np.ndarray, steps: np.ndarray, first: np.ndarray, mode: list[str]
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """CounterReader._judge over a column's values in record order (``first``: the
    record starts an attempt): the new counts, where they are a running total's baseline
    (None), and the notes at each position. ``mode`` carries the column's reading."""
    k = len(raw)
    prev = np.empty(k, dtype=np.int64)
    prev[1:] = raw[:-1]
    prev[:1] = 0
    pstep = np.empty(k, dtype=np.int64)
    pstep[1:] = steps[:-1]
    pstep[:1] = 0
    has_prev = ~first
    span = steps - pstep
    up = np.flatnonzero(has_prev & (raw > prev) & (span > 0) & (raw > span))
    down = np.flatnonzero(has_prev & (raw < prev))
    new = raw.copy()
    baseline = np.zeros(k, dtype=bool)
    notes: list[tuple[int, str]] = []
    pos = 0
    while pos < k:
        if mode[0] == "interval":
            i = int(np.searchsorted(up, pos))
            if i == len(up):
                break  # interval counts to the end: new = raw
            at = int(up[i])
            new[at] = raw[at] - prev[at]
            notes.append((at, (
                f"column {label!r} reached {int(raw[at])} at step {int(steps[at])}, more than "
                f"the {int(span[at])} step(s) since the previous record: read as a running "
                "total"
            )))
            mode[0] = "total"
            pos = at + 1
        else:
            i = int(np.searchsorted(down, pos))
            stop = int(down[i]) if i < len(down) else k
            seg = slice(pos, stop)
            new[seg] = np.where(has_prev[seg], raw[seg] - prev[seg], raw[seg])
            baseline[seg] = first[seg] & (raw[seg] > 0)
            if stop == k:
                break
            new[stop] = raw[stop]
            notes.append((stop, (
                f"column {label!r} fell from {int(prev[stop])} to {int(raw[stop])} at step "
                f"{int(steps[stop])}: read as a count per record, not a running total"
            )))
            mode[0] = "interval"
            pos = stop + 1
    return new, baseline, notes


def _counters(
    steps: np.ndarray,
    starts: list[int],
    values: dict[str, np.ndarray],
    present: dict[str, np.ndarray],
    col: Any,
) -> list[tuple[int, int, str]]:
    """CounterReader.apply over every record at once: the skipped and NaN counters
    (Megatron-LM's per-interval counts, unless a value shows a running total) and a
    missing loss. Returns the notes as (row, order within the row, text)."""
    n = len(steps)
    attempt_first = np.zeros(n, dtype=bool)
    attempt_first[starts] = True
    attempt_id = np.cumsum(attempt_first) - 1
    notes: list[tuple[int, int, str]] = []
    # skipped
    span_rows = np.full(n, -1, dtype=np.int64)  # span for the NaN rule, -1: None
    in_interval = np.zeros(n, dtype=np.int64)
    new_present = np.zeros(n, dtype=bool)
    if "skipped" in values:
        rows = np.flatnonzero(present["skipped"])
        raw = values["skipped"][rows].astype(np.int64)
        st = steps[rows]
        aid = attempt_id[rows]
        first = np.ones(len(rows), dtype=bool)
        first[1:] = aid[1:] != aid[:-1]
        new, baseline, found = _judge(
            "number of skipped iterations", raw, st, first, ["interval"]
        )
        notes += [(int(rows[i]), 0, t) for i, t in found]
        span = np.where(first, -1, st - np.concatenate([[0], st[:-1]]))
        span_rows[rows] = span
        counted = np.where(baseline, 0, new)
        total = np.cumsum(counted)
        # the running total restarts with each attempt
        at_start = np.flatnonzero(first)
        base = np.repeat(
            np.concatenate([[0], total[at_start[1:] - 1]]) if len(at_start) else [],
            np.diff(np.append(at_start, len(rows))),
        )
        total = total - base
        if len(total) and total.max() >= _EXACT:
            raise _Giveup
        sv, sm = values["skipped"], present["skipped"]
        sv[rows] = (new > 0).astype(np.float64)
        sm[rows] = ~baseline
        tv, tm = col("skipped_total")
        tv[rows] = total
        tm[rows] = True
        iv, im = col("extra.skipped_in_interval")
        iv[rows] = new
        im[rows] = ~baseline
        in_interval[rows] = np.where(baseline, 0, new)
        new_present[rows] = ~baseline
    # NaN iterations, and a line without a loss
    nan_new = np.zeros(n, dtype=np.int64)
    if "extra.nan_iterations" in values:
        rows = np.flatnonzero(present["extra.nan_iterations"])
        raw = values["extra.nan_iterations"][rows].astype(np.int64)
        aid = attempt_id[rows]
        first = np.ones(len(rows), dtype=bool)
        first[1:] = aid[1:] != aid[:-1]
        new, baseline, found = _judge(
            "number of nan iterations", raw, steps[rows], first, ["interval"]
        )
        notes += [(int(rows[i]), 1, t) for i, t in found]
        kept = np.where(baseline, 0, new)
        values["extra.nan_iterations"][rows] = kept
        nan_new[rows] = kept
    no_loss = present.pop(NO_LOSS, np.zeros(n, dtype=bool))
    values.pop(NO_LOSS, None)
    loss_present = present["loss"] if "loss" in present else np.zeros(n, dtype=bool)
    asked = ~loss_present & ((nan_new > 0) | no_loss)
    if asked.any():
        skipped = in_interval
        covered = np.where(span_rows > 0, skipped >= span_rows, skipped > 0)
        nan_loss = asked & ((nan_new > 0) | ~covered)
        if nan_loss.any():
            lv, lm = col("loss")
            lv[nan_loss] = math.nan
            lm[nan_loss] = True
            quiet = np.flatnonzero(nan_loss & (nan_new == 0))
            if len(quiet):
                row = int(quiet[0])
                notes.append((row, 2, (
                    f"step {int(steps[row])}: the iteration line has no loss while "
                    f"{int(skipped[row])} skipped iteration(s) do not cover its interval: read "
                    "as a NaN loss (Megatron drops a NaN average from the line, and its NaN "
                    "counter read 0)"
                )))
    notes.sort(key=lambda t: (t[0], t[1]))
    return notes
