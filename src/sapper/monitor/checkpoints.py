"""Scan each checkpoint right after it is saved, before it becomes the resume point.

A NaN saved at step N is restored into every later attempt; a loss scale saved at its
floor starts the resumed run where the last one broke. ``Monitor(inspect_on_save=True)``
(and the HF callback, which tells it at every ``on_save``) reads the new checkpoint with
``sapper inspect`` on a daemon thread — the training loop does not wait — and keeps only
what makes the checkpoint unfit to resume from: non-finite values (K001), a collapsed
loss scale (K006), values at the dtype's limit (K011). The findings reach the monitor's
outputs at its next step, from the training thread; ``close()`` waits a bounded time for
a scan still running, so what it found is on disk.
"""

from __future__ import annotations

import threading
from pathlib import Path

from sapper.rules.model import Finding

__all__ = ["CheckpointWatch"]

#: The findings that make a checkpoint unfit to resume from.
UNFIT = frozenset({"K001", "K006", "K011"})
#: How long ``close()`` waits for scans still running.
CLOSE_WAIT_S = 120.0


class CheckpointWatch:
    """Background scans of saved checkpoints; results are taken on the training thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: list[Finding] = []
        self._errors: list[str] = []
        self._threads: list[threading.Thread] = []

    def saved(self, path: str | Path, step: int) -> None:
        """A checkpoint was written at ``path`` at ``step``: scan it off this thread."""
        thread = threading.Thread(
            target=self._scan, args=(Path(path), step), name="sapper-inspect", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _scan(self, path: Path, step: int) -> None:
        try:
            from sapper.checkpoint import inspect_paths

            found = [
                f.model_copy(update={
                    "step": step,
                    "message": f"checkpoint {path} (saved at step {step:,}): {f.message}",
                })
                for f in inspect_paths([path]).findings
                if f.code in UNFIT
            ]
        except Exception as exc:  # the scan must never reach the training
            with self._lock:
                self._errors.append(f"could not inspect {path}: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._found.extend(found)

    def take(self) -> tuple[list[Finding], list[str]]:
        """What the finished scans found, and the scans that failed, once each."""
        with self._lock:
            found, self._found = self._found, []
            errors, self._errors = self._errors, []
        return found, errors

    def wait(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Let scans still running finish, at most ``timeout_s`` in all."""
        import time

        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
