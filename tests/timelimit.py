"""A wall-clock limit for one test case: a hang is a failure, not a stuck CI run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Hang", "time_limit"]


class Hang(BaseException):
    """Raised by the alarm; a BaseException so no ``except Exception`` in sapper eats it."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    if not hasattr(signal, "setitimer"):  # not POSIX: no enforcement, the case still runs
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"a case ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
