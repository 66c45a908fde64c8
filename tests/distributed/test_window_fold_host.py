"""The tracker folds a window of host numbers (the live monitor's, already read) in Python
and one of device values with tensor ops; both must give the same window."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sapper.distributed import RankTracker
from sapper.runtime.records import StepRecord


def _window(rng: random.Random) -> list[tuple[int, float, float]]:
    first = rng.randint(0, 40)
    out = []
    for i in range(rng.randint(1, 25)):
        r = rng.random()
        loss = math.nan if r < 0.1 else math.inf if r < 0.15 else rng.choice([rng.random(), 3.0])
        r = rng.random()
        norm = -math.inf if r < 0.1 else math.nan if r < 0.15 else rng.random() * 10
        out.append((first + i, loss, norm))
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_host_and_device_folds_agree(seed: int) -> None:
    rng = random.Random(seed)
    window = _window(rng)
    # float32 values, as a device would hold them
    window = [(s, float(torch.tensor(lo)), float(torch.tensor(n))) for s, lo, n in window]
    host, device = RankTracker(), RankTracker()
    host.add_records([StepRecord(step=s, loss=lo, grad_norm=n) for s, lo, n in window])
    for s, lo, n in window:
        device.observe(s, loss=torch.tensor(lo), grad_norm=torch.tensor(n))
    got_host = host._fold()
    got_device = {k: float(v) for k, v in device._fold().items()}
    assert set(got_host) == set(got_device)
    for key, value in got_host.items():
        assert isinstance(value, float)
        assert _same(value, got_device[key]), (key, value, got_device[key], window)


def test_an_empty_window_folds_to_nothing() -> None:
    assert RankTracker()._fold() == {}
