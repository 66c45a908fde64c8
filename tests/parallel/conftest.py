"""Plans shared by the parallel tests: small real model shapes, built in code."""

from __future__ import annotations

from typing import Any

import pytest

from sapper.plan.schema import Plan


def gpt_plan(**over: Any) -> Plan:
    """A GPT-2-XL-sized model (1.5B) on 16 A100s; ``over`` replaces whole sections."""
    data: dict[str, Any] = {
        "model": {
            "hidden_size": 1600,
            "num_layers": 48,
            "num_heads": 25,
            "vocab_size": 50304,
            "max_position_embeddings": 1024,
            "implementation": "megatron",
        },
        "precision": {"dtype": "bf16"},
        "batch": {"seq_len": 1024, "micro_batch_size": 4, "global_batch_size": 256},
        "parallel": {"tp": 1, "pp": 1, "dp": -1},
        "hardware": {"gpu": "A100-80GB", "num_gpus": 16, "gpus_per_node": 8},
    }
    data.update(over)
    return Plan.model_validate(data)


@pytest.fixture
def plan() -> Plan:
    return gpt_plan()
