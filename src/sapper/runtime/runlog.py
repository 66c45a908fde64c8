"""The JSONL run log: what the live monitor writes and ``sapper analyze``/``watch`` read.

One JSON object per line, ``"kind"`` first: a ``meta`` line when a writer opens the file
(``{"kind": "meta", "version": 1, "started": unix_time, "plan": {...}?, ...}``), a
``step`` line per logged step (``StepRecord.to_json``) and a ``finding`` line per finding
(``Finding.to_json``). Non-finite floats are the strings "nan", "inf", "-inf", so every
line stays valid JSON.

The writer appends (a resumed run adds a new meta line), flushes every ``flush_every``
seconds and on findings, and never raises into training: an I/O error disables it and is
kept in :attr:`RunLogWriter.error`. Because it appends while training runs, a crash can
leave a torn last line; the reader skips it with a note. Any other malformed line means
the file is not a run log (or was edited) and is an input error naming the line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from sapper.errors import InputError
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord, _json_safe

__all__ = ["RUNLOG_VERSION", "RunLog", "RunLogWriter", "read_runlog"]

RUNLOG_VERSION = 1


class RunLogWriter:
    """Appends meta, step and finding lines to a JSONL file; never raises."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        meta: dict[str, Any] | None = None,
        flush_every: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self.flush_every = flush_every
        #: The first I/O error, after which the writer does nothing.
        self.error: str | None = None
        self.lines = 0
        self._file: IO[str] | None = None
        self._last_flush = time.monotonic()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            self.error = f"cannot open {self.path}: {exc}"
            return
        head = {"kind": "meta", "version": RUNLOG_VERSION, "started": time.time()}
        self._write({**head, **(meta or {})}, flush=True)

    def _write(self, obj: dict[str, Any], *, flush: bool = False) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(_json_safe(obj), default=str) + "\n")
            self.lines += 1
            now = time.monotonic()
            if flush or now - self._last_flush >= self.flush_every:
                self._file.flush()
                self._last_flush = now
        except (OSError, ValueError, TypeError) as exc:
            self.error = f"cannot write {self.path}: {exc}"
            self._close_quietly()

    def write_step(self, record: StepRecord) -> None:
        self._write({"kind": "step", **record.to_json()})

    def write_steps(self, records: Iterable[StepRecord]) -> None:
        for rec in records:
            self.write_step(rec)

    def write_finding(self, finding: Finding) -> None:
        """Findings are rare and matter after a crash: flushed at once."""
        self._write({"kind": "finding", **finding.to_json()}, flush=True)

    def flush(self) -> None:
        if self._file is None:
            return
        try:
            self._file.flush()
            self._last_flush = time.monotonic()
        except OSError as exc:
            self.error = f"cannot write {self.path}: {exc}"
            self._close_quietly()

    def _close_quietly(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        self.flush()
        self._close_quietly()

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
