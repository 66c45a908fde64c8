"""A rank's Python stacks from a ``faulthandler`` dump, and the frame that says where it is.

``faulthandler.dump_traceback(all_threads=True)`` (or ``faulthandler.register(SIGUSR1)``)
writes, per thread::

    Thread 0x00007f... (most recent call first):
      File "/path/train.py", line 83 in step

The thread that wrote the dump is marked ``Current thread``: when a watchdog thread dumps,
it is not where the rank is, so the main thread (the one whose outermost frame is not a
``threading`` bootstrap) is preferred. A file a process appended several dumps to (one per
SIGUSR1) is read for its last one: a thread seen again starts a new dump. The frame that
says where the rank is: the innermost one outside torch and the Python runtime, i.e. the
user's own code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Frame", "Stacks", "parse_stacks", "user_frame"]

#: Threads and frames read at most from one stacks file.
MAX_THREADS = 512
MAX_FRAMES = 256

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_STACK = re.compile(r"^Stack \(most recent call first\)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ",
            "<string>")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: int
    name: str

    def text(self) -> str:
        return f"{self.file}:{self.line} in {self.name}"

    @property
    def in_library(self) -> bool:
        return any(part in self.file for part in _LIBRARY)


@dataclass(frozen=True)
class Thread:
    ident: str
    current: bool
    #: Innermost first, as faulthandler writes them.
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Stacks:
    path: str
    threads: tuple[Thread, ...]

    def main(self) -> Thread | None:
        """The thread the rank's training runs on: not a threading bootstrap, and not the
        thread that wrote the dump when another one is there."""
        def started_by_threading(t: Thread) -> bool:
            return bool(t.frames) and "threading.py" in t.frames[-1].file

        ranked = sorted(self.threads, key=lambda t: (started_by_threading(t), t.current))
        return ranked[0] if ranked else None


def user_frame(frames: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame of the user's code (outside torch and the runtime); the
    innermost frame when all are library frames."""
    for f in frames:
        if not f.in_library:
            return f
    return frames[0] if frames else None


def parse_stacks(data: bytes, path: str) -> Stacks:
    """Every thread's frames in a faulthandler dump (lines that are not frames, such as
    ``Fatal Python error`` or ``<no Python frame>``, are skipped)."""
    threads: list[Thread] = []
    ident, current, frames = "", False, []  # type: ignore[var-annotated]
    started = False
    for line in data.decode("utf-8", "replace").splitlines():
        head = _THREAD.match(line) or _STACK.match(line)
        if head is not None:
            if started:
                threads.append(Thread(ident, current, tuple(frames)))
                if len(threads) >= MAX_THREADS:
                    started = False
                    break
            started, frames = True, []
            if head.re is _THREAD:
                ident, current = head.group(2), head.group(1) == "Current thread"
            else:
                ident, current = "", True
            if any(t.ident == ident for t in threads):  # a later dump appended: it wins
                threads = []
            continue
        m = _FRAME.match(line)
        if m is not None and started and len(frames) < MAX_FRAMES:
            frames.append(Frame(m.group(1)[:500], int(m.group(2)[:9]), m.group(3)[:200]))
    if started:
        threads.append(Thread(ident, current, tuple(frames)))
    return Stacks(path, tuple(threads))
