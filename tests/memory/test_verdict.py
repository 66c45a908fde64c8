"""Checklist item 5: fits or not, dominant part, remedies in the seed's order."""

from __future__ import annotations

from memory_plans import make_plan

from sapper.memory import estimate
from sapper.memory.verdict import verdict


def test_states_that_do_not_fit_are_called_out() -> None:
    v = verdict(make_plan(hardware={"gpu": "A100-80GB", "num_gpus": 1}))
    assert v.estimate.fits is False and v.states_exceed_gpu
    assert v.dominant_part == "model states"
    assert v.max_micro_batch is None  # not even one sequence fits


def test_remedies_follow_the_seed_order_and_say_what_they_give() -> None:
    plan = make_plan(
        hardware={"gpu": "A100-80GB", "num_gpus": 8},
        batch={"micro_batch_size": 8, "seq_len": 4096},
        parallel={"zero_stage": 1},
    )
    v = verdict(plan)
    names = [r.name for r in v.remedies]
    assert names[0].startswith("activation checkpointing")
    assert names[1].startswith("ZeRO stage")
    assert names[2].startswith("offload")
    assert any(n.startswith("tensor parallel") for n in names[3:])
    base = v.estimate.peak_bytes
    for r in v.remedies:
        assert r.saves_bytes == base - r.peak_bytes
    assert v.remedies[0].saves_bytes > 0


def test_what_if_table_and_largest_fitting_batch() -> None:
    plan = make_plan(
        hardware={"gpu": "A100-80GB", "num_gpus": 8},
        batch={"micro_batch_size": 2, "seq_len": 2048},
        parallel={"zero_stage": 3, "checkpointing": {"granularity": "full"}},
    )
    v = verdict(plan)
    assert {(w.zero, w.checkpointing) for w in v.what_if} == {
        (z, c) for z in range(4) for c in ("none", "full")
    }
    mb = v.max_micro_batch
    assert mb is not None and mb >= 2
    fits = estimate(make_plan(**{**_sections(plan), "batch": {"micro_batch_size": mb}}))
    over = estimate(make_plan(**{**_sections(plan), "batch": {"micro_batch_size": mb + 1}}))
    assert fits.fits and not over.fits
    assert v.max_seq_len is not None and v.max_seq_len % 128 == 0


def _sections(plan) -> dict:  # type: ignore[no-untyped-def]
    return {
        "hardware": {"gpu": "A100-80GB", "num_gpus": 8},
        "parallel": {"zero_stage": 3, "checkpointing": {"granularity": "full"}},
    }
