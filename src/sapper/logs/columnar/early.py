"""A long run log's read begun before the command needs it.

``sapper analyze run.jsonl`` spends its first few tenths of a second importing the
command line, the detectors and the report code, all Python work that holds the
interpreter's lock, while polars' decoding of the log's blocks holds it hardly at all.
:func:`read_ahead`, started in a thread by the command line as soon as it sees a large
file among its arguments, reads that file into columns exactly as
:func:`~sapper.logs.columnar.runlog.read_runlog_columnar` would (it is that function),
so the imports run while polars decodes. When the pipeline reaches the file, the reader
takes the result waiting for it (:func:`claim`) instead of reading it again, provided
the file is the same (device, inode, size and modification time) and the same size
threshold applies; otherwise the early read is stopped and forgotten, and the file is
read as if nothing had happened. A read nobody takes is stopped at the next block and
dropped (:func:`discard`: at the end of the logs' loading, and at exit).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

__all__ = ["claim", "discard", "pending", "read_ahead"]

#: How long exit waits for an early read to stop (it stops at the next block).
_STOP_WAIT_S = 10.0


class _Pending:
    """One early read: the file it started on, its result or error once ``done``."""

    def __init__(self, stamp: tuple[int, ...], min_bytes: int) -> None:
        self.stamp = stamp
        self.min_bytes = min_bytes
        self.stop = threading.Event()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def wait(self) -> Any:
        """The read's result, or its exception raised here."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


_lock = threading.Lock()
_pending: dict[str, _Pending] = {}


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _stamp(path: str | os.PathLike[str]) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_ahead(path: str, ready: threading.Event) -> None:
    """Read ``path`` into columns for a later :func:`claim` when it is a sapper run log
    the columnar reader takes (its detected format, its size); ``ready`` is set once the
    read is registered and polars is decoding its first blocks (or the read is turned
    down, or over): this thread's imports and the read's start are Python work that
    holds the interpreter's lock, and the caller's own imports waited for it while they
    raced it (the decoding began a few tenths of a second later). Runs in the caller's
    thread; never raises."""
    entry: _Pending | None = None
    try:
        from sapper.logs import detect_format
        from sapper.logs.columnar import runlog

        stamp = _stamp(path)
        if stamp[2] >= max(1, runlog.MIN_BYTES) and detect_format(path) == "sapper":
            entry = _Pending(stamp, runlog.MIN_BYTES)
            with _lock:
                _pending[_key(path)] = entry
    except Exception:  # the pipeline reads the file and says what is wrong with it
        entry = None
    finally:
        if entry is None:
            ready.set()
    if entry is None:
        return
    try:
        entry.result = runlog.read_runlog_columnar(
            path, min_bytes=entry.min_bytes, stop=entry.stop, started=ready
        )
    except BaseException as exc:  # handed to the claimant, as a plain read raises it
        entry.error = exc
    finally:
        ready.set()
        entry.done.set()


def claim(path: str | os.PathLike[str], min_bytes: int) -> _Pending | None:
    """The early read of ``path`` for a reader with ``min_bytes``, taken (a second claim
    finds none); ``None`` when there is none, or it started on another file than the
    one now at ``path`` or with another threshold (then it is stopped)."""
    with _lock:
        entry = _pending.pop(_key(path), None)
    if entry is None:
        return None
    try:
        same = entry.stamp == _stamp(path) and entry.min_bytes == min_bytes
    except OSError:
        same = False
    if not same:
        entry.stop.set()
        return None
    return entry


def pending() -> bool:
    """Whether an early read is in flight or waiting to be taken."""
    with _lock:
        return bool(_pending)


def discard() -> None:
    """Stop and forget every early read nobody took (their memory is let go)."""
    with _lock:
        left = list(_pending.values())
        _pending.clear()
    for entry in left:
        entry.stop.set()
    for entry in left:
        entry.done.wait(_STOP_WAIT_S)


atexit.register(discard)
