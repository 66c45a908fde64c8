"""Megatron-LM (and Megatron-DeepSpeed) text logs.

Megatron prints one line every ``--log-interval`` iterations::

     [2024-08-01 09:44:55] iteration      120/  250000 | consumed samples: 122880 |
     elapsed time per iteration (ms): 861.2 | learning rate: 9.0E-06 | global batch size:
     1024 | lm loss: 2.50E+00 | loss scale: 65536.0 | grad norm: 0.231 |
     number of skipped iterations:   0 | number of nan iterations:   0 |

(one line in the log), possibly behind a launcher prefix (``[default3]:``, ``0:``).
Values are averages over the interval; the loss is left out when every iteration of the
interval was skipped (fp16 overflow) or produced NaN, so a line without its loss becomes
a non-finite loss here unless its skipped iterations cover the interval (the counters read
0 under DeepSpeed; see :meth:`CounterReader._nan_loss`) — the detectors must see it. The
skipped and NaN counts are per interval in Megatron-LM; a fork printing running totals is
recognized by its values (:mod:`sapper.logs.counters`). Validation lines
(``validation loss at iteration N | lm loss value: ...``) and the memory report
(``[Rank 0] (after N iterations) memory (MB) | allocated: ...``) are merged into the
step they name. Everything else in the log (arguments, timers, warnings) is skipped.

Speed (``sapper watch`` follows a log at thousands of lines a second): a run prints its
iteration lines with the same keys in the same order, so the parser learns each line
layout once (:class:`_Layout`: the keys' text kept literally, one capture per value) and
reads a later line of that layout with one match and a ``float`` per value. A line the
layout does not match exactly, or one holding a value that is not a plain number, is
read segment by segment as before; both ways give the same record.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.logs.base import LogParser, put_mapped, to_float
from sapper.logs.counters import NO_LOSS
from sapper.logs.fields import FieldMap
from sapper.logs.formats import LogFormat
from sapper.logs.limits import MAX_COUNT, MAX_INT_DIGITS, to_count
from sapper.runtime.records import StepRecord

__all__ = ["FORMAT", "ITERATION_LINE", "MegatronParser"]

#: The iteration line; also used by format detection.
ITERATION_LINE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,]\d+)?\]")
_VALID = re.compile(r"validation loss at (?:iteration\s+(\d+))?(.*?)\|(.*)$")
_MEMORY = re.compile(r"\(after (\d+) iterations\) memory \((MB|GB|GiB|MiB)\)\s*\|(.*)$")

# segment key (lower case) -> (StepRecord field, factor)
_KEYS: dict[str, tuple[str, float]] = {
    "lm loss": ("loss", 1.0),
    "loss": ("loss", 1.0),
    "learning rate": ("lr", 1.0),
    "loss scale": ("loss_scale", 1.0),
    "grad norm": ("grad_norm", 1.0),
    "global batch size": ("samples", 1.0),
    "elapsed time per iteration (ms)": ("step_time_s", 1e-3),
    "elapsed time per iteration (s)": ("step_time_s", 1.0),
    "samples per second": ("samples_per_s", 1.0),
}
# segment key -> name in StepRecord.extra
_EXTRA: dict[str, str] = {
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "decoupled learning rate": "decoupled_lr",
    "num zeros": "num_zeros",
    "params norm": "params_norm",
    "throughput per gpu (tflop/s/gpu)": "tflops_per_gpu",
    "tflops": "tflops_per_gpu",
    "tokens per gpu per second (tgs)": "tokens_per_s_per_gpu",
    "actual seqlen": "seq_len",
    "curriculum seqlen": "curriculum_seq_len",
    "world size": "world_size",
}
#: Keys Megatron prints after the losses on an iteration line.
_AFTER_LOSSES = frozenset({
    "loss scale", "grad norm", "num zeros", "params norm", "number of skipped iterations",
    "number of nan iterations",
})
_MEM_FIELDS = {
    "allocated": "memory_allocated_gib",
    "max allocated": "memory_peak_gib",
    "reserved": "memory_reserved_gib",
}


#: Value text of a learned layout: what ``_segments`` takes as a value (no pipe, no
#: colon), at most as long as ``to_float`` reads.
_VALUE = r"([^|:]{0,1000})"


class _Layout:
    """One iteration-line layout: a pattern matching the text after ``iteration N/ T |``
    of any line with the same keys, separators and spacing (only the values differ),
    and where each captured value goes. Matching it splits a line exactly as
    :func:`_segments` would: the key texts hold no pipe and the values neither pipe nor
    colon, so the pipes and each part's last colon fall where the layout's did."""

    __slots__ = ("counts", "extras", "fields", "loss", "no_loss", "pattern")

    def __init__(self, pattern: re.Pattern[str], keys: list[str], no_loss: bool) -> None:
        self.pattern = pattern
        #: (value index, record field, factor), (index, extra name), (index, name,
        #: whether it goes to extra) for counts, in line order (a later key wins).
        self.fields: list[tuple[int, str, float]] = []
        self.extras: list[tuple[int, str]] = []
        self.counts: list[tuple[int, str, bool]] = []
        lm = plain = -1
        for i, key in enumerate(keys):
            if key in _KEYS:
                name, factor = _KEYS[key]
                if name != "loss":
                    if name == "samples":
                        self.counts.append((i, name, False))
                    else:
                        self.fields.append((i, name, factor))
                elif key == "lm loss":
                    lm = i
                else:
                    plain = i
            elif key == "number of skipped iterations":
                self.counts.append((i, "skipped", False))
            elif key == "number of nan iterations":
                self.counts.append((i, "nan_iterations", True))
            elif key in _EXTRA:
                self.extras.append((i, _EXTRA[key]))
            elif key.endswith("loss"):
                self.extras.append((i, key.replace(" ", "_")))
        #: The value read as the loss (the LM loss before a plain one), -1: none.
        self.loss = lm if lm >= 0 else plain
        #: Whether a line of this layout without a loss value is a missing loss
        #: (:meth:`MegatronParser._no_loss`): it depends on the keys only, as no number
        #: ``float`` reads holds a letter of ``loss``.
        self.no_loss = no_loss

    @classmethod
    def learn(cls, rest: str) -> _Layout | None:
        """The layout of an iteration line's ``rest``, or None when a part has no colon
        (the early ``key value`` form is read segment by segment)."""
        pieces: list[str] = []
        keys: list[str] = []
        for part in rest.split("|"):
            key, sep, _ = part.rpartition(":")
            if not sep:
                if part.strip():
                    return None
                pieces.append(re.escape(part))
                continue
            lower = key.strip().lower()
            if not lower:  # ": 5": no key, the value is not read
                pieces.append(re.escape(key + ":") + "[^|:]*")
                continue
            keys.append(lower)
            pieces.append(re.escape(key + ":") + _VALUE)
        if len(keys) > 90:  # Python's re takes at most 100 groups; such lines are rare
            return None
        no_loss = MegatronParser._no_loss(rest, set(keys))
        return cls(re.compile(r"\|".join(pieces), re.S), keys, no_loss)


def _segments(text: str) -> list[tuple[str, str]]:
    """``key: value`` pairs between the pipes; early Megatron-LM wrote ``key value``
    (``lm loss 6.758929E+00 | loss scale 64.0``), read when the last word is a number."""
    out = []
    for part in text.split("|"):
        key, sep, value = part.rpartition(":")
        if not sep:
            key, sep, value = part.strip().rpartition(" ")
            if not sep or to_float(value) is None:
                continue
        key = key.strip()
        if key:
            out.append((key.lower(), value.strip()))
    return out


class MegatronParser(LogParser):
    """Incremental parser of Megatron text logs (one ``feed`` per batch of lines)."""

    format = "megatron"
    #: Line layouts learned at most (a log whose every line is laid out anew is read
    #: segment by segment past them; 0 reads every line so); lines whose layout cannot
    #: be learned are given up on after four times as many.
    max_layouts: int = 64

    def __init__(
        self, source: str = "<input>", mapping: dict[str, FieldMap] | None = None
    ) -> None:
        super().__init__(source, mapping)
        self._bad_values = 0
        # Megatron-LM prints the skipped and NaN iterations of each interval; a fork that
        # prints running totals is recognized by its values (see sapper.logs.counters).
        self.merger.counters.configure_skipped("number of skipped iterations", "interval")
        self.merger.counters.configure_nan("number of nan iterations")
        self._layouts: list[_Layout] = []  # the last one matched first
        self._learned = 0  # layouts compiled
        self._refused = 0  # lines whose layout could not be learned
        self._unmatched = False  # the line being read matched no learned layout

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        for line in lines:
            if "iteration" not in line:
                continue
            match = ITERATION_LINE.search(line)
            if match:
                if not self._by_layout(line, match):
                    self._iteration(line, match)
            elif "validation loss at" in line:
                self._validation(line)
            elif "memory (" in line:
                self._memory(line)
        return self.merger.ready()

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
        """Hand one line's values to the merger (the columnar reader,
        :mod:`sapper.logs.columnar.megatron`, takes them itself)."""
        self.merger.put(step, values, extra, keep_max=keep_max, annex=annex, whole=whole)

    def finish(self) -> list[StepRecord]:
        if self._bad_values:
            self.notes.append(f"{self._bad_values} value(s) were not numbers and were skipped")
        return super().finish()

    def _by_layout(self, line: str, match: re.Match[str]) -> bool:
        """Read an iteration line by a learned layout, as :meth:`_iteration` reads it;
        False (nothing done) when no layout matches it, or it holds a value that is not
        a number or a count that is not one: :meth:`_iteration` reads it then."""
        pos = match.end()
        layouts = self._layouts
        for i, layout in enumerate(layouts):
            found = layout.pattern.fullmatch(line, pos)
            if found is not None:
                if i:
                    layouts.insert(0, layouts.pop(i))
                break
        else:
            self._unmatched = True
            return False
        digits, total_digits = match.groups()
        if len(digits) > MAX_INT_DIGITS:
            return False
        step = int(digits)  # as _int: 18 digits or fewer are a count
        try:
            got = list(map(float, found.groups()))
        except ValueError:
            return False
        values = {name: got[i] * factor for i, name, factor in layout.fields}
        extra = {name: got[i] for i, name in layout.extras}
        for i, name, in_extra in layout.counts:
            value = got[i]
            if not 0 <= value <= MAX_COUNT:  # as to_count: NaN, inf, negative, past int64
                return False
            if in_extra:
                extra[name] = int(value)
            else:
                values[name] = int(value)
        if "train_iters" not in self.meta:
            total = _int(total_digits)
            if total is not None:
                self.meta["train_iters"] = total
        loss = values["loss"] = got[layout.loss] if layout.loss >= 0 else None
        if loss is None and layout.no_loss:
            extra[NO_LOSS] = True
        stamp = _STAMP.search(line, 0, match.start() + 1)
        if stamp:
            values["time"] = _unix(stamp.group(1), stamp.group(2))
        self._put(step, values, extra, whole=True)
        return True

    def _learn(self, rest: str) -> None:
        """Remember the layout of a line no learned layout matched, for the lines like it."""
        if not self._unmatched:
            return
        self._unmatched = False
        if self.mapping or self._learned >= self.max_layouts:
            return
        if self._refused >= 4 * self.max_layouts:
            return  # the colon-less early form, or lines cut short: read segment by segment
        layout = _Layout.learn(rest)
        if layout is None:
            self._refused += 1
            return
        self._learned += 1
        self._layouts.insert(0, layout)
        del self._layouts[8:]  # the few a log alternates between

    def _iteration(self, line: str, match: re.Match[str]) -> None:
        step, total = _int(match.group(1)), _int(match.group(2))
        if step is None:
            self._bad_values += 1
            return
        if total is not None:
            self.meta.setdefault("train_iters", total)
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        losses: dict[str, float] = {}
        seen: set[str] = set()
        for key, text in _segments(line[match.end() :]):
            seen.add(key)
            if self.mapping:
                self.keys_seen.add(key)
                fm = self.mapped(key)
                if fm is not None:
                    put_mapped(fm, to_float(text), values, extra)
                    continue
            value = to_float(text)
            if value is None:
                self._bad_values += 1
                continue
            if key in _KEYS:
                name, factor = _KEYS[key]
                if name == "loss":
                    losses[key] = value
                    continue
                if name == "samples":
                    samples = to_count(value)
                    if samples is None:
                        self._bad_values += 1
                    else:
                        values[name] = samples
                else:
                    values[name] = value * factor
            elif key == "number of skipped iterations":
                count = to_count(value)
                if count is None:  # NaN, negative, past int64: not a count
                    self._bad_values += 1
                    continue
                values["skipped"] = count  # judged by the merger's CounterReader
            elif key == "number of nan iterations":
                count = to_count(value)
                if count is None:
                    self._bad_values += 1
                    continue
                extra["nan_iterations"] = count
            elif key in _EXTRA:
                extra[_EXTRA[key]] = value
            elif key.endswith("loss"):
                extra[key.replace(" ", "_")] = value
        if "loss" not in values:
            values["loss"] = losses.get("lm loss", losses.get("loss"))
        if values["loss"] is None and self._no_loss(line[match.end() :], seen):
            extra[NO_LOSS] = True  # NaN or all skipped: the merger's CounterReader decides
        stamp = _STAMP.search(line, 0, match.start() + 1)
        if stamp:
            values["time"] = _unix(stamp.group(1), stamp.group(2))
        self._put(step, values, extra, whole=True)
        self._learn(line[match.end() :])

    @staticmethod
    def _no_loss(rest: str, keys: set[str]) -> bool:
        """The line prints no loss where Megatron puts it: it got past the losses (a key
        printed after them is there, so a line cut or wrapped before them does not count)
        and holds no loss in any spelling (a colon-less ``lm loss 2.5`` included)."""
        if not keys & _AFTER_LOSSES:
            return False
        return "loss" not in rest.lower().replace("loss scale", "")

    def _validation(self, line: str) -> None:
        match = _VALID.search(line)
        if not match or match.group(1) is None:
            return
        if "test" in match.group(2).lower():
            return  # a test-set evaluation, not the validation curve
        for key, text in _segments(match.group(3)):
            if key in ("lm loss value", "loss value"):
                value = to_float(text)
                step = _int(match.group(1))
                if value is not None and step is not None:
                    self._put(step, {"eval_loss": value}, annex=True)
                return

    def _memory(self, line: str) -> None:
        match = _MEMORY.search(line)
        if not match:
            return
        factor = 1.0 if match.group(2) in ("GB", "GiB") else 1.0 / 1024
        values: dict[str, Any] = {}
        for key, text in _segments(match.group(3)):
            name = _MEM_FIELDS.get(key)
            value = to_float(text)
            if name and value is not None:
                values[name] = value * factor
        step = _int(match.group(1))
        if values and step is not None:
            self._put(step, values, keep_max=True, annex=True)


def _int(digits: str) -> int | None:
    """A step number from the log's digits; ``None`` past int64 (no ``int()`` on a
    5000-digit string, which Python refuses)."""
    return to_count(int(digits)) if len(digits) <= MAX_INT_DIGITS else None


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
    """Megatron's iteration line (``iteration 120/ 250000 |``) anywhere in the head:
    hundreds of argument lines come first."""
    return 0.8 if "iteration" in text and ITERATION_LINE.search(text) else 0.0


FORMAT = LogFormat(
    name="megatron",
    title="a Megatron-LM log",
    looks_for="iteration lines: 'iteration N/ TOTAL | ... | lm loss: ... |'",
    parser=lambda path, mapping: MegatronParser(str(path), mapping),
    recognise_text=_recognise,
    framework="megatron",
)
