"""A value of the wrong kind handed to the monitor is the caller's mistake (R192, with what
to pass instead), never the monitor's own failure (R190), and switches nothing off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sapper.monitor import Monitor
from sapper.rules.registry import get_rule


def _run(loss=None, batch=None, skipped=None, steps: int = 6) -> Monitor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = Monitor(model, opt, console=False, log_every=2)
    for _ in range(steps):
        x = torch.randn(16, 8)
        real = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        real.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(real if loss is None else loss, batch=batch, skipped=skipped)
    mon.close()
    return mon


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"loss": "loss"}, "a value of type str without a readable loss"),
        ({"loss": torch.empty((), device="meta")}, "a loss on the meta device"),
        ({"loss": torch.ones(2, dtype=torch.complex64)}, "a complex loss"),
        ({"batch": "input_ids"}, "step(batch=...) got a value of type str holding no tensors"),
        ({"batch": {"ids": [1, 2, 3]}}, "holding no tensors"),
        ({"skipped": "yes"}, "step(skipped=...) got a value of type str"),
    ],
)
def test_misuse_is_named_with_the_fix_and_switches_nothing_off(kwargs, says) -> None:
    mon = _run(**kwargs)
    misuse = [f for f in mon.findings if f.code == "R192"]
    assert len(misuse) == 1, [f.message for f in mon.findings]
    assert says in misuse[0].message and "pass " in misuse[0].message
    assert not [f for f in mon.findings if f.code == "R190"]
    assert not mon._disabled
    assert len(mon.history) == 6  # every step still recorded


def test_right_values_give_no_misuse() -> None:
    batch = {"input_ids": torch.zeros(4, 8, dtype=torch.long)}
    mon = _run(batch=batch, skipped=False)
    assert not [f for f in mon.findings if f.code in ("R190", "R192")]
    assert all(r.loss is not None for r in mon.history)


def test_the_monitors_own_failure_is_still_r190(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug inside the monitor")

    monkeypatch.setattr(Monitor, "_observe_batch", broken)
    mon = _run(batch={"input_ids": torch.zeros(4, 8, dtype=torch.long)})
    assert {f.code for f in mon.findings if f.code in ("R190", "R192")} == {"R190"}
    assert "maintainers" in get_rule("R190").fix and "maintainers" not in get_rule("R192").fix
