"""A poll's records go through the detectors detector by detector: the findings, their
order and a failing detector's fate must be what record-by-record updates give."""

from __future__ import annotations

import math
import random

from sapper.rules.model import Finding
from sapper.runtime.detector import Detector, DetectorSet
from sapper.runtime.records import StepRecord
from sapper.watch import watch_detectors


def _run(n: int = 600) -> list[StepRecord]:
    """A run with a loss spike, a gradient-norm storm, an LR jump and a NaN loss."""
    rng = random.Random(3)
    out = []
    for s in range(n):
        loss = 2.0 + 6.0 * math.exp(-s / 150) + rng.gauss(0, 0.01)
        norm = 0.4 + abs(rng.gauss(0, 0.02))
        lr = 3e-4 * min(1.0, s / 50)
        if 200 <= s < 204:
            loss *= 4
        if 300 <= s < 330:
            norm *= 30
        if s >= 400:
            lr = 3e-2
        if s == 500:
            loss = math.nan
        out.append(StepRecord(step=s, loss=loss, grad_norm=norm, clip_threshold=1.0, lr=lr,
                              step_time_s=0.5 + rng.gauss(0, 0.01), tokens=4096))
    return out


def _key(f: Finding) -> tuple:
    return (f.code, f.step, f.message)


def test_a_batch_gives_the_findings_of_record_by_record_updates_in_order() -> None:
    records = _run()
    for size in (1, 7, 250, len(records)):
        one = DetectorSet(watch_detectors(None))
        expected = [[_key(f) for f in one.update(r)] for r in records]
        assert sum(map(len, expected)) > 0  # the run is not quiet
        batched = DetectorSet(watch_detectors(None))
        got: list[list[tuple]] = []
        for a in range(0, len(records), size):
            found = batched.update_batch(records[a : a + size])
            got.extend([_key(f) for f in per_record] for per_record in found)
        assert got == expected, size
        # the detectors' state after the batches is the same: so is what they end with
        assert [_key(f) for f in batched.finish()] == [_key(f) for f in one.finish()], size


class _Breaks(Detector):
    """Raises at one step; counts what it saw."""

    name = "breaks"

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0

    def update(self, record: StepRecord) -> list[Finding]:
        if record.step == self.at:
            raise RuntimeError("broken")
        self.seen += 1
        return []


def test_a_detector_that_raises_in_a_batch_is_dropped_there_and_the_others_go_on() -> None:
    records = _run(120)
    broken = _Breaks(at=50)
    batched = DetectorSet([broken, *watch_detectors(None)])
    reference = DetectorSet(watch_detectors(None))
    got = batched.update_batch(records)
    want = [reference.update(r) for r in records]
    assert [[_key(f) for f in g] for g in got] == [[_key(f) for f in w] for w in want]
    assert broken.seen == 50 and "_Breaks" in batched.failed
    batched.update_batch(records[:3])  # dropped: never called again
    assert broken.seen == 50
