"""The global gradient norm for plain and engine-managed gradients (sharded: see the
multi-process FSDP2 test)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from sapper.distributed import engine_grad_norm, global_grad_norm, to_global
from sapper.distributed.checksum import ParamChecksum, mesh_replica_groups
from sapper.distributed.gradnorm import is_deepspeed_engine


def model_with_grads() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    m(torch.randn(5, 8)).pow(2).sum().backward()
    return m


def test_plain_gradients_match_clip_grad_norm() -> None:
    m = model_with_grads()
    ours = global_grad_norm(m)
    assert ours is not None and ours.dim() == 0
    ref = nn.utils.clip_grad_norm_(m.parameters(), 1e9)
    assert float(ours) == pytest.approx(float(ref), rel=1e-6)
    inf = global_grad_norm(list(m.parameters()), norm_type=math.inf)
    assert float(inf) == pytest.approx(max(float(p.grad.abs().max()) for p in m.parameters()))
    assert global_grad_norm(nn.Linear(2, 2)) is None


class FakeEngine:
    """The part of a DeepSpeed engine sapper uses: ``module`` and the global norm."""

    def __init__(self, norm: object) -> None:
        self.module = nn.Linear(2, 2)
        self._norm = norm

    def get_global_grad_norm(self) -> object:
        return self._norm


def test_deepspeed_engine_norm_is_taken_from_the_engine() -> None:
    assert is_deepspeed_engine(FakeEngine(1.0)) and not is_deepspeed_engine(nn.Linear(1, 1))
    assert float(global_grad_norm(FakeEngine(2.5))) == 2.5
    assert float(engine_grad_norm(FakeEngine(torch.tensor([3.5])))) == 3.5
    assert global_grad_norm(FakeEngine(None)) is None  # before the first step


def test_to_global_passes_plain_norms_through() -> None:
    assert float(to_global(1.5)) == 1.5
    t = torch.tensor(2.0)
    assert to_global(t) is t


def test_checksum_changes_with_one_weight_and_plain_params_have_no_mesh() -> None:
    m = model_with_grads()
    ck = ParamChecksum(m.parameters())
    before = float(ck.compute())
    assert float(ck.compute()) == before  # deterministic
    with torch.no_grad():
        m[2].bias[0] += 1e-4
    assert float(ck.compute()) != before
    assert mesh_replica_groups(m.parameters()) is None
    assert ParamChecksum([]).compute() is None


def test_finite_huge_gradients_have_a_finite_global_norm() -> None:
    """fp32 squares of 1e30 overflow; the norm is summed in float64."""
    m = nn.Linear(4, 4)
    for p in m.parameters():
        p.grad = torch.full_like(p, 1e30)
    norm = global_grad_norm(m)
    assert norm is not None and math.isfinite(float(norm))
    assert float(norm) == pytest.approx(1e30 * math.sqrt(20), rel=1e-6)
