"""Training loops that print ``key value`` pairs: nanoGPT, torchtitan and their kin.

Many loops print one line per logged step and no file: nanoGPT's
``iter 100: loss 2.3450, time 123.45ms, mfu 40.12%`` and ``step 500: train loss 2.1,
val loss 2.2``; fairseq's ``| epoch 028 | loss 3.976 | ... | num_updates 9165 | gnorm 0.635
| loss_scale 0.000`` (its validation lines, ``valid on 'valid' subset``, give the eval
loss); torchtitan's ``step: 10  loss:  9.7869  grad_norm:  0.83  memory:
22.63GiB(23.82%)  tps: 2,345  tflops: 123.4  mfu: 12.3%`` behind a logger prefix
(``[rank0]:[titan] 2025-01-01 12:00:00,000 - root - INFO -``) and colour codes; the
``step N | loss X | lr Y | grad_norm Z`` lines of hand-written loops. This reader takes
any line holding a step key (``step``, ``iter``, ``iteration``, ``global_step`` ...) and
at least one metric a :class:`StepRecord` field holds, in any of these spellings:
``key: value``, ``key=value`` or ``key value``, pairs apart by blanks, ``|``, ``,`` or
``;``. Names map as a CSV column's do (:func:`sapper.logs.fields.resolve`: ``lr``,
``learning_rate``, ``gnorm``, ``val loss`` ...); a unit after the number is applied
(``ms``/``s`` to seconds, ``GiB``/``MiB`` to GiB, ``%`` for MFU, ``2,345`` thousands).

It is the reader of last resort: it recognises a log less confidently than any reader
of a specific format (a Megatron log's lines hold the same pairs), so it reads only what
none of them claims. Lines of several ranks (``[rank3]:`` prefixes) are read for the
first rank seen.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.logs.base import LogParser, coerce, put_mapped, to_float
from sapper.logs.console import ANSI
from sapper.logs.fields import STEP_NAMES, FieldMap, normalize_name, resolve
from sapper.logs.formats import LogFormat
from sapper.logs.limits import MAX_INT_DIGITS, to_count
from sapper.runtime.records import StepRecord

__all__ = ["FORMAT", "KeyValueParser", "pairs_of"]

_WORD = r"[A-Za-z_][\w./\-]{0,60}(?:\([A-Za-z%/]{1,10}\))?"
_NUMBER = (
    r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,40}(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,4})?"
    r"|[-+]?(?:[Nn]a[Nn]|[Ii]nf(?:inity)?)\b"
)
_UNIT = r"%|ms|us|µs|sec|s|min|h|GiB|MiB|KiB|TiB|GB|MB|KB|TB|B"
# One pair: a key of up to four words, ``:``/``=``/blanks, a number, its unit, and a
# parenthesised aside that is skipped (torchtitan's ``22.63GiB(23.82%)``).
_PAIR = re.compile(
    rf"(?<![\w./\-])(?P<key>{_WORD}(?: {_WORD}){{0,3}}?)(?:\s*[:=]\s*|\s+)"
    rf"(?P<value>{_NUMBER})(?:\s*/\s*(?P<total>\d{{1,18}}))?"
    rf"(?P<unit>{_UNIT})?(?![\w.])(?:\([^()\n]{{0,40}}\))?"
)
_DIGIT = re.compile(r"\d")
# A tqdm bar: an optional ``Epoch N`` description, the percentage, the bar (absent in a
# notebook's copy), ``n/total`` and what the brackets hold.
_BAR = re.compile(
    r"(?:Epoch\s+(?P<epoch>\d{1,9})(?:/\d{1,9})?\b)?[^|\r\n]{0,80}?(?<!\d)\d{1,3}%"
    r"(?:\|[^|\n]{0,400}\|)?\s*(?P<n>\d{1,12})/(?P<total>\d{1,12})\s*\[(?P<inside>[^\]\n]{0,4000})\]"
)
#: What every bar holds (``45/100 [``): looked for first, it rules out most lines at once.
_BAR_POSITION = re.compile(r"\d/\d{1,12}\s*\[")
_RANK = re.compile(r"^\s*\[(?:rank|default)(\d{1,6})\]:")
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")
_STEP_KEYS = {normalize_name(n): i for i, n in enumerate(STEP_NAMES) if n != "_step"}
_DURATION = {"ms": 1e-3, "us": 1e-6, "µs": 1e-6, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0}
_BYTES = {"B": 1 / 2**30, "KiB": 1 / 2**20, "KB": 1 / 2**20, "MiB": 1 / 1024, "MB": 1 / 1024,
          "GiB": 1.0, "GB": 1.0, "TiB": 1024.0, "TB": 1024.0}  # "GB" in logs is GiB (/1024**3)
_MEMORY_FIELDS = frozenset(
    {"memory_allocated_gib", "memory_reserved_gib", "memory_peak_gib", "memory_limit_gib",
     "rss_gib"}
)
# Names this reader gives a field that the table mapping leaves to ``extra``, each where
# the loop that prints it says: torchtitan's ``memory:`` is the peak reserved memory
# (torchtitan/components/metrics.py: ``memory: {device_mem_stats.max_reserved_gib}GiB``);
# ``time``/``dt`` with a duration unit is the step's time (nanoGPT's ``time 123.45ms``).
_OWN: dict[str, str] = {
    "memory": "memory_reserved_gib",
    "mem": "memory_reserved_gib",
    "time": "step_time_s",
    "dt": "step_time_s",
    "elapsed_time_per_step": "step_time_s",
    "iter_time": "step_time_s",
}
#: Numbers on a progress line that are no metric: Lightning's logger version, a rank.
_NOT_METRICS = frozenset({"v_num", "rank"})
#: Pairs read from one line at most (a hostile line of a million pairs costs this much).
MAX_PAIRS = 64
#: Unmapped names kept in ``StepRecord.extra`` over the log.
MAX_EXTRA_NAMES = 200


def pairs_of(line: str) -> list[tuple[list[str], str, str | None, str | None]]:
    """The ``(key words, number, total, unit)`` pairs of a line, ANSI escapes removed."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    out = []
    for match in _PAIR.finditer(line):
        out.append((match["key"].split(" "), match["value"], match["total"], match["unit"]))
        if len(out) >= MAX_PAIRS:
            break
    return out


def _step_of(words: list[str], value: str, unit: str | None) -> tuple[int, int] | None:
    """(rank of the step name, step) when the pair is a step counter."""
    if unit is not None or not value.isdigit() or len(value) > MAX_INT_DIGITS:
        return None
    rank = _step_rank(words[-1])
    if rank is None:
        return None
    step = to_count(int(value))
    return None if step is None else (rank, step)


@functools.lru_cache(maxsize=1024)
def _step_rank(word: str) -> int | None:
    return _STEP_KEYS.get(normalize_name(word))


def _target(words: list[str], unit: str | None, value: float) -> tuple[FieldMap | None, str]:
    """The field a pair's key means (trying ``train loss`` before ``loss``), with the
    normalized name for ``extra`` when none. A log repeats its keys on every line: the
    answer is cached per key, unit and whether the number is a time stamp."""
    return _target_of(tuple(words), unit, value >= 1e8)


@functools.lru_cache(maxsize=4096)
def _target_of(
    words: tuple[str, ...], unit: str | None, stamp: bool
) -> tuple[FieldMap | None, str]:
    for i in range(len(words)):
        name = " ".join(words[i:])
        key = normalize_name(name)
        fm = resolve(name)
        own = _OWN.get(key)
        if own is not None and (fm is None or fm.field == "time"):
            if own != "step_time_s":
                fm = FieldMap(own) if unit in _BYTES else fm
            elif unit in _DURATION or (unit is None and not stamp):
                fm = FieldMap("step_time_s")  # a number past 1e8 is a Unix time stamp
        if fm is not None:
            if fm.field == "time" and unit in _DURATION:
                fm = FieldMap("step_time_s")
            return fm, key
    return None, normalize_name(" ".join(words))


def _scaled(fm: FieldMap, value: float, unit: str | None) -> float | None:
    """The value in the field's unit: a printed unit beats the one the name implies."""
    if unit is None:
        return value * fm.factor
    if fm.field in ("step_time_s", "data_time_s"):
        factor = _DURATION.get(unit)
    elif fm.field in _MEMORY_FIELDS:
        factor = _BYTES.get(unit)
    elif fm.field == "mfu":
        factor = 0.01 if unit == "%" else None
    else:
        factor = fm.factor if unit == "%" else None
    return None if factor is None else value * factor


Pair = tuple[list[str], str, str | None]


def _metrics(pairs: list[Pair]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Record fields and ``extra`` values of ``(key words, number, unit)`` pairs."""
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for words, text, unit in pairs:
        value = to_float(text.replace(",", ""))
        if value is None:
            continue
        fm, key = _target(words, unit, value)
        if fm is None or fm.field in ("step", "ignore"):
            if key not in _NOT_METRICS:
                extra.setdefault(key, value)
            continue
        scaled = _scaled(fm, value, unit)
        if scaled is None:
            extra.setdefault(key, value)
            continue
        if fm.field == "mfu" and scaled < 0:
            continue  # nanoGPT prints -100% until it has measured (running_mfu = -1.0)
        if fm.key:  # a named eval set's loss, one layer's norm (factor 1)
            put_mapped(fm, scaled, values, extra)
        elif fm.field not in values:
            values[fm.field] = coerce(fm.field, scaled)
    return values, extra


Read = tuple[int, dict[str, Any], dict[str, Any], int | None]

#: fairseq's validation line, ``| epoch 028 | valid on 'valid' subset | loss 9.329 | ...
#: | num_updates 9165``: its loss is the eval loss of that subset (named unless 'valid').
_EVAL_LINE = re.compile(r"\bvalid on '(?P<subset>[^'\n]{1,60})' subset\b")


def _as_eval(values: dict[str, Any], subset: str) -> dict[str, Any]:
    """A validation line's fields: its loss as the eval loss, nothing of training's."""
    loss = values.get("loss", values.get("eval_loss"))
    if loss is None:
        return {}
    return {"eval_loss": loss} if subset == "valid" else {"eval_losses": {subset: loss}}


def read_line(line: str) -> Read | None:
    """``(step, fields, extra, total)`` of a line with a step and a metric, else None."""
    pairs = pairs_of(line)
    if len(pairs) < 2:
        return None
    best: tuple[int, int] | None = None
    total: int | None = None
    rest = []
    for words, text, of, unit in pairs:
        step = _step_of(words, text, unit)
        if step is not None:
            if best is None or step[0] < best[0]:
                best = step
                total = to_count(int(of)) if of else None
            continue
        rest.append((words, text, unit))
    if best is None:
        return None
    values, extra = _metrics(rest)
    evaluation = _EVAL_LINE.search(line)
    if evaluation is not None:
        values = _as_eval(values, evaluation.group("subset"))
        extra = {"eval_losses": values.pop("eval_losses")} if "eval_losses" in values else {}
        return (best[1], values, extra, total) if values or extra else None
    return (best[1], values, extra, total) if values else None


def read_bar(part: str) -> tuple[Read, bool] | None:
    """A tqdm progress bar with metrics after its rate (Lightning's ``Epoch 2:  45%|####
    | 45/100 [00:10<00:12, 4.50it/s, loss=0.123, v_num=1]``), and whether its step is the
    bar's position: counted over the epochs the description names (epoch × total + n),
    unless the metrics hold a step counter of their own (fairseq's ``num_updates=``)."""
    if "/" not in part or _BAR_POSITION.search(part) is None:
        return None  # no ``n/total [``: no bar (the full pattern is slow to fail)
    match = _BAR.search(part)
    if match is None:
        return None
    pieces = match["inside"].split(",", 2)
    if len(pieces) < 3:
        return None  # no metrics after the time and the rate
    pairs = pairs_of(pieces[2])
    counted = [s for w, t, _, u in pairs if (s := _step_of(w, t, u)) is not None]
    values, extra = _metrics([(w, t, u) for w, t, _, u in pairs])
    if not values:
        return None
    if counted:
        return (min(counted)[1], values, extra, None), False
    n, total = to_count(int(match["n"])), to_count(int(match["total"]))
    epoch = to_count(int(match["epoch"])) if match["epoch"] else 0
    if n is None or total is None or epoch is None:
        return None
    step = to_count(epoch * total + n)
    return None if step is None else ((step, values, extra, None), True)


class KeyValueParser(LogParser):
    """Incremental parser of ``step N ... key value`` console lines."""

    format = "keyvalue"

    def __init__(
        self, source: str = "<input>", mapping: dict[str, FieldMap] | None = None
    ) -> None:
        super().__init__(source, mapping)
        self._rank: str | None = None
        self._other_ranks = 0
        self._extra_names: set[str] = set()
        self._extra_dropped = 0
        self._bars = False  # steps read from progress bars
        # ``skipped=N`` (DeepSpeed's progress line) is a running total in some loops and a
        # per-line count in others: read from its values (see sapper.logs.counters).
        self.merger.counters.configure_skipped("skipped", "auto")

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        for line in lines:
            if _DIGIT.search(line) is None:
                continue
            rank = _RANK.match(line)
            if rank is not None:
                if self._rank is None:
                    self._rank = rank.group(1)
                elif rank.group(1) != self._rank:
                    self._other_ranks += 1
                    continue
            bars = False
            if "%" in line and "[" in line:
                for part in line.split("\r"):  # each redraw of a bar is one state
                    found = read_bar(part) if "%" in part else None
                    if found is not None:
                        read, by_position = found
                        bars = True
                        self._bars = self._bars or by_position
                        self._put(read, part)
            if bars:
                continue
            line = _last_part(line)
            if self.mapping:
                self._mapped(line)
                continue
            read = read_line(line)
            if read is not None:
                self._put(read, line)
        return self.merger.ready()

    def _put(self, read: Read, line: str) -> None:
        step, values, extra, total = read
        if total is not None:
            self.meta.setdefault("max_steps", total)
        kept = {}
        for key, value in extra.items():
            if key in self._extra_names or len(self._extra_names) < MAX_EXTRA_NAMES:
                self._extra_names.add(key)
                kept[key] = value
            else:
                self._extra_dropped += 1
        stamp = _STAMP.search(line, 0, 80)
        if stamp is not None and "time" not in values:
            values["time"] = _unix(stamp.group(1), stamp.group(2))
        self.merger.put(step, values, kept)

    def _mapped(self, line: str) -> None:
        """A line read under ``--map``: each mapped key where the map says, the rest as
        the reader reads them."""
        pairs = pairs_of(line)
        read = read_line(line)
        values: dict[str, Any] = dict(read[1]) if read else {}
        extra: dict[str, Any] = dict(read[2]) if read else {}
        step = read[0] if read else None
        for words, text, _, _ in pairs:
            name = " ".join(words)
            self.keys_seen.add(name)
            fm = self.mapped(name)
            if fm is None:
                continue
            value = to_float(text.replace(",", ""))
            if fm.field == "step":
                count = to_count(value) if value is not None else None
                step = count if count is not None else step
                continue
            put_mapped(fm, value, values, extra)
        if step is not None and (values or extra):
            self.merger.put(step, values, extra)

    def finish(self) -> list[StepRecord]:
        if self._bars:
            self.notes.append(
                "steps read from progress bars: the bar's position, counted over the epochs "
                "(epoch × batches per epoch + batch); with gradient accumulation an "
                "optimizer step is several of them"
            )
        if self._other_ranks:
            self.notes.append(
                f"read rank {self._rank}'s lines; {self._other_ranks} line(s) of other ranks "
                "were passed over"
            )
        if self._extra_dropped:
            self.notes.append(
                f"{self._extra_dropped} value(s) of names past the first {MAX_EXTRA_NAMES} "
                "were not kept"
            )
        return super().finish()


def _last_part(line: str) -> str:
    """What a line shows last: a progress display redraws itself after a ``\r``."""
    if "\r" not in line:
        return line
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1] if parts else ""


def _unix(day: str, clock: str) -> float | None:
    """The Unix time of ``day`` (``2024-08-01``) at ``clock`` (``09:44:55``), as
    ``strptime`` and ``timegm`` read it, or None when strptime refuses it: the day is
    parsed once, a clock of ASCII digits is read here."""
    if clock.isascii():
        h, m, s = int(clock[0:2]), int(clock[3:5]), int(clock[6:8])
        if h > 23 or m > 59 or s > 61:  # %H, %M and %S (leap seconds included)
            return None
        start = _day_start(day)
        return None if start is None else float(start + 3600 * h + 60 * m + s)
    try:
        return float(calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S")))
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def _day_start(day: str) -> int | None:
    try:
        return calendar.timegm(time.strptime(f"{day} 00:00:00", "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def _recognise(text: str, path: Path) -> float:
    """Lines with a step and a metric among the head's first 2,000 lines with digits:
    "could be" (0.3) for one, a little more for several; any specific format's
    recogniser is more confident."""
    found = checked = 0
    for line in text.splitlines():
        if _DIGIT.search(line) is None:
            continue
        checked += 1
        if read_line(_last_part(line)[:8192]) or ("%" in line and read_bar(line[-8192:])):
            found += 1
            if found >= 3:
                return 0.5
        if checked >= 2000:
            break
    return 0.3 if found else 0.0


FORMAT = LogFormat(
    name="keyvalue",
    title="a console log of 'step N | loss X | lr Y' lines (nanoGPT, torchtitan ...)",
    looks_for="lines with a step key and a metric: 'iter 100: loss 2.345, time 120ms', "
    "'step: 10  loss: 9.78  grad_norm: 1.2'",
    parser=lambda path, mapping: KeyValueParser(str(path), mapping),
    recognise_text=_recognise,
)
