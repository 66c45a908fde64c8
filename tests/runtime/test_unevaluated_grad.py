"""What the gradient-norm detector says it could not judge is true of the log."""

from __future__ import annotations

import math

from sapper.runtime.detectors.gradnorm import GradNormDetector
from sapper.runtime.records import StepRecord


def test_only_non_finite_norms_say_r010_ran_and_the_rest_could_not() -> None:
    det = GradNormDetector()
    found = [f.code for s in range(5)
             for f in det.update(StepRecord(step=s, grad_norm=math.nan if s == 2 else None))]
    assert found == ["R010"]
    (line,) = det.unevaluated()
    assert line.startswith("R011-R013") and "no finite grad_norm" in line


def test_no_norm_at_all_says_the_log_has_none() -> None:
    det = GradNormDetector()
    for s in range(5):
        det.update(StepRecord(step=s, loss=1.0))
    (line,) = det.unevaluated()
    assert line == "R010-R013 gradient norm: not evaluated — the log has no grad_norm"
