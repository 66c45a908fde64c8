"""Run a launch command unchanged and watch it from outside.

The command gets the same argv, working directory and stdin, and its environment plus
sapper's variables. It runs in a process group of its own, so that SIGINT and SIGTERM
that reach sapper (Ctrl-C, ``scancel``) are forwarded to every process of the job, as
the terminal would have sent them without sapper. Its stdout and stderr are copied as
they come to sapper's own and to ``console.log`` (up to :data:`CONSOLE_LIMIT` bytes;
torchrun's ``[rank0]:`` prefixes are kept as the launcher writes them). The program's
exit code becomes sapper's; a death by signal N is 128+N, as a shell reports it.

The hang watch reads the run logs the monitor writes under ``logs/``: once a step has
been logged, no new step on any rank for ``hang_after`` seconds is a hang. sapper then
asks every rank for its stacks and flight-recorder dump (the trigger file the bootstrap
polls for), sends SIGUSR1 (which the bootstrap registers with faulthandler) to the
training processes whose stacks did not come, and ends the job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sapper.runtime.rundir import DUMP_TRIGGER

__all__ = ["CONSOLE_LIMIT", "Outcome", "StepWatch", "Supervisor", "exit_status",
           "group_members"]

#: console.log stops growing past this (a note says so); the terminal still gets all.
CONSOLE_LIMIT = 256 << 20
#: Bytes read from the end of a run log to find its last step.
_TAIL = 64 << 10


def exit_status(returncode: int) -> int:
    """A shell's view of a child's end: its code, or 128+N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Outcome:
    """How the supervised command ended."""

    exit_code: int
    #: ok, failed, hung or interrupted.
    outcome: str
    started: float
    ended: float
    #: Seconds without step progress when the hang was called.
    stalled_s: float | None = None
    #: Each rank's log -> its last step when the hang was called.
    last_steps: dict[str, int] = field(default_factory=dict)
    #: Signals forwarded to the job, by name.
    forwarded: list[str] = field(default_factory=list)


class StepWatch:
    """The last logged step of every run log in a folder, and when any of them last
    moved. Reads only the tail of a file whose size changed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sizes: dict[Path, int] = {}
        self.steps: dict[Path, int] = {}
        self.last_progress: float | None = None

    def poll(self, now: float | None = None) -> bool:
        """Look once; True when a step moved (or a log showed its first step)."""
        now = time.monotonic() if now is None else now
        moved = False
        try:
            files = sorted(self.folder.glob("*.jsonl"))
        except OSError:
            return False
        for path in files:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if self.sizes.get(path) == size:
                continue
            self.sizes[path] = size
            step = _last_step(path, size)
            if step is not None and step != self.steps.get(path):
                self.steps[path] = step
                moved = True
        if moved:
            self.last_progress = now
        return moved

    def stalled(self, now: float | None = None) -> float | None:
        """Seconds since the last step moved; None before any step was logged."""
        if self.last_progress is None:
            return None
        return (time.monotonic() if now is None else now) - self.last_progress


def _last_step(path: Path, size: int) -> int | None:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, size - _TAIL))
            tail = fh.read(_TAIL)
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if b'"step"' not in line or b'"kind"' not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a torn last line, or the first partial line of the tail
        if isinstance(doc, dict) and doc.get("kind") == "step" and isinstance(
            doc.get("step"), int
        ):
            return doc["step"]
    return None


_STACK_FILE = re.compile(r"^rank\d+-(\d+)\.txt$")


def _silent_ranks(folder: Path, pgid: int | None) -> list[int]:
    """The pids whose stack file (``rank{R}-{pid}.txt``, created empty by the bootstrap
    when it registers faulthandler for SIGUSR1) is still empty, alive in the job's
    process group."""
    if pgid is None:
        return []
    members = set(group_members(pgid))
    pids = []
    try:
        files = list(folder.glob("rank*-*.txt"))
    except OSError:
        return []
    for path in files:
        m = _STACK_FILE.match(path.name)
        try:
            if m is None or path.stat().st_size > 0:
                continue
        except OSError:
            continue
        pid = int(m.group(1))
        if pid in members:
            pids.append(pid)
    return sorted(pids)


def group_members(pgid: int) -> list[int]:
    """The processes of a process group (Linux /proc); empty where it cannot be read."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                members.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return members


class Supervisor:
    """One supervised command; :meth:`run` returns its :class:`Outcome`."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        run_dir: Path,
        hang_after: float | None,
        dump_wait: float = 5.0,
        grace: float = 10.0,
        on_hang: Callable[[float], None] | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        console_name: str = "console.log",
    ) -> None:
        self.argv, self.env, self.cwd, self.run_dir = argv, env, cwd, run_dir
        self.hang_after, self.dump_wait, self.grace = hang_after, dump_wait, grace
        self.on_hang = on_hang
        self.console_name = console_name
        self.out = stdout if stdout is not None else sys.stdout.buffer
        self.err = stderr if stderr is not None else sys.stderr.buffer
        self.proc: subprocess.Popen[bytes] | None = None
        self.forwarded: list[str] = []
        self.hung: tuple[float, dict[str, int]] | None = None
        self._done = threading.Event()
        self._log_lock = threading.Lock()
        self._log: IO[bytes] | None = None
        self._logged = 0

    # ---- console ---------------------------------------------------------------------
    def _copy(self, pipe: IO[bytes], sink: IO[bytes]) -> None:
        """One stream of the job: to sapper's own stream as it comes, and to console.log
        in whole lines, so that stdout and stderr (and the ranks writing to them) do not
        tear each other's lines there; a line longer than a read goes as it is."""
        fd = pipe.fileno()
        partial = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass  # sapper's own terminal went away: the job and its log go on
            partial += chunk
            end = partial.rfind(b"\n") + 1
            if end == 0 and len(partial) < 65536:
                continue
            cut = end or len(partial)
            self._to_log(partial[:cut])
            partial = partial[cut:]
        if partial:
            self._to_log(partial)

    def _to_log(self, chunk: bytes) -> None:
        with self._log_lock:
            if self._log is None:
                return
            room = CONSOLE_LIMIT - self._logged
            try:
                if len(chunk) <= room:
                    self._log.write(chunk)
                    self._logged += len(chunk)
                else:
                    self._log.write(chunk[:room])
                    self._log.write(
                        f"\n[sapper: console.log stops at {CONSOLE_LIMIT >> 20} MiB; "
                        "the terminal got the rest]\n".encode()
                    )
                    self._log.close()
                    self._log = None
                    return
                self._log.flush()
            except OSError:
                self._log = None

    # ---- signals ---------------------------------------------------------------------
    def _forward(self, signum: int, _frame: object) -> None:
        self.forwarded.append(signal.Signals(signum).name)
        self._signal_group(signum)

    def _signal_group(self, signum: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    # ---- the hang watch ----------------------------------------------------------------
    def _watch(self) -> None:
        assert self.hang_after is not None
        watch = StepWatch(self.run_dir / "logs")
        period = max(0.2, min(2.0, self.hang_after / 10))
        while not self._done.wait(period):
            watch.poll()
            stalled = watch.stalled()
            if stalled is None or stalled < self.hang_after:
                continue
            steps = {p.name: s for p, s in watch.steps.items()}
            self.hung = (stalled, steps)
            if self.on_hang is not None:
                try:
                    self.on_hang(stalled)
                except Exception:  # a message that cannot print must not keep the job
                    pass
            self._collect_and_end()
            return

    def _collect_and_end(self) -> None:
        """Ask every rank for its stacks and flight-recorder dump, then end the job."""
        trigger = self.run_dir / DUMP_TRIGGER
        try:
            trigger.write_text(f"{time.time():.3f}\n")
        except OSError:
            pass
        if self._done.wait(self.dump_wait):
            return
        silent = _silent_ranks(self.run_dir / "stacks", self.proc.pid if self.proc else None)
        if silent:
            # Ranks that did not answer the trigger (a main thread stuck in C holding the
            # GIL keeps the bootstrap's thread from running): faulthandler's SIGUSR1
            # handler writes from the signal itself. Only to the pids the bootstrap named
            # by their stack file: any other process (a launcher, a worker) would die of
            # a SIGUSR1 it does not handle.
            for pid in silent:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except (ProcessLookupError, PermissionError):
                    pass
            if self._done.wait(min(2.0, self.dump_wait)):
                return
        self._end_job()

    def _end_job(self) -> None:
        self._signal_group(signal.SIGTERM)
        if self._done.wait(self.grace):
            return
        self._signal_group(signal.SIGKILL)

    # ---- the run ---------------------------------------------------------------------
    def run(self) -> Outcome:
        started = time.time()
        try:
            self._log = (self.run_dir / self.console_name).open("ab")
        except OSError:
            self._log = None
        handlers = {}
        in_main = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise FileNotFoundError(exc.errno, exc.strerror, self.argv[0]) from None
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                handlers[sig] = signal.signal(sig, self._forward)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        copiers = [
            threading.Thread(target=self._copy, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._copy, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in copiers:
            t.start()
        watcher = None
        if self.hang_after is not None and self.hang_after > 0:
            watcher = threading.Thread(target=self._watch, daemon=True)
            watcher.start()
        try:
            returncode = self.proc.wait()
            # A child that left the group's pipes open (a daemon) must not hold sapper.
            for t in copiers:
                t.join(timeout=5.0)
        finally:
            self._done.set()
            if watcher is not None:
                watcher.join(timeout=5.0)
            for sig, old in handlers.items():
                signal.signal(sig, old)
            self._close_log()
        code = exit_status(returncode)
        if self.hung is not None:
            outcome = "hung"
        elif self.forwarded:
            outcome = "interrupted" if code != 0 else "ok"
        else:
            outcome = "ok" if code == 0 else "failed"
        result = Outcome(code, outcome, started, time.time(), forwarded=list(self.forwarded))
        if self.hung is not None:
            result.stalled_s, result.last_steps = self.hung
        return result

    def _close_log(self) -> None:
        with self._log_lock:
            if self._log is not None:
                try:
                    self._log.close()
                except OSError:
                    pass
                self._log = None
