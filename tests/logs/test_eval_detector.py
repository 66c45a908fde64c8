"""R110/R111 over sparse evaluations: overfitting fires, healthy and flat-late runs differ."""

from __future__ import annotations

import math

from sapper.runtime.detector import DetectorSet
from sapper.runtime.detectors.eval import EvalLossDetector
from sapper.runtime.records import StepRecord


def _run(train, evals, every: int = 100, **options):
    records = []
    for step in range(10, 10 * len(train) + 1, 10):
        rec = StepRecord(step=step, loss=train[step // 10 - 1])
        if step % every == 0:
            rec.eval_loss = evals[step // every - 1]
        records.append(rec)
    return DetectorSet([EvalLossDetector(**options)]).run(records)


def test_overfitting_fires_once_after_patience() -> None:
    train = [2.0 * math.exp(-i / 60) + 0.5 for i in range(100)]  # keeps falling
    evals = [1.6, 1.3, 1.15, 1.10, 1.12, 1.16, 1.22, 1.30, 1.36, 1.41]
    findings = _run(train, evals)
    assert [(f.code, f.step) for f in findings] == [("R110", 700)]
    f = findings[0]
    assert f.data["best_step"] == 400 and f.value == 1.22
    assert "above its best" in f.message and "training loss fell" in f.message


def test_healthy_run_is_quiet() -> None:
    train = [2.0 * math.exp(-i / 60) + 0.5 for i in range(100)]
    evals = [1.6 * math.exp(-i / 4) + 0.7 for i in range(10)]
    assert _run(train, evals) == []


def test_rising_train_loss_is_divergence_not_overfitting() -> None:
    train = [1.0 + i / 50 for i in range(100)]
    evals = [1.0, 0.9, 0.95, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    assert [f.code for f in _run(train, evals)] == []


def test_plateau_is_info_and_fires_once() -> None:
    train = [1.0] * 100
    evals = [2.0, 1.5, 1.2, 1.199, 1.198, 1.2, 1.197, 1.199, 1.198, 1.197]
    findings = _run(train, evals)
    assert [(f.code, f.severity.value, f.step) for f in findings] == [("R111", "info", 800)]


def test_non_finite_eval_and_missing_train_loss_are_tolerated() -> None:
    det = EvalLossDetector(patience=2)
    out = []
    for step, value in [(100, 1.0), (200, math.nan), (300, 1.1), (400, 1.2)]:
        out += det.update(StepRecord(step=step, eval_loss=value))
    assert [(f.code, f.step) for f in out] == [("R110", 400)]
    assert "training loss" not in out[0].message
