"""Each step's CPU wait with the run-queue clock read sparingly: exact per step while the
machine is busy, shared over a few steps (their total exact) while it is quiet."""

from __future__ import annotations

import sys

import pytest

from sapper.monitor.collect import StepSlot
from sapper.monitor.cpuwait import RunQueueClock, StepWaits


class _Clock(RunQueueClock):
    """A run-queue clock the test advances; counts its reads."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.reads = 0

    def read(self) -> float | None:
        self.reads += 1
        return self.now


def _step(waits: StepWaits, clock: _Clock, seconds: float, waited: float) -> StepSlot:
    clock.now += waited
    slot = StepSlot(step_time_s=seconds)
    waits.on_step(slot)
    return slot


def test_a_busy_machine_gets_each_steps_own_wait() -> None:
    clock = _Clock()
    waits = StepWaits(clock)
    waits.on_step(StepSlot())  # the first boundary
    slots = [_step(waits, clock, 0.1, w) for w in (0.02, 0.05, 0.0, 0.03)]
    assert [s.extra.get("cpu_wait_s") for s in slots][:2] == pytest.approx([0.02, 0.05])
    # a quiet step doubles the gap once: the next two steps share one read
    assert slots[2].extra["cpu_wait_s"] == 0.0 and waits.every == 2
    waits.settle()
    assert slots[3].extra["cpu_wait_s"] == pytest.approx(0.03)  # the whole 0.03 is its own
    assert waits.every == 1  # busy again: every step


def test_a_quiet_machine_reads_every_few_steps_and_the_total_stays_exact() -> None:
    clock = _Clock()
    waits = StepWaits(clock)
    waits.on_step(StepSlot())
    slots = [_step(waits, clock, 0.01 * (1 + i % 3), 1e-6) for i in range(64)]
    waits.settle()  # a read of the monitor settles what is pending
    assert waits.every == StepWaits.MAX_EVERY
    assert clock.reads < 64 // 2  # far fewer reads than steps
    total = sum(s.extra["cpu_wait_s"] for s in slots)
    assert total == pytest.approx(64e-6)
    # shared in proportion to the step times: a step twice as long got twice the wait
    window = slots[7:15]  # read after 1, 2 and 4 steps, then after these 8
    ratio = [s.extra["cpu_wait_s"] / s.step_time_s for s in window]
    assert max(ratio) == pytest.approx(min(ratio))


def test_contention_after_a_quiet_spell_goes_back_to_every_step() -> None:
    clock = _Clock()
    waits = StepWaits(clock)
    waits.on_step(StepSlot())
    for _ in range(30):
        _step(waits, clock, 0.01, 0.0)
    assert waits.every == StepWaits.MAX_EVERY
    for _ in range(StepWaits.MAX_EVERY):
        _step(waits, clock, 0.01, 0.005)  # half of every step
    assert waits.every == 1
    busy = [_step(waits, clock, 0.01, w) for w in (0.002, 0.007)]
    assert [s.extra["cpu_wait_s"] for s in busy] == pytest.approx([0.002, 0.007])


def test_the_monitors_own_work_is_left_out_and_a_wait_never_exceeds_its_step() -> None:
    clock = _Clock()
    waits = StepWaits(clock)
    waits.on_step(StepSlot())
    mark = waits.mark()
    clock.now += 0.5  # waited during the monitor's detectors, between two steps
    waits.leave_out(mark)
    slot = _step(waits, clock, 0.1, 0.01)
    assert slot.extra["cpu_wait_s"] == pytest.approx(0.01)
    slot = _step(waits, clock, 0.1, 0.3)  # more than the step: capped at its time
    assert slot.extra["cpu_wait_s"] == pytest.approx(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux schedstat")
def test_the_real_clock_reads_this_threads_delay() -> None:
    waits = StepWaits()
    waits.on_step(StepSlot())
    slot = StepSlot(step_time_s=1.0)
    waits.on_step(slot)
    waits.settle()
    assert 0.0 <= slot.extra["cpu_wait_s"] <= 1.0
    waits.close()
