"""R011 (clipping saturated) needs both a high clip rate and a large clip factor over a
window past the warmup: a norm hovering just above the threshold is not saturation."""

from __future__ import annotations

import random

from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import GradNormDetector


def _stream(norm, n: int = 200, seed: int = 0) -> list[StepRecord]:
    rng = random.Random(seed)
    return [
        StepRecord(step=s, grad_norm=norm(s, rng), clip_threshold=1.0) for s in range(n)
    ]


def _r011(records: list[StepRecord], **kw) -> list:
    return [f for f in DetectorSet([GradNormDetector(**kw)]).run(records) if f.code == "R011"]


def test_norm_just_above_the_threshold_on_every_step_is_not_saturation() -> None:
    # a healthy small model clipped at 1.0 whose norm sits at 1.03-1.2 (the updates are
    # scaled by 0.83-0.97): clipped on every step, and still no finding
    assert _r011(_stream(lambda s, rng: 1.03 + 0.17 * rng.random())) == []


def test_clipping_by_a_large_factor_on_nearly_every_step_fires() -> None:
    def norm(s: int, rng: random.Random) -> float:
        if s < 60:
            return 0.5 + 0.3 * rng.random()
        return 0.8 if s % 25 == 0 else 3.0 + 4.0 * rng.random()  # 4% of steps unclipped

    found = _r011(_stream(norm))
    # the first window with 90% clipped: 45 of its 50 steps past step 60
    assert found and 60 + 45 - 1 <= found[0].step <= 115
    assert found[0].data["median_ratio"] >= 2.0 and found[0].value >= 0.9
    assert "× the threshold" in found[0].message


def test_a_large_factor_on_half_the_steps_is_not_saturation() -> None:
    found = _r011(_stream(lambda s, rng: 5.0 if s % 2 else 0.5))
    assert found == []


def test_steps_inside_the_warmup_are_not_counted() -> None:
    # clipped hard during a 150-step warmup only, then healthy
    found = _r011(_stream(lambda s, rng: 6.0 if s < 150 else 0.5), warmup_steps=150)
    assert found == []
