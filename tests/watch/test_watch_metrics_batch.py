"""The metric board reads a batch from its end: the same board as one record at a time."""

from __future__ import annotations

import math
import random

import pytest

from sapper.runtime.records import StepRecord
from sapper.watch.metrics import MetricBoard


def _records(seed: int, n: int) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        rec = StepRecord(step=step)
        if rng.random() < 0.8:
            rec.loss = rng.choice([rng.random(), math.nan])
        if rng.random() < 0.3:
            rec.grad_norm = rng.random()
        if rng.random() < 0.5:
            rec.memory_peak_gib = 30 + rng.random()
        if rng.random() < 0.1:
            rec.memory_limit_gib = rng.choice([0.0, 79.6, 40.0])
        if rng.random() < 0.5:
            rec.tokens_per_s = 3e5 * rng.random()
        elif rng.random() < 0.5:
            rec.samples, rec.step_time_s = 32, 0.1 + rng.random()
        out.append(rec)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("history", [1, 7, 600])
def test_batches_read_from_the_end_match_record_by_record(seed: int, history: int) -> None:
    records = _records(seed, 1500)
    one = MetricBoard(history=history)
    for rec in records:
        one.update([rec])
    batched = MetricBoard(history=history)
    rng = random.Random(seed)
    i = 0
    while i < len(records):
        size = rng.choice([1, 3, 50, 1000])
        batched.update(records[i : i + size])
        i += size
    assert (batched.records, batched.last_step) == (one.records, one.last_step)
    for a, b in zip(batched.metrics, one.metrics, strict=True):
        assert [repr(v) for v in a.values] == [repr(v) for v in b.values]
        assert (a.step, a.unit, a.limit) == (b.step, b.unit, b.limit)
    assert batched.summary() == one.summary()
