"""Counts of the training setup the first step shows: which tensors the optimizer holds,
which are trainable, which received a gradient.

Everything here is host-side (tensor identities, ``requires_grad``, ``.grad is None``):
no device value is read, so the counts cost no sync and can be reported the moment they
are known, at the first forward pass and the first optimizer step
(:mod:`sapper.runtime.detectors.setup` judges them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["SetupProbe"]


class SetupProbe:
    """The model's and the optimizer's parameter tensors, counted when asked.

    ``opt_params`` is None when the monitor sees no torch optimizer: the optimizer's
    counts are then left out (the detector judges only the model's).
    """

    def __init__(self, model: nn.Module, opt_params: Sequence[torch.Tensor] | None) -> None:
        self.model = model
        self.opt_params = list(opt_params) if opt_params is not None else None

    def forward_facts(self) -> dict[str, int]:
        """At the first training forward pass: what exists and what can train."""
        params = list(self.model.parameters())
        facts = {
            "model_params": len(params),
            "trainable_params": sum(1 for p in params if p.requires_grad),
        }
        if self.opt_params is not None:
            own = {id(p) for p in params}
            facts.update(
                opt_params=len(self.opt_params),
                opt_model_params=sum(1 for p in self.opt_params if id(p) in own),
                opt_trainable_params=sum(1 for p in self.opt_params if p.requires_grad),
            )
        return facts

    def step_facts(self) -> dict[str, int]:
        """At the first optimizer step: which tensors hold a gradient (``.grad`` set)."""
        if self.opt_params is None:
            return {}
        return {
            "opt_params_with_grad": sum(1 for p in self.opt_params if p.grad is not None),
            "model_params_with_grad": sum(
                1 for p in self.model.parameters() if p.grad is not None
            ),
        }
