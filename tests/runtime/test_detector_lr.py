"""The LR schedule's shape without a plan (R043 warmup far too short, R044 a schedule past
its end) and a flat LR under a declared schedule (R045), on the LR series real PyTorch
and transformers schedulers produce."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from sapper.logs import read_log
from sapper.plan.schema import Plan
from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import LRDetector, default_detectors

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _series(make, steps: int, lr: float = 3e-4, every: int = 1) -> list[StepRecord]:
    """The LR an optimizer applies at each step under a real scheduler, stepped once per
    optimizer step for ``steps`` steps; one record every ``every`` steps."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make(opt)
    out = []
    for step in range(steps):
        if step % every == 0:
            out.append(StepRecord(step=step, lr=opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    return out


def _codes(records: list[StepRecord], **opts) -> list[str]:
    return [f.code for f in DetectorSet([LRDetector(**opts)]).run(records)]


def test_torch_cosine_with_a_too_short_period_comes_back_up() -> None:
    # CosineAnnealingLR(T_max=10) on a 40-step run: at 0 by step 10, then back up.
    records = _series(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10), 40)
    found = DetectorSet([LRDetector()]).run(records)
    (hit,) = [f for f in found if f.code == "R044"]
    assert 12 <= hit.step <= 15 and "rises again" in hit.message


def test_hf_cosine_stepped_past_its_total_comes_back_up() -> None:
    make = lambda o: get_cosine_schedule_with_warmup(o, 10, 100)  # noqa: E731
    assert "R044" in _codes(_series(make, 160))
    assert _codes(_series(make, 100)) == []  # stepped exactly its total: healthy


def test_hf_linear_clamped_at_zero_for_the_rest_of_the_run() -> None:
    make = lambda o: get_linear_schedule_with_warmup(o, 10, 100)  # noqa: E731
    found = DetectorSet([LRDetector()]).run(_series(make, 300, every=5))
    (hit,) = [f for f in found if f.code == "R044"]
    assert "exactly 0" in hit.message and hit.data["since"] == 100
    # A linear decay reaching 0 at the last step is how it ends, not an overrun.
    assert _codes(_series(make, 101)) == []


def test_negative_lr_and_warm_restarts() -> None:
    lrs = [1e-3 * (1 - s / 50) for s in range(60)]  # a linear decay without a clamp
    assert "R044" in _codes([StepRecord(step=s, lr=v) for s, v in enumerate(lrs)])
    sgdr = _series(lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, 20), 100)
    assert _codes(sgdr) == []  # restarts jump back to the peak: intended
    cyclic = _series(
        lambda o: torch.optim.lr_scheduler.CyclicLR(
            o, base_lr=1e-4, max_lr=1e-3, step_size_up=20, cycle_momentum=False
        ),
        200,
    )
    assert _codes(cyclic) == []  # a triangular cycle's floor (10% of the peak) is not ≈0


def _warmup_then_constant(warmup: int, steps: int, lr: float = 3e-4) -> list[StepRecord]:
    """A linear warmup then constant (LambdaLR(lambda s: min(1, s / warmup))), logged
    every step for the first 50 steps, then every 1000 (a long run's log)."""
    kept = [s for s in range(steps) if s < 50 or s % 1000 == 0]
    return [StepRecord(step=s, lr=lr * min(1.0, s / warmup)) for s in kept]


def test_warmup_far_shorter_than_the_run() -> None:
    found = DetectorSet([LRDetector()]).run(_warmup_then_constant(10, 100_001))
    (hit,) = [f for f in found if f.code == "R043"]
    assert hit.value == 10 and hit.data["run_steps"] >= 50_000
    # Common practice stays quiet: 2% warmup of the same run; 10 steps of a 1000-step run.
    assert "R043" not in _codes(_warmup_then_constant(2000, 100_001))
    assert "R043" not in _codes(_warmup_then_constant(10, 1001))


def test_declared_total_makes_the_short_warmup_visible_early() -> None:
    records = _warmup_then_constant(10, 200)
    assert "R043" in _codes(records, total_steps=100_000)


def test_flat_lr_under_a_declared_cosine_is_named_as_such() -> None:
    plan = Plan.model_validate(
        {
            "optimizer": {"lr": 1e-3},
            "schedule": {"type": "cosine", "warmup_steps": 20, "total_steps": 200},
        }
    )
    records = [StepRecord(step=s, lr=1e-3 * min(1.0, s / 20)) for s in range(200)]
    codes = {f.code for f in DetectorSet(default_detectors(plan)).run(records)}
    assert "R045" in codes and "R040" not in codes


def test_real_logs_have_no_schedule_shape_findings() -> None:
    for path in (EXAMPLES / "hf-llama-sft", LOGS / "megatron-345m-fp16-2000it.log"):
        found = DetectorSet([LRDetector()]).run(read_log(path).records)
        assert not {f.code for f in found} & {"R043", "R044"}, path


@pytest.mark.parametrize(
    ("records", "start"),
    [
        ([StepRecord(step=s, loss=2.0) for s in range(10)], "R040-R045"),
        ([StepRecord(step=5000 + s, lr=3e-4) for s in range(10)], "R040-R042, R045"),
    ],
)
def test_unevaluated(records: list[StepRecord], start: str) -> None:
    det = LRDetector()
    DetectorSet([det]).run(records)
    lines = det.unevaluated()
    assert lines[0].startswith(start)
    if start != "R040-R045":
        assert any(line.startswith("R043") and "5000" in line for line in lines)
