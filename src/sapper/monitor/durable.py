"""Keeping the run log whole when the process ends badly: atexit, SIGTERM/SIGINT and a
background flusher for stalls.

What a run log needs most are the records just before the end: the steps before an OOM
kill, a hang, a ``kill -9``. The monitor reads its device values into records every
``log_every`` steps *or* every ``flush_every_s`` seconds (0.5 by default), whichever
comes first, and the run log writes each batch through to the operating system at once
(:class:`sapper.runtime.runlog.RunLogWriter`). Three more paths cover the ends a loop
does not see:

* **atexit** closes every monitor still open (a script that never calls ``close()``).
  The registration holds the monitor through a weak reference, so it keeps nothing
  alive; ``close()`` removes it.
* **SIGTERM / SIGINT** (what ``torchrun``, Slurm and Ctrl-C send): the handler reads
  what is pending and writes it, then hands the signal to the handler that was there
  before (the default one terminates, ``default_int_handler`` raises KeyboardInterrupt,
  a user's or torchelastic's own handler runs as it would have). It is installed once,
  from the main thread, only over the default handlers or Python callables (a signal
  set to be ignored stays ignored), and removed when the last monitor closes if it is
  still the one installed. A signal that arrives while the monitor itself is mid-read
  is held until that read ends, so no half-built state is written. On an accelerator the
  handler reads the device values only once the device's stream is idle (waiting at most
  ``EXIT_WAIT_S``): a device that hangs cannot block the process's exit.
* **A stall** (the loop stops calling ``step()``: a deadlock, a hung data loader, a
  debugger): a daemon thread writes the records that are complete but not yet read,
  at most ``STALL_S`` + ``PERIOD_S`` after the last ``step()``. It never touches CUDA:
  it runs only for monitors whose values live on the CPU, where reading them is a plain
  memory read. On an accelerator the steps since the last read stay on the device
  during a hang (at most ``flush_every_s`` of them); they reach the log when the loop
  resumes, at close, or at SIGTERM if the device is idle.

``kill -9`` cannot be caught: it loses what was not yet read, at most ``flush_every_s``
seconds of steps (or ``log_every`` steps, if those are quicker).
"""

from __future__ import annotations

import atexit
import signal
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import torch

__all__ = [
    "EXIT_WAIT_S",
    "PERIOD_S",
    "STALL_S",
    "Durable",
    "attach",
    "device_idle",
    "pending",
    "redeliver",
]


class Durable(Protocol):
    """What the exit paths need of a monitor (:class:`sapper.monitor.Monitor` is one):
    said here rather than imported, since the monitor imports this module to attach
    itself."""

    device: torch.device
    #: The cross-rank bridge, or None in a single process (the flusher runs only then).
    dist: object | None
    flush_every_s: float | None
    _closed: bool
    #: Reads in progress, and the thread doing them (a signal during one is held).
    _busy: int
    _owner: int | None

    def close(self) -> object: ...

    def _flush_stalled(self, stall_s: float) -> None: ...

    def _flush_for_exit(self, *, final: bool) -> None: ...

#: The flusher's wake-up period, and how long ``step()`` must have been silent before it
#: writes what is complete: records reach the disk at most ~0.75 s after a stall begins.
PERIOD_S = 0.25
STALL_S = 0.5
#: Longest wait for an accelerator's queued work to end before an exit flush reads it.
EXIT_WAIT_S = 2.0

_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), signal.SIGINT) if s is not None)

_live: weakref.WeakSet[Durable] = weakref.WeakSet()
#: Signal number -> the handler that was there before sapper's.
_previous: dict[int, Any] = {}
#: A signal held while a monitor was mid-read on the main thread: (signum, frame, the
#: handler to chain to, kept in case the handlers are restored before it is handled).
_held: list[tuple[int, FrameType | None, Any]] = []
_state = threading.RLock()  # re-entrant: a signal may close a monitor mid-attach


def pending() -> bool:
    """A signal arrived during a read and waits to be handled (checked after each
    ``step()``; one list test)."""
    return bool(_held)


def attach(mon: Durable) -> Callable[[], None]:
    """Register ``mon`` for the exit paths; returns the function that unregisters it."""
    ref = weakref.ref(mon)

    def at_exit() -> None:
        m = ref()
        if m is not None:
            try:
                m.close()
            except Exception:  # the interpreter is going down; never a traceback here
                pass

    atexit.register(at_exit)
    with _state:
        _live.add(mon)
        _install()
    stop = threading.Event()
    if mon.device.type == "cpu" and mon.dist is None and mon.flush_every_s is not None:
        threading.Thread(
            target=_flusher, args=(ref, stop), name="sapper-monitor-flusher", daemon=True
        ).start()

    def detach_this() -> None:
        stop.set()
        atexit.unregister(at_exit)
        with _state:
            m = ref()  # the monitor holds this function: a strong reference would cycle
            if m is not None:
                _live.discard(m)
            if not _live:
                _uninstall()

    return detach_this


def _flusher(ref: weakref.ref[Durable], stop: threading.Event) -> None:
    while not stop.wait(PERIOD_S):
        mon = ref()
        if mon is None or mon._closed:
            return
        mon._flush_stalled(STALL_S)
        del mon  # hold no reference while asleep


# ---- signals ------------------------------------------------------------------------
def _install() -> None:
    if _previous or threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        try:
            prev = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if prev is signal.SIG_IGN or prev is _on_signal:
            continue  # ignored on purpose: leave it so
        if not (prev in (signal.SIG_DFL, None) or callable(prev)):
            continue
        try:
            signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not allowed here (an embedded interpreter)
            continue
        _previous[sig] = prev


def _uninstall() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, prev in list(_previous.items()):
        try:
            if signal.getsignal(sig) is _on_signal:  # nobody installed theirs over ours
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        del _previous[sig]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _handle(signum, frame, _previous.get(signum, signal.SIG_DFL))


def _handle(signum: int, frame: FrameType | None, prev: Any) -> None:
    me = threading.get_ident()
    # The default SIGTERM ends the process now: close the monitors (final findings,
    # files closed). Any other handler may keep the run going: only write what is read.
    final = prev in (signal.SIG_DFL, None)
    for mon in list(_live):
        if mon._busy and mon._owner == me:  # interrupted mid-read: finish it first
            _held.append((signum, frame, prev))
            return
    for mon in list(_live):
        mon._flush_for_exit(final=final)
    _chain(signum, frame, prev)
    if _held:  # a second signal came during this one's flush
        redeliver()


def redeliver() -> None:
    """Handle a signal held during a read, now that the read is over."""
    while _held:
        signum, frame, prev = _held.pop(0)
        _handle(signum, frame, prev)


def _chain(signum: int, frame: FrameType | None, prev: Any) -> None:
    if callable(prev):
        prev(signum, frame)
        return
    if prev is signal.SIG_IGN:
        return
    # The default action (terminate): restore it and deliver the signal again, so the
    # process ends as it would have without sapper (exit status -signum).
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


# ---- devices --------------------------------------------------------------------------
def device_idle(devices: set[torch.device], timeout: float = EXIT_WAIT_S) -> bool:
    """Whether reading values on ``devices`` cannot block: CPU ones always; an
    accelerator's once its current stream has no queued work (polled up to ``timeout``)."""
    accel = [d for d in devices if d.type == "cuda"]
    if any(d.type not in ("cpu", "cuda") for d in devices):
        return False  # mps/xla: no cheap "is it done" query
    deadline = time.monotonic() + timeout
    for d in accel:
        stream = torch.cuda.current_stream(d)
        while not stream.query():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    return True
