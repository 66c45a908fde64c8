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

__all__ = ["RunQueueClock"]

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
