"""Hugging Face Trainer ``trainer_state.json``: the ``log_history`` list.

The Trainer rewrites the whole file at every checkpoint save, so it is a snapshot, not
an append-only stream: :meth:`TrainerStateParser.parse` takes the full text and returns
only the steps it has not returned before (``sapper watch`` calls it each time the file
changes); a snapshot whose history parts from the one returned (the run resumed from an
earlier checkpoint) starts a new attempt. ``eval_<name>_loss`` keys (a dict of eval
datasets) become ``extra["eval_losses"]``, per-layer gradient norms
``extra["grad_norm_layers"]``. Entries are
``{"loss", "grad_norm", "learning_rate", "epoch", "step"}`` every
``logging_steps``, ``{"eval_loss", "eval_runtime", ..., "step"}`` every ``eval_steps``
(merged into the same step), and one closing summary (``train_runtime``, the average
``train_loss``) that is not a step and is kept in ``meta``. Python's ``json`` writes a
NaN grad norm as ``NaN`` and the reader here accepts it. A file cut short (copied while
the Trainer was writing it) still yields every complete entry, with a note.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.errors import InputError, quote
from sapper.logs.base import (
    Attempt,
    AttemptTracker,
    LogParser,
    StepMerger,
    put_mapped,
    to_float,
)
from sapper.logs.fields import LAYER_KEYS, FieldMap, eval_set, layer_of, normalize_name
from sapper.logs.formats import LogFormat, first_line, first_object
from sapper.logs.limits import MAX_COUNT, MAX_NESTING, json_int
from sapper.runtime.records import StepRecord

__all__ = ["FORMAT", "TrainerStateParser", "latest_state", "state_runs"]

_TRAIN_KEYS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "eval_loss": "eval_loss",
}
_SUMMARY_KEYS = ("train_runtime", "train_loss", "total_flos")
#: Broken places in a damaged file read past before giving up on the rest.
MAX_RESYNCS = 10_000
_META_KEYS = (
    "global_step",
    "max_steps",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "num_train_epochs",
    "train_batch_size",
    "best_metric",
    "best_model_checkpoint",
)


class TrainerStateParser(LogParser):
    """Parser of ``trainer_state.json`` snapshots."""

    format = "trainer_state"

    def __init__(
        self, source: str = "trainer_state.json", mapping: dict[str, FieldMap] | None = None
    ) -> None:
        super().__init__(source, mapping)
        #: (step, loss, grad norm) of every record returned so far, to tell the part of a
        #: new snapshot already returned from what is new, or from a resumed run's history.
        self._returned: list[tuple[int, str, str]] = []
        self._tracker = AttemptTracker()
        self._text: list[str] = []
        self._stepless = self._bad_values = 0
        self._first_stepless = ""

    @property
    def attempts(self) -> list[Attempt]:
        return self._tracker.attempts

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        """Collect text; the document is parsed by :meth:`finish` (it is one JSON value)."""
        self._text.extend(lines)
        return []

    def finish(self) -> list[StepRecord]:
        text, self._text = "\n".join(self._text), []
        records = self.parse(text)
        self.note_unused_mapping()
        return records

    def parse(self, text: str) -> list[StepRecord]:
        """The steps of this snapshot not returned by an earlier call.

        A snapshot normally extends the previous one. When it does not (the run resumed
        from an earlier checkpoint, whose history it carries, and logged those steps
        again), what follows the common part is a new attempt."""
        notes: list[str] = []  # each snapshot is read whole: keep each note once
        merger = StepMerger(notes)
        self._stepless = self._bad_values = 0
        for entry in self._entries(text):
            self._entry(merger, entry)
        if self._stepless:
            notes.append(
                f"{self._stepless} log_history entr{'y' if self._stepless == 1 else 'ies'} "
                f"without an integer step in 0 … 2^63-1 skipped (the first: "
                f"{self._first_stepless})"
            )
        if self._bad_values:
            notes.append(
                f"{self._bad_values} loss, grad_norm, learning_rate or eval_loss value(s) were "
                "not numbers and were skipped"
            )
        records = merger.flush()
        self.notes.extend(n for n in notes if n not in self.notes)
        starts = {a.start for a in merger.tracker.attempts[1:]}
        sigs = [(r.step, repr(r.loss), repr(r.grad_norm)) for r in records]
        old = self._returned
        same = 0
        for a, b in zip(old, sigs, strict=False):
            if a != b:
                break
            same += 1
        if same < len(old) and len(sigs) <= same:
            return []  # an older or shorter snapshot: nothing new
        new = records[same:]
        for i, rec in enumerate(new, start=same):
            if i in starts or (i == same and same < len(old)):
                self._tracker.restart()
            self._tracker.emitted([rec])
        self._returned = old[:same] + sigs[same:]
        return new

    def _entries(self, text: str) -> list[dict[str, Any]]:
        if not text.strip():
            raise InputError("the file is empty", file=self.source)
        try:
            doc = json.loads(text, parse_int=json_int)
        except json.JSONDecodeError as exc:
            return self._salvage(text, exc)
        except RecursionError:
            raise InputError(
                f"nested deeper than {MAX_NESTING} levels", file=self.source,
                expected="a Hugging Face Trainer state (trainer_state.json)",
            ) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("log_history"), list):
            raise InputError(
                "no log_history list",
                file=self.source,
                field="log_history",
                expected="a Hugging Face Trainer state (trainer_state.json)",
            )
        for key in _META_KEYS:
            if isinstance(doc.get(key), (int, float, str)):
                self.meta[key] = doc[key]
        entries = [e for e in doc["log_history"] if isinstance(e, dict)]
        if any(_too_deep(e) for e in entries):
            raise InputError(
                f"a log_history entry is nested deeper than {MAX_NESTING} levels",
                file=self.source, expected="log_history entries of numbers",
            )
        return entries

    def _salvage(self, text: str, exc: json.JSONDecodeError) -> list[dict[str, Any]]:
        """Entries of a truncated or damaged file: each complete entry is kept; at a
        broken one, reading resumes at the next ``{`` (entries are flat objects, so that
        is the next entry), at most MAX_RESYNCS times."""
        start = text.find('"log_history"')
        bracket = text.find("[", start) if start >= 0 else -1
        if bracket < 0:
            raise InputError(
                f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}) "
                "and no log_history found",
                file=self.source,
                expected="a Hugging Face Trainer state (trainer_state.json)",
            )
        decoder = json.JSONDecoder(parse_int=json_int)
        entries: list[dict[str, Any]] = []
        pos = bracket + 1
        damaged = 0
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                break
            try:
                entry, end = decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
                entry, end = None, -1
            if end < 0 or _too_deep(entry):
                nxt = text.find("{", pos + 1)
                if nxt < 0 or damaged >= MAX_RESYNCS:
                    break
                damaged += 1
                pos = nxt
                continue
            pos = end
            if isinstance(entry, dict):
                entries.append(entry)
        line = text.count("\n", 0, pos) + 1
        skipped = f", {damaged} damaged part(s) skipped" if damaged else ""
        self.notes.append(
            f"not valid JSON ({exc.msg} at line {exc.lineno}); the file looks truncated or "
            f"damaged: read {len(entries)} log_history entr{'y' if len(entries) == 1 else 'ies'}"
            f" up to line {line}{skipped}"
        )
        return entries

    def _entry(self, merger: StepMerger, entry: dict[str, Any]) -> None:
        step = entry.get("step")
        if step.__class__ is not int or not 0 <= step <= MAX_COUNT:
            self._stepless += 1
            if self._stepless == 1:
                self._first_stepless = quote(entry)
            return
        if any(k in entry for k in _SUMMARY_KEYS):
            self.meta["summary"] = {k: v for k, v in entry.items() if k != "step"}
            return
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, raw in entry.items():
            if key == "step":
                continue
            value = None if raw.__class__ is bool else to_float(raw)
            if self.mapping:
                self.keys_seen.add(key)
                fm = self.mapped(key)
                if fm is not None:
                    put_mapped(fm, value, values, extra)
                    continue
            name = _TRAIN_KEYS.get(key)
            if name is None and value is not None:
                named = eval_set(key)
                layer = None if named else layer_of(key)
                if named is not None:
                    extra.setdefault("eval_losses", {})[named] = value
                    continue
                if layer is not None:
                    extra.setdefault("grad_norm_layers", {})[layer] = value
                    continue
            if normalize_name(key) in LAYER_KEYS and isinstance(raw, (list, dict)):
                extra["grad_norm_layers"] = _layers(raw)
                continue
            if name is not None:
                if value is None and raw is not None:
                    self._bad_values += 1
                values[name] = value
            elif key == "num_input_tokens_seen" and value is not None:
                extra["tokens_seen"] = value
            elif value is not None or isinstance(raw, (str, list, dict)):
                extra[key] = raw
        merger.put(step, values, extra)


def _too_deep(tree: Any) -> bool:
    """Deeper than MAX_NESTING (an iterative walk: the value came from json, which
    nests as deep as the recursion limit allows)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return False
def _layers(raw: list[Any] | dict[str, Any]) -> dict[str, float]:
    """Per-layer norms given as one list (layer ``i`` named ``layers.i``) or one dict."""
    if isinstance(raw, dict):
        items = list(raw.items())
    else:
        items = [(f"layers.{i}", v) for i, v in enumerate(raw)]
    out = {}
    for name, v in items:
        value = to_float(v)
        if value is not None:
            out[str(name)] = value
    return out


STATE_FILE = "trainer_state.json"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


def _recognise(text: str, path: Path) -> float:
    """A JSON document with ``log_history``: on one line (``json.dump`` without indent)
    it is decoded; indented, the key is looked for in the head."""
    line = first_line(text)
    if not line.startswith("{"):
        return 0.0
    obj = first_object(line)
    if obj is not None:
        return 1.0 if isinstance(obj.get("log_history"), list) else 0.0
    return 0.9 if '"log_history"' in text else 0.0


def latest_state(folder: Path) -> Path | None:
    """The ``trainer_state.json`` of an output folder: its own, else the one in its
    latest ``checkpoint-N`` folder (the Trainer writes one per save)."""
    own = folder / STATE_FILE
    if own.is_file():
        return own
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    checkpoints = sorted(
        (int(m.group(1)), p)
        for p in entries
        if (m := _CHECKPOINT.search(p.name)) and len(m.group(1)) < 19 and p.is_dir()
        and (p / STATE_FILE).is_file()
    )
    return checkpoints[-1][1] / STATE_FILE if checkpoints else None


def _recognise_dir(folder: Path) -> float:
    return 1.0 if latest_state(folder) is not None else 0.0


def state_runs(folder: Path) -> list[Path]:
    """One run per output folder: the state file :func:`latest_state` picks."""
    state = latest_state(folder)
    return [state] if state is not None else []


FORMAT = LogFormat(
    name="trainer_state",
    title="a Hugging Face trainer_state.json",
    looks_for="a JSON document with log_history, or an output folder with "
    "trainer_state.json or checkpoint-N/trainer_state.json",
    parser=lambda path, mapping: TrainerStateParser(str(path), mapping),
    read_mode="snapshot",
    recognise_text=_recognise,
    recognise_dir=_recognise_dir,
    runs_in=state_runs,
    framework="hf-trainer",
)
