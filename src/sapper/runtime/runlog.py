"""The JSONL run log: what the live monitor writes and ``sapper analyze``/``watch`` read.

One JSON object per line, ``"kind"`` first: a ``meta`` line when a writer opens the file
(``{"kind": "meta", "version": 1, "started": unix_time, "plan": {...}?, ...}``), a
``step`` line per logged step (``StepRecord.to_json``) and a ``finding`` line per finding
(``Finding.to_json``). Non-finite floats are the strings "nan", "inf", "-inf", so every
line stays valid JSON.

The writer appends (a resumed run adds a new meta line) and writes through: each call
(a meta line, a batch of steps, a finding) is one ``write`` and one flush to the
operating system, so what the monitor has read is in the file at once and survives a
``kill -9`` or an OOM kill (the OS keeps written data when the process dies; only a
machine crash can lose it, which ``fsync`` per batch would cost too much to prevent).
It never raises into training: an I/O error (a folder in the way, no permission, a full
disk) disables it, is kept in :attr:`RunLogWriter.error` and is passed once to
``on_error``. Because it appends while training runs, a crash can leave a torn last
line; the reader skips it with a note. Any other malformed line means the file is not a
run log (or was edited) and is an input error naming the line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from sapper.errors import InputError
from sapper.jsontext import dumps
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = ["RUNLOG_VERSION", "RunLog", "RunLogWriter", "read_runlog"]

RUNLOG_VERSION = 1


class RunLogWriter:
    """Appends meta, step and finding lines to a JSONL file; never raises.

    Args:
        path: the file; missing parent folders are created (as TensorBoard does).
        meta: keys of the first (meta) line.
        on_error: called once, with :attr:`error`, when the file cannot be opened or a
            write fails; the writer does nothing afterwards.

    Thread-safe: the live monitor writes from the training thread and, during a stall,
    from its background flusher.
    """

    #: Lines per ``write`` call when a long batch is written (bounds the joined text).
    CHUNK_LINES = 512

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        meta: dict[str, Any] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        #: The first I/O error, after which the writer does nothing.
        self.error: str | None = None
        self.lines = 0
        self._on_error = on_error
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            self._fail(f"cannot open {self.path}: {_reason(exc)}")
            return
        head = {"kind": "meta", "version": RUNLOG_VERSION, "started": time.time()}
        self._write(_line(obj) for obj in [{**head, **(meta or {})}])

    def _fail(self, message: str) -> None:
        self.error = message
        self._close_quietly()
        if self._on_error is not None:
            self._on_error(message)

    def _write(self, lines: Iterable[str]) -> None:
        """One ``write`` and one flush per chunk of lines: the lines are in the OS's
        hands when this returns. ``lines`` are serialised here, under the lock."""
        failure = None
        with self._lock:
            if self._file is None:
                return
            try:
                chunk: list[str] = []
                for line in lines:
                    chunk.append(line)
                    if len(chunk) >= self.CHUNK_LINES:
                        self._put(chunk)
                        chunk = []
                if chunk:
                    self._put(chunk)
                self._file.flush()
            except (OSError, ValueError, TypeError) as exc:
                failure = f"cannot write {self.path}: {_reason(exc)}"
        if failure is not None:
            self._fail(failure)

    def _put(self, lines: list[str]) -> None:
        assert self._file is not None
        self._file.write("\n".join(lines) + "\n")
        self.lines += len(lines)

    def write_step(self, record: StepRecord) -> None:
        self._write(_step_line(rec) for rec in [record])

    def write_steps(self, records: Iterable[StepRecord]) -> None:
        self._write(_step_line(rec) for rec in records)

    def write_finding(self, finding: Finding) -> None:
        self.write_findings([finding])

    def write_findings(self, findings: Iterable[Finding]) -> None:
        self._write(_line({"kind": "finding", **f.to_json()}) for f in findings)

    def flush(self) -> None:
        """Every call already flushes; kept for callers that flush explicitly."""
        failure = None
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.flush()
            except (OSError, ValueError) as exc:
                failure = f"cannot write {self.path}: {_reason(exc)}"
        if failure is not None:
            self._fail(failure)

    def _close_quietly(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._close_quietly()

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


def _line(obj: dict[str, Any]) -> str:
    return dumps(obj)


def _step_line(record: StepRecord) -> str:
    """``{"kind": "step", **record.to_json()}`` as one line, the way the monitor writes
    every read: the record's own values go straight to the C encoder, and only a record
    holding a non-finite float (rare: the steps that matter) takes the walk that spells
    them "nan"/"inf". Same text as the slow path, a fraction of its cost per record."""
    obj: dict[str, Any] = {"kind": "step"}
    for name in _STEP_FIELDS:
        value = getattr(record, name)
        if value is None or (name == "extra" and not value):
            continue
        obj[name] = value
    try:
        return json.dumps(obj, allow_nan=False, default=str)
    except ValueError:  # a NaN or an infinity somewhere
        return json.dumps({"kind": "step", **record.to_json()}, default=str)


def _reason(exc: BaseException) -> str:
    """An OS error in words (``No space left on device``), else the exception."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


@dataclass
class RunLog:
    """A run log read back: meta lines, step records, findings and reader notes."""

    path: str
    metas: list[dict[str, Any]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: What the reader skipped or noticed (a torn last line, unknown kinds).
    notes: list[str] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, Any]:
        """The first meta line (the run's start), or an empty dict."""
        return self.metas[0] if self.metas else {}


def read_runlog(path: str | os.PathLike[str]) -> RunLog:
    """Read a run log; a torn last line is skipped with a note, anything else malformed
    raises :class:`InputError` naming the line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError("run log not found", file=str(p)) from None
    except OSError as exc:
        raise InputError(f"cannot read run log ({exc.strerror})", file=str(p)) from None
    log = RunLog(path=str(p))
    lines = text.split("\n")
    torn_possible = not text.endswith("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    unknown: dict[str, int] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == last and torn_possible:
                log.notes.append(f"line {i + 1}: torn last line skipped (the run was cut)")
                continue
            raise InputError(
                "not a JSON object",
                file=str(p),
                field=f"line {i + 1}",
                value=line[:80],
                expected="one JSON object per line (a sapper run log)",
            ) from None
        _add(log, obj, i + 1, unknown, str(p))
    if not log.metas and not log.steps and not log.findings:
        if log.notes:
            return log
        raise InputError(
            "no run-log lines",
            file=str(p),
            expected='lines with "kind": "meta" / "step" / "finding"',
        )
    for kind, count in unknown.items():
        log.notes.append(f"{count} line(s) of unknown kind {kind!r} ignored")
    return log


def _add(log: RunLog, obj: dict[str, Any], lineno: int, unknown: dict[str, int], file: str) -> None:
    kind = obj.pop("kind", None)
    try:
        if kind == "step":
            if not isinstance(obj.get("step"), int):
                raise ValueError("a step line needs an integer 'step'")
            log.steps.append(StepRecord.from_json(obj))
        elif kind == "finding":
            log.findings.append(Finding.model_validate(obj))
        elif kind == "meta":
            log.metas.append(obj)
        else:
            key = str(kind)
            unknown[key] = unknown.get(key, 0) + 1
    except (ValueError, TypeError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise InputError(
            f"invalid {kind} line ({first})",
            file=file,
            field=f"line {lineno}",
            expected="a line written by sapper's RunLogWriter",
        ) from None
