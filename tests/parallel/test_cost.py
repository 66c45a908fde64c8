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


def _h100_plan(**parallel: object) -> Plan:
    """A 7B-class GPT on 64 H100s with TP4 + SP, Megatron kernels."""
    par: dict[str, object] = {"tp": 4, "pp": 1, "dp": -1, "sequence_parallel": True}
    par.update(parallel)
    return gpt_plan(
        model={
            "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "vocab_size": 50304,
            "max_position_embeddings": 4096, "attention_impl": "flash",
            "implementation": "megatron",
        },
        batch={"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 64},
        parallel=par,
        hardware={"gpu": "H100", "num_gpus": 64, "gpus_per_node": 8},
    )


def test_tp_overlap_hides_tp_collectives_and_says_so() -> None:
    off = predict_step(_h100_plan())
    on = predict_step(_h100_plan(tp_comm_overlap=True))
    assert on.breakdown["tp_comm"] < 0.5 * off.breakdown["tp_comm"]
    assert on.hidden["tp"] > 0 and off.hidden["tp"] == 0
    assert on.step_time_s < off.step_time_s
    # hidden collectives still cost the SMs they run on
    assert on.breakdown["compute"] > off.breakdown["compute"]
    assert any("tp_comm_overlap" in a for a in on.assumptions())
    assert any("not overlapped (tp_comm_overlap off)" in a for a in off.assumptions())
    # at least one of TP chunks is exposed
    assert on.breakdown["tp_comm"] > 0


def test_tp_overlap_needs_sequence_parallelism() -> None:
    lay = Layout.from_plan(_h100_plan(tp_comm_overlap=True))
    assert lay is not None
    plain = predict_step(_h100_plan(), lay.with_(sequence_parallel=False, tp_comm_overlap=False))
    tried = predict_step(_h100_plan(), lay.with_(sequence_parallel=False))
    assert tried.breakdown["tp_comm"] == pytest.approx(plain.breakdown["tp_comm"])


def test_param_gather_overlap_is_its_own_switch() -> None:
    plan = _h100_plan(zero_stage=1)
    on = predict_step(plan)
    off = predict_step(plan, Layout.from_plan(plan).with_(overlap_param_gather=False))  # type: ignore[union-attr]
    assert off.breakdown["dp_comm"] > on.breakdown["dp_comm"]
    grads_off = predict_step(plan, Layout.from_plan(plan).with_(overlap_dp_comm=False))  # type: ignore[union-attr]
    assert grads_off.breakdown["dp_comm"] > on.breakdown["dp_comm"]


def test_dp_bytes_are_wire_bytes_and_zero_for_one_rank(plan: Plan) -> None:
    one = _cost(plan, dp=1, grad_accum=64, zero=3)
    assert one.details["dp_bytes"] == 0 and one.breakdown["dp_comm"] == 0
    two = _cost(plan, dp=2, grad_accum=32)
    sixteen = _cost(plan, grad_accum=4)
    # an all-reduce moves 2(n-1)/n of the gradients through each link
    psi = sixteen.details["params_per_gpu"]
    assert two.details["dp_bytes"] == pytest.approx(2 * psi * 2 * 1 / 2)
    assert sixteen.details["dp_bytes"] == pytest.approx(2 * psi * 2 * 15 / 16)


def test_flash_attention_executes_the_causal_half(plan: Plan) -> None:
    """Reported FLOPs count the full s x s square either way; only the time differs."""
    model = dict(plan.model.model_dump(exclude_none=True)) if plan.model else {}
    eager = _cost(gpt_plan(model={**model, "attention_impl": "eager"}))
    flash = _cost(gpt_plan(model={**model, "attention_impl": "flash"}))
    assert flash.step_time_s < eager.step_time_s
    mf_eager = eager.model_tflops_per_gpu * eager.step_time_s
    mf_flash = flash.model_tflops_per_gpu * flash.step_time_s
    assert mf_eager == pytest.approx(mf_flash)


def test_small_models_reach_lower_mfu_than_large_ones() -> None:
    from sapper.parallel.published import PUBLISHED_RUNS

    mcore = [r for r in PUBLISHED_RUNS if r.name.startswith("MCore")]
    small, mid = predict_step(mcore[0].to_plan()), predict_step(mcore[2].to_plan())
    assert small.mfu < mid.mfu
    assert small.details["gemm_share"] > 0 and small.details["attention_share"] > 0
