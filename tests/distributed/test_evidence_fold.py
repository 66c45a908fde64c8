"""X001's per-rank window peak: values are kept per event and folded once per window;
the fold must say what an event-by-event reading would (largest value before the first
non-finite event, and where each was), also when the kept values overflow into the
carried result."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sapper.distributed.evidence import WindowPeak


def _expected(values: list[float], first_step: int, steps: int) -> dict[str, float]:
    """The window's numbers, read one event at a time on the host."""
    peak, peak_at, first_bad = 0.0, 0, -1
    for i, v in enumerate(values):
        if not math.isfinite(v):
            first_bad = i
            break
        if i == 0 or v > peak:
            peak, peak_at = v, i
    per = max(steps, 1) / len(values)
    return {
        "peak": peak,
        "peak_step": first_step + math.floor(peak_at * per),
        "nonfinite_step": -1.0 if first_bad < 0 else first_step + math.floor(first_bad * per),
    }


@pytest.mark.parametrize("keep", [1, 3, 1024])
def test_the_window_fold_matches_an_event_by_event_reading(keep: int) -> None:
    rng = random.Random(keep)
    for _ in range(60):
        values = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            values.append(
                math.nan if r < 0.05 else math.inf if r < 0.08 else rng.choice([rng.random(), 2.0])
            )
        values = torch.tensor(values).tolist()  # the float32 values the device holds
        peak = WindowPeak()
        peak.KEEP = keep
        for v in values:
            peak.add(torch.tensor(v))
        first, steps = rng.randint(0, 50), rng.randint(1, 8)
        got = {k: float(t) for k, t in peak.take(first, steps).items()}
        assert got == _expected(values, first, steps), (values, keep)


def test_an_event_keeps_its_value_without_running_a_kernel() -> None:
    # the per-step cost is a list append: nothing is computed until take()
    peak = WindowPeak()
    v = torch.tensor(3.0)
    peak.add(v)
    assert peak.peak is None and peak.events == 1
    assert float(peak.take(10, 1)["peak"]) == 3.0
    assert peak.take(11, 1) == {}  # a new, empty window
