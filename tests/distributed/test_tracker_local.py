"""The tracker in one process (no process group): inert, cheap, never in the way."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.distributed import RankTracker
from sapper.distributed.bridge import MonitorBridge
from sapper.errors import InputError
from sapper.plan.schema import Plan
from sapper.rules.registry import all_rules


def test_single_process_tracker_is_inactive_and_returns_nothing() -> None:
    model = nn.Linear(4, 2)
    tracker = RankTracker(model, every=2)
    assert not tracker.active and tracker.ctx.world_size == 1
    batches = [torch.randn(3, 4) for _ in range(4)]
    for step, x in enumerate(tracker.wrap(batches)):
        loss = model(x).pow(2).mean()
        loss.backward()
        assert tracker.step(step, loss=loss.detach()) == []
    assert tracker.exchanges == 0
    tracker.close()
    assert MonitorBridge.attach(model) is None  # the monitor runs without it


def test_bad_rank_order_in_the_plan_is_an_input_error() -> None:
    plan = Plan.model_validate({"parallel": {"tp": 2, "rank_order": "tp-dp-tp"}})
    with pytest.raises(InputError, match=r"parallel\.rank_order"):
        RankTracker(nn.Linear(2, 2), plan=plan)


def test_every_x_rule_is_documented_and_explained() -> None:
    rules = [r for r in all_rules() if r.code.startswith("X")]
    assert [r.code for r in rules] == [f"X{i:03d}" for i in range(1, 11)]
    for r in rules:
        assert r.why and r.signs and r.fix and r.seed
    _register_commands()
    result = CliRunner().invoke(app, ["explain", "X004"])
    assert result.exit_code == 0 and "DistributedSampler" in result.output
