"""Competing CPU load and slow pieces of a training loop, for the healthy-run tests and
``benchmarks/healthy_under_load.py``.

:func:`competing_load` starts busy processes next to the run, as a neighbour's jobs on a
shared machine do: ``busy`` spins on every core for the whole run, ``bursts`` spins and
pauses in turns (dips that recover, staggered across processes). The processes are
separate interpreters (``subprocess``), so nothing of the test's torch state is forked,
and they are ended by their own ids when the block exits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import torch
from tinytrain import Markov
from torch import nn

__all__ = ["LOADS", "ComputeStall", "SlowMarkov", "competing_load"]

_SPIN = """
import sys, time
on, off, phase = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
time.sleep(phase)
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < on:
        pass
    if off > 0:
        time.sleep(off)
"""

#: load name -> (seconds busy, seconds idle) per cycle of each process
LOADS: dict[str, tuple[float, float]] = {"busy": (3600.0, 0.0), "bursts": (0.4, 0.4)}


@contextlib.contextmanager
def competing_load(kind: str, procs: int | None = None) -> Iterator[list[int]]:
    """``procs`` (default: one per core) busy processes of ``kind`` ("idle": none) while
    the block runs; yields their process ids."""
    if kind == "idle":
        yield []
        return
    on, off = LOADS[kind]
    n = procs if procs is not None else os.cpu_count() or 1
    started = [
        subprocess.Popen(
            [sys.executable, "-c", _SPIN, str(on), str(off), str((on + off) * i / n)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(n)
    ]
    try:
        time.sleep(0.2)  # let them start before the run does
        yield [p.pid for p in started]
    finally:
        for p in started:
            p.kill()
        for p in started:
            p.wait()


class SlowMarkov(Markov):
    """A toy dataset that really is slow to build: every batch costs ``build_s`` of CPU
    work in the loop (tokenising on the fly), so the data wait is a large share of every
    step from the first to the last."""

    def __init__(self, build_s: float = 0.004, **kw: int) -> None:
        super().__init__(**kw)
        self.build_s = build_s

    def __next__(self) -> torch.Tensor:
        t = time.thread_time()
        while time.thread_time() - t < self.build_s:  # CPU time: contention slows it too
            pass
        return super().__next__()


class ComputeStall:
    """An ``inject`` for :func:`tinytrain.train` that makes the forward pass of the steps
    where ``when(step)`` is true ``seconds`` slower (a sleep in a forward hook: the step
    gets slower, the data wait does not, and no CPU is waited for). ``base``: a sleep in
    every step, so that a toy step's own wandering (~12 ms of compute that varies by 20%
    from one second to the next on a shared machine) is small against the step time."""

    def __init__(
        self, when: Callable[[int], bool], seconds: float = 0.01, base: float = 0.0
    ) -> None:
        self.when, self.seconds, self.base = when, seconds, base
        self.step = -1
        self.hooked = False

    def __call__(self, step: int, model: nn.Module) -> None:
        self.step = step
        if not self.hooked:
            model.register_forward_hook(self._hook)
            self.hooked = True

    def _hook(self, *args: object) -> None:
        delay = self.base + (self.seconds if self.when(self.step) else 0.0)
        if delay:
            time.sleep(delay)
