"""The step cost model: components add up, and each knob moves the cost the right way."""

from __future__ import annotations

import pytest

from sapper.errors import InputError
from sapper.parallel import BREAKDOWN, Layout, bubble_fraction, predict_step
from sapper.plan.schema import Plan

from .conftest import gpt_plan


def _cost(plan: Plan, **changes: object):
    lay = Layout.from_plan(plan)
    assert lay is not None
    return predict_step(plan, lay.with_(**changes))


def test_breakdown_adds_up(plan: Plan) -> None:
    c = _cost(plan, tp=2, pp=2, dp=4, sequence_parallel=True, grad_accum=8, micro_batch=8)
    assert set(c.breakdown) == set(BREAKDOWN)
    assert sum(c.breakdown.values()) == pytest.approx(c.step_time_s)
    assert sum(c.shares().values()) == pytest.approx(1.0)
    assert c.tokens_per_s == pytest.approx(256 * 1024 / c.step_time_s)
    assert 0 < c.mfu < 1
    assert c.hardware_tflops_per_gpu == pytest.approx(c.model_tflops_per_gpu)


def test_recompute_costs_a_forward(plan: Plan) -> None:
    none, full = _cost(plan), _cost(plan, checkpointing="full")
    assert full.breakdown["compute"] / none.breakdown["compute"] == pytest.approx(4 / 3, rel=0.05)
    assert full.hardware_tflops_per_gpu > full.model_tflops_per_gpu
    half = _cost(plan, checkpointing="full", checkpoint_every=2)
    assert none.step_time_s < half.step_time_s < full.step_time_s


def test_tp_across_nodes_is_slower_than_inside(plan: Plan) -> None:
    inside = _cost(plan, tp=8, dp=2, grad_accum=8)
    across = _cost(plan, tp=8, dp=2, grad_accum=8, rank_order="dp-tp-cp-pp")
    assert across.breakdown["tp_comm"] > 2 * inside.breakdown["tp_comm"]


def test_bubble_follows_the_schedule(plan: Plan) -> None:
    one = _cost(plan, pp=4, dp=4, micro_batch=1, grad_accum=16)
    inter = _cost(plan, pp=4, dp=4, micro_batch=1, grad_accum=16, virtual_stages=3,
                  schedule="interleaved")
    t_mb = one.details["microbatch_time"]
    assert one.breakdown["bubble"] == pytest.approx(3 * t_mb, rel=0.05)
    assert inter.breakdown["bubble"] < one.breakdown["bubble"] / 2.5
    assert inter.breakdown["pp_p2p"] > one.breakdown["pp_p2p"]
    assert bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert bubble_fraction(4, 16, 3) == pytest.approx((3 / 48) / (1 + 3 / 48))


def test_zero3_moves_one_and_a_half_times_dp_traffic(plan: Plan) -> None:
    z0 = _cost(plan, grad_accum=1, micro_batch=16)
    z3 = _cost(plan, grad_accum=1, micro_batch=16, zero=3)
    # bf16 weights and gradients: all-gather x2 + reduce-scatter vs one all-reduce
    assert z3.details["dp_bytes"] / z0.details["dp_bytes"] == pytest.approx(1.5)
    z2 = _cost(plan, zero=2)  # reduce-scatter on each of the 4 micro-batches
    z1 = _cost(plan, zero=1)
    assert z2.details["dp_bytes"] > 2 * z1.details["dp_bytes"]


def test_unoverlapped_gradient_reduction_is_exposed(plan: Plan) -> None:
    assert _cost(plan).breakdown["dp_comm"] == 0
    exposed = _cost(plan, overlap_dp_comm=False)
    assert exposed.breakdown["dp_comm"] > 0


def test_few_tokens_per_gpu_make_matmuls_memory_bound(plan: Plan) -> None:
    many = _cost(plan, micro_batch=4, grad_accum=4)
    few = _cost(plan, cp=8, dp=2, micro_batch=1, grad_accum=128)
    assert few.mfu < many.mfu


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("hardware", {"num_gpus": 16}, "hardware.gpu"),
        ("batch", {"micro_batch_size": 4}, "batch.seq_len"),
    ],
)
def test_missing_inputs_raise(section: str, value: dict, field: str) -> None:
    with pytest.raises(InputError) as err:
        predict_step(gpt_plan(**{section: value}))
    assert err.value.field == field


def test_undeterminable_dp_raises() -> None:
    with pytest.raises(InputError, match="data-parallel degree"):
        predict_step(gpt_plan(parallel={"tp": 3}))
