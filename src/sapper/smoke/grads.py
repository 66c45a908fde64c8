"""Gradients as data: collect them, group them by layer, and compare two runs.

Two runs that should be equivalent (accumulation vs one batch, checkpointing on vs off,
bf16 vs fp32, DP vs one process) are compared per layer by the relative error
‖a − b‖ / ‖b‖ and the cosine similarity, plus one global relative error over all
parameters. Per-layer numbers say *where* two runs part, which a global number hides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["GradComparison", "LayerDiff", "collect_grads", "compare_grads", "layer_of"]

_INDEX = re.compile(r"^(.*?\.\d+)\.")


def layer_of(param_name: str) -> str:
    """The layer a parameter belongs to: the block prefix (``model.layers.3``) for block
    parameters, else the owning module (``model.embed_tokens``, ``lm_head``)."""
    name = param_name.removeprefix("module.")
    m = _INDEX.match(name)
    if m:
        return m.group(1)
    return name.rpartition(".")[0] or name


def collect_grads(model: nn.Module, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """fp32 copies of every trainable parameter's gradient, divided by ``scale`` (the loss
    scale the step applied); a parameter without a gradient reads as zeros."""
    out = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        grad = torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float()
        out[name.removeprefix("module.")] = (grad / scale).cpu()
    return out


@dataclass
class LayerDiff:
    layer: str
    rel_err: float
    cosine: float
    ref_norm: float
    finite: bool = True


@dataclass
class GradComparison:
    """``test`` against the reference ``ref``: per-layer differences and global numbers."""

    layers: list[LayerDiff] = field(default_factory=list)
    rel_err: float = 0.0
    cosine: float = 1.0
    finite: bool = True

    @property
    def worst(self) -> LayerDiff | None:
        return max(self.layers, key=lambda d: _sortable(d.rel_err), default=None)

    @property
    def min_cosine(self) -> float:
        return min((d.cosine for d in self.layers), default=1.0)

    @property
    def max_rel_err(self) -> float:
        return max((d.rel_err for d in self.layers), default=0.0)

    def table(self) -> list[dict[str, object]]:
        return [
            {"layer": d.layer, "rel_err": d.rel_err, "cosine": d.cosine, "finite": d.finite}
            for d in self.layers
        ]


def _sortable(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, bool]:
    finite = bool(torch.isfinite(a).all())
    ref_norm = float(b.norm())
    if not finite:
        return math.inf, math.nan, ref_norm, False
    err = float((a - b).norm())
    if ref_norm == 0.0:
        rel = 0.0 if err == 0.0 else math.inf
    else:
        rel = err / ref_norm
    na = float(a.norm())
    if na == 0.0 and ref_norm == 0.0:
        cos = 1.0
    elif na == 0.0 or ref_norm == 0.0:
        cos = 0.0
    else:
        cos = float(torch.dot(a, b)) / (na * ref_norm)
    return rel, cos, ref_norm, True


def _flat(grads: dict[str, torch.Tensor], names: Iterable[str]) -> torch.Tensor:
    return torch.cat([grads[n].reshape(-1).double() for n in names])


def compare_grads(
    test: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> GradComparison:
    """Per-layer and global relative error and cosine of ``test`` against ``ref``."""
    names = [n for n in ref if n in test]
    by_layer: dict[str, list[str]] = {}
    for n in names:
        by_layer.setdefault(layer_of(n), []).append(n)
    out = GradComparison()
    for layer, members in by_layer.items():
        rel, cos, norm, finite = _diff(_flat(test, members), _flat(ref, members))
        out.layers.append(LayerDiff(layer, rel, cos, norm, finite))
    rel, cos, _, finite = _diff(_flat(test, names), _flat(ref, names))
    out.rel_err, out.cosine, out.finite = rel, cos, finite
    return out
