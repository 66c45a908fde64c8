"""Finite is judged on values, not on a norm that overflows.

The L2 norm of finite 1e30 values overflows fp32 (1e30² = Inf), so a norm cannot tell a
huge weight from an Inf one. The monitor judges finiteness on the largest magnitude (in
the tensor's dtype) and sums squares in float64: a 1e30 weight row is "finite but huge"
(a warning of R020 naming it), a real Inf is "non-finite" (R020, an error naming it), and
finite 1e25 gradients give a finite total norm (no R010).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sapper.monitor import Monitor
from sapper.rules.model import Severity


def _model(row_value: float) -> nn.Sequential:
    """Linear-ReLU-Linear whose first layer's unit 0 is set to ``row_value``; the second
    layer ignores that unit, so the output and loss stay finite (unless ``row_value``
    itself is not)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        m[0].weight[0] = row_value
        m[0].bias[0] = 0.0
        m[2].weight[:, 0] = 0.0
    return m


def _train(model: nn.Module, steps: int = 4, loss_scale: float = 1.0) -> Monitor:
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay as set
    mon = Monitor(model, opt, log_every=2, sample_every=1, console=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        loss = nn.functional.mse_loss(model(x), y) * loss_scale
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(loss)
    mon.close()
    return mon


def test_finite_huge_weight_row_is_huge_not_non_finite() -> None:
    mon = _train(_model(1e30))
    assert math.isinf(float(torch.linalg.vector_norm(mon.model[0].weight.detach())))  # fp32
    first = mon.history[0].extra  # step 0: the localiser's hooks measure the weights
    assert "nonfinite_params" not in first and "nonfinite_grads" not in first
    assert first["huge_params"] == {"0.weight": float(torch.tensor(1e30))}  # fp32's 1e30
    r020 = [f for f in mon.findings if f.code == "R020"]
    assert len(r020) == 1 and r020[0].severity == Severity.WARNING, r020
    assert "finite but huge" in r020[0].message and "1e+30 in 0.weight" in r020[0].message
    assert "non-finite values" not in r020[0].message
    assert {f.code for f in mon.findings} & {"R010", "R190"} == set()


def test_inf_weight_row_is_non_finite_and_named() -> None:
    mon = _train(_model(math.inf))
    r020 = [f for f in mon.findings if f.code == "R020"]
    assert r020 and r020[0].severity == Severity.ERROR, mon.findings
    assert "parameter(s) hold non-finite values (first: 0.weight)" in r020[0].message
    assert "0.weight" in r020[0].data["params"]
    assert "finite but huge" not in r020[0].message


def test_finite_huge_gradients_give_a_finite_total_norm() -> None:
    """Gradients near 1e25: each fp32 square overflows; the float64 total does not."""
    model = _model(1.0)
    mon = _train(model, loss_scale=1e25)
    norms = [rec.grad_norm for rec in mon.history]
    assert len(norms) == 4 and all(n is not None and math.isfinite(n) and n > 1e24 for n in norms)
    huge = mon.history[0].extra["huge_grads"]
    assert huge and all(v >= 1e24 for v in huge.values())
    assert "nonfinite_grads" not in mon.history[0].extra
    assert {f.code for f in mon.findings} & {"R010", "R190"} == set()
    r020 = [f for f in mon.findings if f.code == "R020"]
    assert len(r020) == 1 and "finite but huge gradients" in r020[0].message
