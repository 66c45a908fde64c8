"""How long the training thread waited for a CPU: its run-queue delay.

On a shared machine a neighbour's busy processes take CPU time from the run: the
training thread is ready to run but waits in the scheduler's run queue, and every step
looks slower although the run itself did not change. Linux accounts that delay per
thread (``/proc/thread-self/schedstat``, second field, nanoseconds; kept by the
scheduler whenever CONFIG_SCHED_INFO is on, which every distribution kernel has). The
monitor reads it at each step boundary, so each record carries the part of its step time
that was another process's (``extra["cpu_wait_s"]``), and the throughput rules judge the
run's own speed (sapper.runtime.detectors.throughput).

A thread blocked on I/O, a lock or a device sync is sleeping, not waiting in the run
queue: a slow GPU, a slow disk or a ``time.sleep`` in the loader are not counted. Intra-op
worker threads are not counted either: a run on several threads under contention shows
part of the delay only. Elsewhere (macOS, Windows, a kernel without it) ``read`` returns
None and records carry no CPU wait.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

__all__ = ["RunQueueClock", "StepWaits"]

_PATH = "/proc/thread-self/schedstat"


class RunQueueClock:
    """The calling thread's cumulative run-queue delay in seconds (one ``pread`` of an
    open file, about a microsecond)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self._ok = sys.platform.startswith("linux")

    def read(self) -> float | None:
        """Seconds the calling thread has waited for a CPU since it started, or None."""
        if not self._ok:
            return None
        try:
            tid = threading.get_native_id()
            if self._fd is None or tid != self._tid:
                self.close()
                # /proc/thread-self names the thread that opens it; the fd stays bound to it
                self._fd = os.open(_PATH, os.O_RDONLY)
                self._tid = tid
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) / 1e9
        except (OSError, ValueError, IndexError):
            self._ok = False
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


class StepWaits:
    """Each step's CPU wait (``extra["cpu_wait_s"]``), with the clock read sparingly.

    A read is a ``pread`` of a proc file that the kernel formats anew: a few
    microseconds when the thread's caches are warm, tens of them right after a step's
    compute evicted them. The delay is cumulative, so one read after several steps gives
    their total exactly; it is shared over them in proportion to their step times. While
    the total stays under :attr:`QUIET_SHARE` of their time (a quiet machine, where a
    step's share of it cannot move a throughput judgement), the steps between reads
    double up to :attr:`MAX_EVERY`; a window with more wait than that goes back to a
    read every step, so contention is placed on the steps it slowed."""

    #: Most steps between reads while the machine is quiet.
    MAX_EVERY = 8
    #: A window whose wait is below this share of its time counts as quiet.
    QUIET_SHARE = 0.01

    def __init__(self, clock: RunQueueClock | None = None) -> None:
        self.clock = clock if clock is not None else RunQueueClock()
        #: Steps between reads now (1 while the machine is busy).
        self.every = 1
        self._last: float | None = None
        self._pending: list[Any] = []

    @property
    def started(self) -> bool:
        return self._last is not None

    def on_step(self, slot: Any) -> None:
        """``slot`` (a sealed step, ``step_time_s`` set unless it is the first) ended
        now; its wait is set now or at a later read."""
        if self._last is None:
            self._last = self.clock.read()  # the first boundary: where waits start
            return
        if slot.step_time_s:
            self._pending.append(slot)
        if len(self._pending) >= self.every:
            self.settle()

    def settle(self) -> None:
        """Read the clock now and share the wait since the last read over the steps
        that ended since (before their records are built)."""
        if self._last is None:
            return
        waited = self.clock.read()
        pending, self._pending = self._pending, []
        if waited is None:
            self._last = None
            return
        delta, self._last = max(0.0, waited - self._last), waited
        total = sum(s.step_time_s for s in pending)
        if total <= 0:
            return
        for s in pending:
            s.extra["cpu_wait_s"] = min(s.step_time_s, delta * s.step_time_s / total)
        quiet = delta < self.QUIET_SHARE * total
        self.every = min(self.MAX_EVERY, 2 * self.every) if quiet else 1

    def mark(self) -> float | None:
        """The clock now, to leave out what is waited from here to :meth:`leave_out`."""
        return self.clock.read() if self._last is not None else None

    def leave_out(self, mark: float | None) -> None:
        """What was waited since ``mark`` (during the monitor's own work) belongs to no
        step: the next steps' wait starts that much later."""
        if mark is None or self._last is None:
            return
        now = self.clock.read()
        if now is not None:
            self._last += max(0.0, now - mark)

    def close(self) -> None:
        self.clock.close()
