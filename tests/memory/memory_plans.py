"""Plans for the memory tests, built in the Plan's own shape."""

from __future__ import annotations

from typing import Any

from sapper.plan.schema import Plan

LLAMA_7B: dict[str, Any] = {
    "family": "llama",
    "hidden_size": 4096,
    "num_layers": 32,
    "num_heads": 32,
    "num_kv_heads": 32,
    "ffn_hidden_size": 11008,
    "activation": "swiglu",
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "position_encoding": "rope",
    "norm_type": "rmsnorm",
}

TINY_LLAMA: dict[str, Any] = {
    **LLAMA_7B,
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 4,
    "ffn_hidden_size": 344,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
}


def make_plan(model: dict[str, Any] | None = None, **sections: Any) -> Plan:
    data: dict[str, Any] = {
        "model": model or LLAMA_7B,
        "precision": {"dtype": "bf16", "master_weights": "fp32"},
        "batch": {"micro_batch_size": 1, "seq_len": 2048},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return Plan.model_validate(data)
