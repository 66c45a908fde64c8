"""Counts of the training setup the first step shows: which tensors the optimizer holds,
which are trainable, which received a gradient, and the precision the forward runs in
(the trainable weights' dtype, autocast's dtype when it is on): what later tells an fp16
run, where loss scaling and fp16's range are in play, from a bf16 or fp32 one.

Everything here is host-side (tensor identities, ``requires_grad``, ``.grad is None``):
no device value is read, so the counts cost no sync and can be reported the moment they
are known, at the first forward pass and the first optimizer step
(:mod:`sapper.runtime.detectors.setup` judges them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["SetupProbe", "forward_precision"]

_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """autocast's dtype for ``device_type`` when it is on (torch >= 2.4 asks by device
    type; older releases have one call per device)."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):
        if device_type == "cpu":
            on, dtype = torch.is_autocast_cpu_enabled, torch.get_autocast_cpu_dtype
        else:
            on, dtype = torch.is_autocast_enabled, torch.get_autocast_gpu_dtype
        return dtype() if on() else None


def forward_precision(params: Sequence[torch.Tensor]) -> dict[str, str]:
    """``param_dtype`` (the most common dtype of the trainable floating-point weights)
    and, when autocast is on around this forward, ``autocast_dtype``; short names."""
    kinds = Counter(p.dtype for p in params if p.requires_grad and p.is_floating_point())
    out: dict[str, str] = {}
    if kinds:
        dtype = kinds.most_common(1)[0][0]
        out["param_dtype"] = _SHORT.get(dtype, str(dtype).removeprefix("torch."))
        device = next(p.device.type for p in params if p.dtype == dtype)
        cast = _autocast_dtype(device)
        if cast is not None:
            out["autocast_dtype"] = _SHORT.get(cast, str(cast).removeprefix("torch."))
    return out


class SetupProbe:
    """The model's and the optimizer's parameter tensors, counted when asked.

    ``opt_params`` is None when the monitor sees no torch optimizer: the optimizer's
    counts are then left out (the detector judges only the model's).
    """

    def __init__(self, model: nn.Module, opt_params: Sequence[torch.Tensor] | None) -> None:
        self.model = model
        self.opt_params = list(opt_params) if opt_params is not None else None

    def forward_facts(self) -> dict[str, Any]:
        """At the first training forward pass: what exists, what can train, and the
        precision it runs in."""
        params = list(self.model.parameters())
        facts: dict[str, Any] = {
            "model_params": len(params),
            "trainable_params": sum(1 for p in params if p.requires_grad),
            **forward_precision(params),
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
