"""What the model knows it does not know: the calibration band, coverage, MFU sanity."""

from __future__ import annotations

import pytest

from sapper.parallel import Layout, search
from sapper.parallel.cluster import Cluster
from sapper.parallel.confidence import (
    calibration,
    claim,
    mfu_note,
    outside,
    prediction_band,
    ratio_band,
    region,
)
from sapper.parallel.published import PUBLISHED_RUNS
from sapper.parallel.workload import Workload
from sapper.plan.schema import Plan

from .conftest import gpt_plan


def test_band_comes_from_the_calibration_rows() -> None:
    rows = calibration()
    assert len(rows) == len(PUBLISHED_RUNS)
    worst = max(abs(r.error) for r in rows)
    assert 0 < prediction_band() <= worst
    assert 0 < ratio_band() < 2 * worst


def test_region_is_derived_from_the_rows() -> None:
    reg = region()
    assert reg.gpus == {"A100-80GB", "H100"}
    assert reg.zero == {0, 1}
    assert "selective" not in reg.checkpointing and "full" in reg.checkpointing
    assert reg.max_tp == 8 and reg.max_cp == 16
    assert not reg.moe and not reg.tp_across_nodes


def _reasons(plan: Plan, **changes: object) -> list[str]:
    lay = Layout.from_plan(plan)
    assert lay is not None
    return outside(lay.with_(**changes), Workload.from_plan(plan), Cluster.from_plan(plan))


def test_published_layouts_lie_inside() -> None:
    for run in PUBLISHED_RUNS:
        plan = run.to_plan()
        assert _reasons(plan) == [], run.name


@pytest.mark.parametrize(
    ("changes", "word"),
    [({"zero": 3}, "ZeRO-3"), ({"checkpointing": "selective"}, "selective")],
)
def test_uncovered_choices_are_named(changes: dict, word: str) -> None:
    plan = PUBLISHED_RUNS[4].to_plan()
    assert any(word in r for r in _reasons(plan, **changes))


def test_uncalibrated_gpu_and_kernels_are_named() -> None:
    base = gpt_plan().model
    assert base is not None
    model = {**base.model_dump(exclude_none=True), "implementation": "transformers"}
    plan = gpt_plan(model=model, hardware={"gpu": "L40S", "num_gpus": 16, "gpus_per_node": 8})
    reasons = _reasons(plan)
    assert any("L40S" in r for r in reasons)
    assert any("transformers" in r for r in reasons)


def test_claims_carry_the_band_or_are_withheld() -> None:
    text, ok = claim(1.5, band=0.1)
    assert ok and "1.50× slower" in text and "±10%" in text
    text, ok = claim(1.05, band=0.1)
    assert not ok and "no reliable difference" in text
    text, ok = claim(1 / 1.5, band=0.1)
    assert ok and "1.50× faster" in text
    text, ok = claim(1.5, ["ZeRO-3 (calibrated: ZeRO-0, 1)"], band=0.1)
    assert not ok and "not a supported claim" in text and "ZeRO-3" in text


def test_mfu_above_the_best_published_is_flagged() -> None:
    assert mfu_note(0.45, "H100") is None
    note = mfu_note(0.60, "H100")
    assert note is not None and "49%" in note and "upper bound" in note


def test_planner_explanations_withhold_unsupported_claims() -> None:
    res = search(gpt_plan(), top=1, explain=True)
    best = res.best
    assert best is not None
    why = " ".join(best.why)
    # 1024-token sequences: outside the calibrated range, so no speed-up is claimed
    assert "outside the calibrated region" in why
    assert "not a supported claim" in why
    assert "(±" not in why
