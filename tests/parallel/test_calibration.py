"""Calibration against published runs (issue: within ±20% on every row).

Narayanan et al. 2021 Table 1 (hardware FLOP rate, recomputation counted) and Llama 3
405B (model FLOP rate). Every published layout must validate; the planner's choice must
be predicted at least as fast as the published layout.
"""

from __future__ import annotations

import pytest

from sapper.memory import estimate
from sapper.parallel import predict_step, search, validate
from sapper.parallel.published import PUBLISHED_RUNS, PublishedRun
from sapper.rules.model import Severity

ids = [r.name for r in PUBLISHED_RUNS]


def _predicted(run: PublishedRun) -> float:
    cost = predict_step(run.to_plan())
    return cost.hardware_tflops_per_gpu if run.convention == "hardware" else (
        cost.model_tflops_per_gpu
    )


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=ids)
def test_within_20_percent(run: PublishedRun) -> None:
    assert _predicted(run) == pytest.approx(run.tflops, rel=0.20)


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=ids)
def test_published_layout_validates(run: PublishedRun) -> None:
    errors = [i.message for i in validate(run.to_plan()) if i.severity == Severity.ERROR]
    assert errors == []


_LLAMA_MEMORY = pytest.mark.xfail(
    strict=True,
    reason="the memory model puts 8 layers on the first stage (it does not read "
    "parallel.first_stage_layers) and counts the interleaved schedule's extra micro-batches "
    "in flight; the paper trained this layout at 8K without activation checkpointing",
)


@pytest.mark.parametrize(
    "run",
    [pytest.param(r, marks=_LLAMA_MEMORY) if "Llama" in r.name else r for r in PUBLISHED_RUNS],
    ids=ids,
)
def test_published_layout_fits(run: PublishedRun) -> None:
    assert estimate(run.to_plan()).fits


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=ids)
def test_planner_at_least_as_fast(run: PublishedRun) -> None:
    plan = run.to_plan()
    res = search(plan, top=1, explain=False)
    assert res.best is not None
    assert res.best.cost.step_time_s <= predict_step(plan).step_time_s * 1.0001
