"""The loss-scaling twin (``sapper.logs.columnar.twins.scaler``) against the streaming
ScalerDetector: the same findings and "not evaluated" lines on fp16-like streams (a
scale that holds, halves and grows back, skips counted per record or as a running
total, NaN counts, gradient norms of the order of the scale, extras, gaps), with the
detector's options and every framework."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapper.logs.columnar import columns_from_records
from sapper.logs.columnar.twins.engine import run_columns, twin_for
from sapper.runtime.detector import FRAMEWORKS, DetectorSet
from sapper.runtime.detectors.scaler import ScalerDetector
from sapper.runtime.records import StepRecord


def _stream(seed: int, n: int) -> list[StepRecord]:
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.choice([1, 1, 1, 2, 10, 300], size=n)) + int(rng.integers(0, 150))
    overflow = rng.choice([0.0, 0.002, 0.02, 0.3])
    floor_run = rng.random() < 0.3
    scale = float(2.0 ** rng.integers(-6, 20))  # below 1: an excerpt inside a collapse
    total = int(rng.integers(0, 3))
    counter = rng.choice(["total", "flag", "none", "mixed"])
    scale_share = rng.choice([1.0, 1.0, 0.7, 0.0])
    norm_kind = rng.choice(["small", "scaled", "mixed"])
    records = []
    for i in range(n):
        rec = StepRecord(step=int(steps[i]))
        skip = rng.random() < overflow
        if skip:
            scale /= 2
            total += 1
        elif rng.random() < 0.002:
            scale *= 2
        if floor_run and rng.random() < 0.01:
            scale = 1.0
        if rng.random() < scale_share:
            value = scale
            if rng.random() < 0.01:
                value = float(rng.choice([math.nan, math.inf, 0.0, -1.0]))
            rec.loss_scale = value
        kind = counter if counter != "mixed" else rng.choice(["total", "flag", "none"])
        if kind == "total" and rng.random() < 0.98:
            rec.skipped_total = total if rng.random() > 0.01 else max(0, total - 3)
        elif kind == "flag" and rng.random() < 0.98:
            rec.skipped = bool(skip)
        if rng.random() < 0.9:
            base = scale if (norm_kind == "scaled" or (norm_kind == "mixed" and i % 7 < 3)) else 1
            rec.grad_norm = float(base * rng.choice([0.05, 0.2, 1.0, 3.0]))
            if rng.random() < 0.01:
                rec.grad_norm = math.nan
        if rng.random() < 0.95:
            rec.loss = float(2.0 + rng.random() * (1.0 if rng.random() < 0.5 else 0.0))
            if rng.random() < 0.01:
                rec.loss = math.nan
        if rng.random() < 0.01:
            rec.extra["scaler_checked"] = True
        if rng.random() < 0.005:
            rec.extra["scaled_grads_step"] = True
        records.append(rec)
    return records


@st.composite
def _options(draw: st.DrawFn) -> dict[str, Any]:
    if not draw(st.booleans()):
        return {}
    return {
        "min_scale": draw(st.sampled_from([1.0, 128.0])),
        "collapse_drops": draw(st.integers(1, 10)),
        "skip_window": draw(st.integers(1, 60)),
        "skip_min_records": draw(st.integers(1, 30)),
        "skip_share": draw(st.sampled_from([0.01, 0.1, 0.5])),
        "skip_grace_steps": draw(st.sampled_from([0, 20, 200])),
        "scaled_ratio": draw(st.sampled_from([0.01, 0.1])),
        "scaled_min_scale": draw(st.sampled_from([1.0, 1024.0])),
        "scaled_records": draw(st.integers(1, 5)),
        "scaled_max_ratio": draw(st.sampled_from([2.0, 100.0])),
        "unknown_records": draw(st.integers(1, 25)),
        "calibration_steps": draw(st.sampled_from([0, 100, 1000])),
        "cold_halvings": draw(st.integers(1, 6)),
    }


def _key(f: Any) -> str:
    return repr(
        (f.step, f.code, f.severity, f.message, f.value, f.threshold, sorted(f.data.items()))
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 800),
    opts=_options(),
    framework=st.sampled_from(FRAMEWORKS),
    warm=st.sampled_from([0, 0, 1, 40]),
    keep_source=st.booleans(),
)
def test_scaler_twin_matches_the_streaming_detector(
    seed: int, n: int, opts: dict[str, Any], framework: str, warm: int, keep_source: bool
) -> None:
    records = _stream(seed, n)
    warm = min(warm, max(0, n - 1))
    det = ScalerDetector(**opts)
    det.set_framework(framework)
    assert twin_for(det, proven_only=False) is not None
    dset = DetectorSet([copy.deepcopy(det)])
    for rec in records[:warm]:
        dset.update(rec)
    expected = dset.run(records[warm:])
    cols = columns_from_records(records)
    assert cols is not None
    if not keep_source:
        cols.source = None
    got = run_columns(cols, [copy.deepcopy(det)], proven_only=False, warm=warm)
    assert got.failed == dset.failed
    assert sorted(map(_key, got.found)) == sorted(map(_key, expected))
    assert got.unevaluated == dset.unevaluated()


def test_a_scaled_looking_norm_needs_the_loss_through_columns_too() -> None:
    """R032 from the gradient norm needs a finite loss (unknown framework): the rows the
    columnar run feeds the detector carry it."""
    records = [
        StepRecord(step=i, loss=2.0, grad_norm=10_000.0, loss_scale=65536.0) for i in range(1, 40)
    ]
    expected = DetectorSet([ScalerDetector()]).run(records)
    assert [f.code for f in expected] == ["R032"]
    cols = columns_from_records(records)
    assert cols is not None
    cols.source = None
    for proven_only in (True, False):
        got = run_columns(cols, [ScalerDetector()], proven_only=proven_only).found
        assert [f.code for f in got] == ["R032"]
