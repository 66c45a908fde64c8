"""What the Hugging Face Trainer prints to the console: its log dicts among progress bars.

``Trainer.log`` hands each logs dict to its callbacks, and the console shows it as the
Python ``str()`` of a dict (``ProgressCallback.on_log`` writes it with
``tqdm.write`` above the progress bar; ``PrinterCallback.on_log`` prints it when
``disable_tqdm`` is set; transformers/trainer_callback.py)::

    {'loss': 2.119, 'grad_norm': 37.657958984375, 'learning_rate': 4.58e-05, 'epoch': 0.25}
    {'eval_loss': 1.52, 'eval_runtime': 3.2, 'eval_samples_per_second': 31.1, 'epoch': 0.25}
    {'train_runtime': 95.1, 'train_samples_per_second': 10.5, 'train_loss': 1.4, 'epoch': 3.0}

Newer versions print floats as strings of four significant digits (``'loss': '2.119'``);
values of numpy types print as ``np.float64(2.119)``; a NaN prints as ``nan``. A dict is
never evaluated: its ``'key': value`` pairs are read by one bounded pattern and each
value through :func:`sapper.logs.base.to_float`. Around the dicts are tqdm bars (redrawn
after a carriage return, ANSI escapes), warnings and tracebacks, all skipped.

The dict holds no step. The training bar (``  12%|█▎   | 120/1000 [01:02<07:40, ...]``,
total = max_steps, advanced to ``state.global_step`` before each log) says it when the
console was captured with stderr; otherwise the dicts are numbered in order (the k-th
training log is step k·logging_steps, and logging_steps is not printed). A note says
which. Eval dicts belong to the step of the training log before them; the final
``train_runtime`` summary goes to ``LogData.meta``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.logs.base import LogParser, put_mapped, to_float
from sapper.logs.fields import FieldMap, resolve
from sapper.logs.formats import LogFormat
from sapper.logs.limits import MAX_INT_DIGITS, to_count
from sapper.runtime.records import StepRecord

__all__ = ["ANSI", "FORMAT", "ConsoleParser", "log_dict"]

#: Terminal escapes (colours, cursor moves) that console logs keep.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# One ``'key': value`` pair of a printed dict. A value is a quoted string, a numpy or
# torch scalar (``np.float64(2.1)``, ``tensor(2.1, device='cuda:0')``), a list, or a bare
# word (a number, nan, inf, True, None); every part is bounded.
_PAIR = re.compile(
    r"""(?P<q>['"])(?P<key>[^'"\n]{1,200})(?P=q)\s*:\s*"""
    r"""(?P<value>'[^'\n]{0,200}'|"[^"\n]{0,200}"|[A-Za-z_][\w.]{0,40}\([^()\n]{0,200}\)"""
    r"""|\[[^\[\]\n]{0,2000}\]|[^,{}\[\]\n]{1,60})"""
)
# A dict as printed: braces around at least one single-quoted key (JSON has double).
_DICT = re.compile(r"\{\s*'[^'\n]{1,200}'\s*:[^{}\n]{0,20000}\}")
# tqdm's bar: ``n/total [elapsed<remaining, rate]``.
_BAR = re.compile(r"(?<![\d/])(\d{1,18})/(\d{1,18}) \[\d")
_SCALAR = re.compile(r"^[A-Za-z_][\w.]*\(\s*([^,()]*)")
_TOTAL_STEPS = re.compile(r"Total optimization steps = (\d{1,3}(?:,\d{3}){1,5}|\d{1,18})\b")
#: Keys of the run's closing summary (``Trainer.train`` logs it once, at the end).
_SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})
#: Keys that make a printed dict a training or eval log, as the recogniser asks.
_LOG_KEYS = ("'loss'", "'eval_loss'", "'train_runtime'", "'grad_norm'", "'learning_rate'")


def _value(raw: str) -> tuple[float | None, Any]:
    """The number a printed value holds (None: not a number) and the raw value."""
    text = raw.strip()
    if text[:1] in ("'", '"'):
        text = text[1:-1]
    elif "(" in text:
        match = _SCALAR.match(text)
        text = match.group(1) if match else ""
    elif text in ("True", "False", "None") or text.startswith("["):
        return None, text
    return to_float(text), text


def log_dict(text: str) -> dict[str, str] | None:
    """The ``key -> printed value`` pairs of the first printed dict in ``text``, or None."""
    match = _DICT.search(text)
    if match is None:
        return None
    pairs = {m["key"]: m["value"] for m in _PAIR.finditer(match.group(0))}
    return pairs or None


class ConsoleParser(LogParser):
    """Incremental parser of a Trainer's console output (a captured stdout/stderr)."""

    format = "hf_console"

    def __init__(
        self, source: str = "<input>", mapping: dict[str, FieldMap] | None = None
    ) -> None:
        super().__init__(source, mapping)
        self._bar_n: int | None = None  # the training bar's position when last drawn
        self._bar_total = 0
        self._by_bar: bool | None = None  # decided at the first training dict
        self._ordinal = 0  # training dicts so far
        self._step = 0  # the step of the last training dict
        self._bad_values = 0
        self._dicts = 0
        self._stale = 0  # training dicts whose bar position had not moved on

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        for line in lines:
            if "\x1b" in line:
                line = ANSI.sub("", line)
            for part in line.split("\r"):
                if "/" in part and "[" in part:
                    self._bar(part)
                if "{" in part and "'" in part:
                    pairs = log_dict(part)
                    if pairs is not None:
                        self._log(pairs)
                elif "Total optimization steps" in part:
                    self._max_steps(part)
        return self.merger.ready()

    def _max_steps(self, part: str) -> None:
        """The Trainer's ``Total optimization steps = 1,000`` (logged before training)."""
        match = _TOTAL_STEPS.search(part)
        total = to_count(int(match.group(1).replace(",", ""))) if match else None
        if total is not None:
            self.meta.setdefault("max_steps", total)

    def _bar(self, part: str) -> None:
        """Keep the training bar's position: the bar with the largest total (an eval bar
        counts eval batches, and the training bar's total is max_steps)."""
        for match in _BAR.finditer(part):
            if len(match.group(1)) > MAX_INT_DIGITS or len(match.group(2)) > MAX_INT_DIGITS:
                continue
            n, total = int(match.group(1)), int(match.group(2))
            if total >= self._bar_total and n <= total:
                self._bar_total, self._bar_n = total, n

    def _log(self, pairs: dict[str, str]) -> None:
        keys = pairs.keys()
        if keys & _SUMMARY_KEYS:
            summary = {k: v for k, v in ((k, _value(r)[0]) for k, r in pairs.items())
                       if v is not None}
            self.meta["summary"] = summary
            return
        is_eval = any(k.startswith(("eval_", "test_")) for k in keys) and "loss" not in keys
        if not is_eval and not any(resolve(k) is not None for k in keys):
            return  # a dict of something else (a config, a tokenizer's special tokens)
        self._dicts += 1
        if not is_eval:
            self._ordinal += 1
            if self._by_bar is None:
                self._by_bar = self._bar_n is not None
            if self._by_bar and self._bar_n is not None:
                if self._bar_n <= self._step and self._ordinal > 1:
                    self._stale += 1  # the bar was not redrawn since the last log
                self._step = self._bar_n
            else:
                self._step = self._ordinal
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, raw in pairs.items():
            value, text = _value(raw)
            if self.mapping:
                self.keys_seen.add(key)
                fm = self.mapped(key)
                if fm is not None:
                    put_mapped(fm, value, values, extra)
                    continue
            target = None if key == "epoch" else resolve(key)
            if target is None:
                if value is not None:
                    extra[key] = value
                continue
            if value is None:
                if text not in ("None", ""):
                    self._bad_values += 1
                continue
            put_mapped(target, value, values, extra)
        if values or extra:
            self.merger.put(self._step, values, extra, annex=is_eval)

    def finish(self) -> list[StepRecord]:
        if self._dicts:
            if self._by_bar:
                self.notes.append(
                    "steps read from the training progress bar (n/total) drawn next to each "
                    "logged dict (the Trainer prints no step)"
                )
            else:
                self.notes.append(
                    "steps are the logged dicts' order (1, 2, 3 ...): no training progress "
                    "bar was captured and the Trainer prints no step; the k-th log is step "
                    "k × logging_steps of the run"
                )
        if self._stale:
            self.notes.append(
                f"{self._stale} logged dict(s) came before the progress bar moved on and "
                "were merged into the step before (stdout buffered apart from the bar?)"
            )
        if self._bad_values:
            self.notes.append(
                f"{self._bad_values} loss, grad_norm, learning_rate or eval value(s) were not "
                "numbers and were skipped"
            )
        return super().finish()


def _recognise(text: str, path: Path) -> float:
    """Printed dicts with the Trainer's keys (``{'loss': ...``): above a CSV (each dict
    line holds as many commas) and the key/value reader."""
    if "{'" not in text and "{ '" not in text:
        return 0.0
    found = 0
    for line in text.splitlines():
        if "{" not in line or not any(k in line for k in _LOG_KEYS):
            continue
        pairs = log_dict(ANSI.sub("", line) if "\x1b" in line else line)
        if pairs is not None and any(resolve(k) is not None for k in pairs):
            found += 1
            if found >= 2:
                return 0.9
    return 0.6 if found else 0.0


FORMAT = LogFormat(
    name="hf_console",
    title="a Hugging Face Trainer's console output",
    looks_for="printed log dicts: {'loss': 2.1, 'grad_norm': 1.3, 'learning_rate': 5e-05, "
    "'epoch': 0.1}",
    parser=lambda path, mapping: ConsoleParser(str(path), mapping),
    recognise_text=_recognise,
    framework="hf-trainer",
)
