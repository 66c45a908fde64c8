"""The traced estimator: fake tensors count exactly what a real step allocates, and the
analytic model agrees with it."""

from __future__ import annotations

import time

import pytest
from memory_plans import LLAMA_7B, TINY_LLAMA, make_plan

from sapper.memory import MemoryOptions, estimate
from sapper.memory.traced import StepConfig, hf_config_from_plan, trace_hf_config, trace_plan

TINY_GPT2 = {
    "family": "gpt2",
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "position_encoding": "learned",
    "activation": "gelu",
    "hidden_act": "gelu_new",
    "norm_type": "layernorm",
    "tied_embeddings": True,
    "attention_bias": True,
    "mlp_bias": True,
}


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT2], ids=["llama", "gpt2"])
def test_fake_step_counts_what_a_real_step_allocates(model: dict) -> None:
    plan = make_plan(model, precision={"dtype": "fp32"}, batch={"seq_len": 128})
    cfg = StepConfig(micro_batch=2, seq_len=128, autocast="bf16")
    config = hf_config_from_plan(plan)
    fake = trace_hf_config(config, cfg)
    real = trace_hf_config(config, cfg, fake=False)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.breakdown == real.breakdown
    assert set(fake.phases) == {"forward", "backward", "optimizer"}


@pytest.mark.parametrize(
    ("model", "attn", "autocast", "ckpt"),
    [
        (TINY_LLAMA, "sdpa", True, False),
        (TINY_LLAMA, "eager", False, True),
        (TINY_GPT2, "eager", True, False),
        (TINY_GPT2, "sdpa", False, True),
    ],
)
def test_analytic_agrees_with_traced(model: dict, attn: str, autocast: bool, ckpt: bool) -> None:
    plan = make_plan(
        {**model, "attention_impl": attn},
        precision={"dtype": "bf16" if autocast else "fp32", "autocast": autocast},
        batch={"micro_batch_size": 2, "seq_len": 256},
        parallel={"checkpointing": {"granularity": "full" if ckpt else "none"}},
    )
    traced = trace_plan(plan).peak_bytes
    analytic = estimate(plan, MemoryOptions(device="cpu")).tensor_peak_bytes
    # the benchmark's per-row target is 5%; even these tiny models stay within 2%
    assert analytic == pytest.approx(traced, rel=0.02)


def test_master_weights_recipe_is_traced() -> None:
    plan = make_plan(TINY_LLAMA, batch={"seq_len": 128})  # bf16 weights, fp32 master
    traced = trace_plan(plan)
    assert traced.breakdown["optimizer"] > 0
    analytic = estimate(plan, MemoryOptions(device="cpu")).tensor_peak_bytes
    assert analytic == pytest.approx(traced.peak_bytes, rel=0.01)


@pytest.mark.slow
def test_7b_traces_well_under_a_minute() -> None:
    plan = make_plan(
        LLAMA_7B,
        batch={"micro_batch_size": 1, "seq_len": 4096},
        parallel={"checkpointing": {"granularity": "full"}},
    )
    start = time.perf_counter()
    traced = trace_plan(plan)
    assert time.perf_counter() - start < 45
    assert traced.num_params == 6_738_415_616
    # bf16 weights + grads, fp32 master + m + v: 16 bytes per parameter
    states = sum(traced.phases["optimizer"][k] for k in ("params", "grads", "optimizer"))
    assert states == pytest.approx(16 * traced.num_params, rel=1e-3)
