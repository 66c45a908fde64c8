"""The detectors' per-record shortcuts give the findings of the full tests they skip.

``sapper watch`` and the live monitor run every record through the detectors, so the
detectors skip work a record cannot need: a record without ``extra`` (most log records)
skips the reads of the live monitor's fields, the loss oscillation test first rules a
window out by its range, the loss scaler recounts its halvings only when the window
changed them. Each test here runs the same stream with the shortcut and without it.
"""

from __future__ import annotations

import math
import random

import pytest

from sapper.runtime.detector import DetectorSet
from sapper.runtime.detectors import LossDetector, ScalerDetector, default_detectors
from sapper.runtime.detectors.scaler import _halvings_since_growth
from sapper.runtime.records import StepRecord


def _stream(seed: int, n: int = 1500) -> list[StepRecord]:
    """A run with what the detectors look for: spikes, an oscillating stretch, a NaN,
    a loss scale that halves and grows, clipping, slow steps and a memory climb."""
    rng = random.Random(seed)
    out = []
    scale = 65536.0
    for step in range(1, n + 1):
        loss = 2.0 + 6.0 * math.exp(-step / 300) + rng.gauss(0, 0.02)
        if 600 <= step < 700:  # oscillating with a large swing
            loss += 1.5 if step % 2 else -1.0
        if rng.random() < 0.01:
            loss *= rng.choice([3.0, 10.0])
        if step == 1200:
            loss = math.nan
        if rng.random() < 0.05:
            scale = scale / 2 if rng.random() < 0.7 else scale * 2
        out.append(
            StepRecord(
                step=step,
                loss=loss,
                grad_norm=abs(rng.gauss(1.0, 0.5)) * (20 if rng.random() < 0.01 else 1),
                clip_threshold=1.0,
                lr=3e-4 * min(1.0, step / 100),
                loss_scale=scale,
                skipped_total=step // 97,
                memory_allocated_gib=10 + step * 0.01,
                memory_limit_gib=40.0,
                step_time_s=0.5 * (8 if rng.random() < 0.01 else 1),
                tokens=4096,
                tokens_per_s=8192 * (0.5 if step > 1000 else 1.0),
            )
        )
    return out


def _found(detectors: list, records: list[StepRecord]) -> list[tuple[str, int | None, str]]:
    found = DetectorSet(detectors).run(records)
    return [(f.code, f.step, f.message) for f in found]


#: Every ``extra`` key a detector's shortcut looks for, each with a value that reads as
#: absent (``None``, or ``False`` for a flag): the detectors take their full paths and
#: must find what their shortcuts find.
_INERT = {
    "grad_norm_layers": None,
    "cpu_wait_s": None,
    "scheduler_steps": None,
    "scaled_grads_step": False,
    "clip_before_unscale": False,
    "loss_weight": None,
    "micro_tokens": None,
    "clip_coef": None,
    "max_position": None,
    "sample_hashes": None,
    "epoch": None,
    "nonfinite_params": None,
    "grad_sampled": None,
    "grad_zero_share": None,
}


def _with_extra(records: list[StepRecord], extra: dict[str, object]) -> list[StepRecord]:
    return [StepRecord(**{**r.__dict__, "extra": dict(extra)}) for r in records]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_no_extra_shortcuts_find_what_the_full_paths_find(seed: int) -> None:
    """An empty ``extra`` and one holding only keys no detector reads (a Megatron line's
    consumed samples) take the shortcuts; one holding every key they look for, each
    inert, takes the full paths. All three see the same run."""
    records = _stream(seed)
    bare = _found(default_detectors(), records)
    other = _found(default_detectors(), _with_extra(records, {"consumed_samples": 16.0}))
    full = _found(
        default_detectors(), _with_extra(records, {"consumed_samples": 16.0, **_INERT})
    )
    assert bare == other == full
    assert {"R001", "R002", "R004"} <= {code for code, _, _ in bare}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_oscillation_range_pretest_never_hides_a_finding(seed: int) -> None:
    """The loss detector with its range pre-test off gives the same findings."""
    rng = random.Random(seed)
    records = _stream(seed)
    for rec in records[800:1000]:  # swings of every size around levels near and far from 0
        if rec.loss is not None and math.isfinite(rec.loss):
            rec.loss = rng.choice([0.05, 0.5, 2.0]) + rng.choice([-1, 1]) * rng.random() * 0.3
    quick = LossDetector()
    slow = LossDetector()
    slow._swing_too_small = lambda: False  # type: ignore[method-assign]
    assert _found([quick], records) == _found([slow], records)
    assert any(code == "R004" for code, _, _ in _found([LossDetector()], records))


def test_the_scaler_halvings_match_a_recount_after_every_record() -> None:
    rng = random.Random(7)
    det = ScalerDetector(collapse_drops=8)
    scale = 2.0**16
    for step in range(1, 3000):
        roll = rng.random()
        if roll < 0.15:
            scale /= 2
        elif roll < 0.2:
            scale *= 2
        elif roll < 0.21:
            scale = 0.0 if scale else 1024.0
        det.update(StepRecord(step=step, loss_scale=scale))
        assert det.halvings == _halvings_since_growth(det.changes)
