"""What happens to a finding besides the screen: a findings file and ``--exec``.

:class:`FindingsFile` appends each finding as one JSON line in the run-log contract
(``{"kind": "finding", ...}``), flushed at once, so another tool can tail it.

:class:`ExecAction` runs the user's command for each finding at or above a severity
(``--exec 'scancel $SLURM_JOB_ID' --exec-on error``): through the shell, so variables
expand; with the finding as one JSON object on stdin and its code, severity, step and
message in ``SAPPER_*`` environment variables; one command at a time on a worker thread,
so a slow pager never delays the detectors; each bounded by ``timeout`` seconds (then
its whole process group is killed). A command that fails, hangs or cannot start is
reported as a note, never raised: the watch goes on.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sapper.errors import InputError, clip, printable
from sapper.jsontext import dumps
from sapper.rules.model import Finding, Severity
from sapper.watch.watcher import Watcher, WatchResult, WatchSink

__all__ = ["ActionRun", "ExecAction", "FindingsFile"]


class FindingsFile(WatchSink):
    """Appends findings to a JSONL file as they fire."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = None

    def start(self, watcher: Watcher) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise InputError(
                f"cannot open it for appending ({exc.strerror})",
                file=str(self.path),
                field="--findings-out",
            ) from None

    def finding(self, finding: Finding) -> None:
        if self._fh is None:
            return
        self._fh.write(dumps({"kind": "finding", **finding.to_json()}) + "\n")
        self._fh.flush()

    def end(self, result: WatchResult) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class ActionRun:
    """One run of the ``--exec`` command."""

    code: str
    step: int | None
    returncode: int | None
    seconds: float
    #: Why it failed ("exit status 3", "timed out after 60 s", "cannot start: ..."), or "".
    error: str = ""


class ExecAction(WatchSink):
    """Runs a shell command for each finding at or above ``on`` severity."""

    def __init__(
        self,
        command: str,
        on: Severity = Severity.ERROR,
        timeout: float = 60.0,
        existing: bool = False,
    ) -> None:
        if not command.strip():
            raise InputError("empty command", field="--exec",
                             expected="a shell command, e.g. 'scancel $SLURM_JOB_ID'")
        if not timeout > 0:
            raise InputError("must be positive", field="--exec-timeout", value=timeout,
                             expected="seconds a command may run before it is killed")
        self.command = command
        self.on = on
        self.timeout = timeout
        #: Run for findings already in the log when the watch started too (see
        #: :attr:`Watcher.catching_up`); off by default, so restarting a watch next to a
        #: resumed job does not cancel it for the previous attempt's NaN.
        self.existing = existing
        #: Findings at the severity that did not run the command: already in the log.
        self.skipped_existing = 0
        #: Every run so far (read after :meth:`end` for the complete list).
        self.runs: list[ActionRun] = []
        self._queue: queue.SimpleQueue[Finding | None] = queue.SimpleQueue()
        self._messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._watcher: Watcher | None = None
        self._worker = threading.Thread(target=self._work, name="sapper-watch-exec", daemon=True)

    def start(self, watcher: Watcher) -> None:
        self._watcher = watcher
        self._worker.start()

    def finding(self, finding: Finding) -> None:
        if finding.severity.rank < self.on.rank:
            return
        if not self.existing and self._watcher is not None and self._watcher.catching_up:
            self.skipped_existing += 1
            return
        self._queue.put(finding)

    def tick(self, watcher: Watcher) -> None:
        self._report()

    def end(self, result: WatchResult) -> None:
        """Wait for the commands already queued (each bounded by the timeout)."""
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()
        if self.skipped_existing:
            self._messages.put(
                f"--exec did not run for {self.skipped_existing} finding(s) already in the log "
                "when the watch started (--exec-existing runs it for them too)"
            )
        result.notes.extend(self._report())

    def _report(self) -> list[str]:
        """Failures of finished runs, as notes (on the watch loop's thread)."""
        out: list[str] = []
        while True:
            try:
                text = self._messages.get_nowait()
            except queue.Empty:
                return out
            out.append(text)
            if self._watcher is not None:
                self._watcher.note(text)

    def _work(self) -> None:
        while (finding := self._queue.get()) is not None:
            try:
                run = self._run(finding)
            except Exception as exc:  # the worker must outlive any finding
                why = f"cannot run it ({type(exc).__name__}: {printable(clip(str(exc)))})"
                run = ActionRun(finding.code, finding.step, None, 0.0, why)
            self.runs.append(run)
            if run.error:
                where = f" at step {run.step}" if run.step is not None else ""
                self._messages.put(f"--exec for {run.code}{where} failed: {run.error}")

    def _run(self, finding: Finding) -> ActionRun:
        # The finding whole, as ASCII JSON (a NUL or an escape in it is \u0000, \u001b);
        # the variables repeat its short fields, escaped and clipped: an environment
        # value cannot hold a NUL, and a shell that echoes one must not print raw escapes.
        payload = dumps(finding.to_json()) + "\n"
        env = {
            **os.environ,
            "SAPPER_CODE": _env(finding.code),
            "SAPPER_SEVERITY": finding.severity.value,
            "SAPPER_STEP": "" if finding.step is None else str(finding.step),
            "SAPPER_MESSAGE": _env(finding.message),
            "SAPPER_LOG": _env(finding.source or ""),
        }
        begin = time.monotonic()
        posix = os.name == "posix"
        try:
            proc = subprocess.Popen(
                self.command,
                shell=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=posix,
            )
        except OSError as exc:
            return ActionRun(finding.code, finding.step, None, 0.0, f"cannot start: {exc}")
        try:
            _, err = proc.communicate(payload.encode(), timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill(proc, posix)
            proc.communicate()
            return ActionRun(finding.code, finding.step, proc.returncode,
                             time.monotonic() - begin, f"timed out after {self.timeout:g} s")
        seconds = time.monotonic() - begin
        if proc.returncode != 0:
            tail = _last_line(err)
            why = f"exit status {proc.returncode}" + (f" ({tail})" if tail else "")
            return ActionRun(finding.code, finding.step, proc.returncode, seconds, why)
        return ActionRun(finding.code, finding.step, 0, seconds)


#: Longest value put in a SAPPER_* variable (the whole finding is on stdin).
_ENV_CHARS = 2000


def _env(text: str) -> str:
    return printable(clip(text, _ENV_CHARS))


def _kill(proc: subprocess.Popen[Any], posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(data: bytes | None) -> str:
    lines = (data or b"").decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else ""
