"""FLOP counts agree with the published formulas they are compared against."""

from __future__ import annotations

import pytest

from sapper.model import architecture_from_plan, total_params
from sapper.parallel.published import PUBLISHED_RUNS
from sapper.parallel.workload import Workload, padded_vocab


@pytest.mark.parametrize("run", PUBLISHED_RUNS[:10], ids=lambda r: r.name)
def test_megatron_formula(run) -> None:
    """Narayanan et al. count 96·B·s·l·h²·(1 + s/6h + V/16lh) per step with full
    recomputation; per token that is our model FLOPs plus the recomputed forward."""
    plan = run.to_plan()
    w = Workload.from_plan(plan)
    h, layers, s, v = w.hidden, w.layers, w.seq_len, w.vocab
    paper = 96 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    ours = w.model_flops_per_token() + w.recompute_flops_per_token("full")
    assert ours == pytest.approx(paper, rel=1e-3)


def test_llama_model_flops_close_to_6n() -> None:
    plan = PUBLISHED_RUNS[10].to_plan()
    w = Workload.from_plan(plan)
    assert plan.model is not None
    n = total_params(architecture_from_plan(plan)) - w.vocab * w.hidden
    attention = 3 * w.layers * w.attn_flops
    assert w.model_flops_per_token() - attention == pytest.approx(6 * n, rel=0.01)


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_the_cost_model_prices_the_models_own_parameter_count(run) -> None:
    plan = run.to_plan()
    w = Workload.from_plan(plan)
    total = w.layers * (w.layer_params + w.expert_params) + w.embed_params + w.head_params
    assert total == pytest.approx(total_params(architecture_from_plan(plan)), rel=1e-9)


def test_eager_attention_executes_the_whole_square() -> None:
    gpt = Workload.from_plan(PUBLISHED_RUNS[0].to_plan())
    llama = Workload.from_plan(PUBLISHED_RUNS[10].to_plan())
    assert gpt.attn_exec == 1.0 and gpt.elem_scores > 0
    assert llama.attn_exec == 0.5 and llama.elem_scores == 0


def test_vocab_padding() -> None:
    assert padded_vocab(50257, 1) == 50304
    assert padded_vocab(50257, 8) == 51200
    assert padded_vocab(51200, 8) == 51200


def _megatron_core_flops(plan) -> float:
    """Megatron-Core's num_floating_point_operations per token (2024-07): 12·s·L·h²·((1 +
    groups/heads + s/h)·(a·d/h) + (ffn/h)·(3/2 if swiglu) + V_pad/(2·L·h)) / s."""
    m = plan.model
    h, layers, s = m.hidden_size, m.num_layers, plan.batch.seq_len
    ratio = m.num_heads * m.head_size / h
    attn = (1 + m.kv_heads / m.num_heads + s / h) * ratio
    mlp = m.ffn_size / h * (1.5 if m.activation.gated else 1.0)
    logit = padded_vocab(m.vocab_size, plan.parallel.tp) / (2 * layers * h)
    return 12 * layers * h * h * (attn + mlp + logit)


@pytest.mark.parametrize("run", [r for r in PUBLISHED_RUNS if r.flops == "mcore"],
                         ids=lambda r: r.name)
def test_megatron_core_formula(run) -> None:
    """The weak-scaling table counts model FLOPs: no recomputation, the full s² square."""
    plan = run.to_plan()
    w = Workload.from_plan(plan)
    assert w.model_flops_per_token() == pytest.approx(_megatron_core_flops(plan), rel=2e-3)


def test_bloom_formula() -> None:
    """Megatron-DeepSpeed logs Narayanan et al.'s count with the recomputation factor 4."""
    run = next(r for r in PUBLISHED_RUNS if r.flops == "bloom")
    w = Workload.from_plan(run.to_plan())
    h, layers, s, v = w.hidden, w.layers, w.seq_len, w.vocab
    paper = 96 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    ours = w.model_flops_per_token() + w.recompute_flops_per_token("full")
    assert ours == pytest.approx(paper, rel=2e-3)


def test_causal_masking_does_not_halve_the_reported_count() -> None:
    """Model FLOPs count the full s x s square (Megatron, PaLM, Llama 3 as assumed);
    flash kernels execute half of it."""
    llama = Workload.from_plan(PUBLISHED_RUNS[10].to_plan())
    assert llama.attn_flops == 4 * llama.seq_len * llama.heads * llama.head_dim
    assert llama.attn_exec == 0.5


def test_gemm_shapes_add_up_to_the_gemm_flops() -> None:
    for run in PUBLISHED_RUNS:
        w = Workload.from_plan(run.to_plan())
        total = sum(2 * g.n * g.k * (w.top_k if g.expert else 1) for g in w.gemms)
        assert total == pytest.approx(w.gemm_flops), run.name
