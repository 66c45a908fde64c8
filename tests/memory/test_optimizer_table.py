"""One optimizer table: the memory model's state bytes and the cost model's update
traffic follow from the same number of state tensors."""

from __future__ import annotations

import pytest

from sapper.memory.inputs import shape_from_plan
from sapper.model.optimizers import state_tensors, update_bytes_per_param
from sapper.parallel.workload import Workload
from sapper.plan.schema import Plan


@pytest.mark.parametrize(
    ("optimizer", "momentum", "states"),
    [("adamw", 0.0, 2), ("lamb", 0.0, 2), ("lion", 0.0, 1), ("sgd", 0.0, 0), ("sgd", 0.9, 1),
     ("adafactor", 0.0, 0), ("some-new-optimizer", 0.0, 2)],
)
def test_memory_and_cost_read_the_same_states(optimizer: str, momentum: float, states: int) -> None:
    plan = Plan.model_validate({
        "model": {"hidden_size": 256, "num_layers": 2, "num_heads": 4, "vocab_size": 1000},
        "batch": {"micro_batch_size": 1, "seq_len": 128},
        "precision": {"dtype": "bf16"},
        "optimizer": {"type": optimizer, "momentum": momentum},
    })
    assert state_tensors(optimizer, momentum) == states
    assert shape_from_plan(plan).recipe.state == states * 4  # fp32 moments
    # master weight r/w 8 + each state r/w 8 + gradient read 4 + bf16 copy write 2
    assert Workload.from_plan(plan).optimizer_bytes == 14 + 8 * states
    assert update_bytes_per_param("adamw") == 30.0  # the published Adam figure
