"""What the property-based (hypothesis) suites share: reproducible settings, and a
wall-clock limit per case so that a hang is a failure, not a stuck CI run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, Phase, settings

__all__ = ["Hang", "stable_settings", "time_limit"]


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


def stable_settings(examples: int, *, shrink: bool = True) -> settings:
    """Every run draws the same cases (CI is stable, a failure reproduces locally).
    ``shrink=False`` for cases drawn from a seeded ``random.Random``: shrinking them gains
    little and can take minutes; the failing case is printed as it was drawn."""
    drawn = (Phase.explicit, Phase.reuse, Phase.generate)
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        phases=tuple(Phase) if shrink else drawn,
    )
