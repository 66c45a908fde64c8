"""MoE models trace on fake tensors: transformers' grouped experts exactly, the eager
expert loop under a fixed balanced routing."""

from __future__ import annotations

from typing import Any

import pytest
from memory_plans import make_plan
from transformers import AutoConfig, AutoModelForCausalLM

from sapper.memory import estimate
from sapper.memory.fake_moe import balanced_routing, prepare_experts
from sapper.memory.traced import StepConfig, trace_hf_config, trace_plan, trace_step

TINY_MOE: dict[str, dict[str, Any]] = {
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
    },
    "qwen2_moe": {  # a shared expert with its sigmoid gate next to the routed ones
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 48,
        "shared_expert_intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
    },
}


def _config(name: str, impl: str) -> Any:
    data = dict(TINY_MOE[name])
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    config._experts_implementation = impl
    return config


@pytest.mark.parametrize("name", sorted(TINY_MOE))
@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_grouped_experts_trace_exactly(name: str, autocast: str | None) -> None:
    config = _config(name, "grouped_mm")
    cfg = StepConfig(micro_batch=2, seq_len=64, autocast=autocast)
    fake = trace_hf_config(config, cfg)
    real = trace_hf_config(config, cfg, fake=False)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.breakdown == real.breakdown
    assert any("grouped_mm" in n for n in fake.notes)


def test_eager_expert_loop_traces_the_balanced_routing() -> None:
    config = _config("mixtral", "eager")
    cfg = StepConfig(micro_batch=2, seq_len=64, checkpointing=True)
    fake = trace_hf_config(config, cfg)

    def balanced() -> Any:  # the same routing on real tensors
        model = AutoModelForCausalLM.from_config(config)
        prepare_experts(model)
        return model

    real = trace_step(balanced, cfg, config.vocab_size, fake=False)
    assert fake.peak_bytes == real.peak_bytes
    assert any("balanced routing" in n for n in fake.notes)


def test_balanced_routing_spreads_every_pair() -> None:
    load = balanced_routing(num_tokens=10, top_k=2, num_experts=8)
    assert sum(load) == 20
    assert max(load) - min(load) <= 1


def test_moe_plan_traces() -> None:
    plan = make_plan(
        {
            "family": "mixtral",
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "ffn_hidden_size": 96,
            "activation": "swiglu",
            "hidden_act": "silu",
            "vocab_size": 256,
            "max_position_embeddings": 256,
            "position_encoding": "rope",
            "norm_type": "rmsnorm",
            "num_experts": 4,
            "experts_top_k": 2,
        },
        batch={"micro_batch_size": 2, "seq_len": 64},
    )
    traced = trace_plan(plan)
    assert any("Traced a mixtral model" in n for n in traced.notes)
    assert traced.num_params == estimate(plan).num_params
