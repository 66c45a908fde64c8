"""Gradient statistics on sampled steps, and localisation of the first non-finite value.

Both run only on some steps. On a *sampled* step (every ``sample_every`` steps) the
optimizer pre-hook computes every parameter's gradient norm in one fused call
(``torch._foreach_norm``) and the count of exactly-zero gradient elements outside
embedding tables; the host later derives per-layer and per-group norms, all-zero (dead)
parameters and non-finite gradients from them. After a non-finite loss or gradient norm
has been read, :class:`Localiser` arms a forward hook on every module for one step and
records, in execution order, whether each module's output (and input) was finite, and,
through a tensor hook on each output, in backward order whether the gradient arriving
there was finite (an overflow in the backward pass); anomaly mode is never used. Sampled
steps arm the same hooks, so a fault that is present on a sampled step is named exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sapper.monitor.collect import StepSlot
from sapper.monitor.structure import first_tensor
from sapper.runtime.records import StepRecord

__all__ = ["GradStats", "Localiser"]


def _grouped_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-tensor L2 norms as one float32 vector (fused per device and dtype)."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for idx in groups.values():
        norms = torch._foreach_norm([tensors[i] for i in idx])
        for i, n in zip(idx, norms, strict=True):
            out[i] = n
    device = tensors[0].device
    return torch.stack([n.float().to(device) for n in out if n is not None])


class GradStats:
    """Per-parameter gradient norms and zero counts on sampled (or armed) steps."""

    def __init__(
        self,
        model: nn.Module,
        params: list[torch.nn.Parameter],
        block_prefix: str | None,
        groups: list[int] | None = None,
    ):
        names = {id(p): n for n, p in model.named_parameters()}
        self.params = params
        #: Optimizer parameter group of each parameter.
        self.groups = groups or [0] * len(params)
        self.names = [names.get(id(p), f"param{i}") for i, p in enumerate(params)]
        embed = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        self.counted = [id(p) not in embed for p in params]
        self.block_prefix = block_prefix + "." if block_prefix else None

    def measure(self, slot: StepSlot, values: bool = False) -> None:
        """Queue the device statistics of the current gradients (and, when ``values``,
        of the parameters themselves) into ``slot``."""
        with_grad = [
            i for i, p in enumerate(self.params) if p.grad is not None and not p.grad.is_sparse
        ]
        if not with_grad:
            return
        grads = [self.params[i].grad for i in with_grad]
        slot.add_f("param_grad_norm", _grouped_norms(grads))  # type: ignore[arg-type]
        zero = [
            (self.params[i].grad == 0).sum()  # type: ignore[union-attr]
            for i in with_grad
            if self.counted[i]
        ]
        if zero:
            slot.add_f("grad_zero_count", torch.stack([z.float() for z in zero]).sum())
        numel = sum(self.params[i].numel() for i in with_grad if self.counted[i])
        if values:
            slot.add_f(
                "param_value_norm", _grouped_norms([self.params[i].detach() for i in with_grad])
            )
        slot.extra["grad_sampled"] = True
        slot.decoders.append(self._decoder(with_grad, numel, values))

    def _decoder(self, idx: list[int], numel: int, values: bool) -> Callable[..., None]:
        def decode(slot: StepSlot, f: dict, ints: dict, rec: StepRecord) -> None:
            norms = f.get("param_grad_norm", [])
            if len(norms) != len(idx):
                return
            names = [self.names[i] for i in idx]
            have = set(idx)
            missing = [
                self.names[i]
                for i, p in enumerate(self.params)
                if i not in have and p.requires_grad
            ]
            rec.extra["zero_grad_params"] = [
                n for n, v in zip(names, norms, strict=True) if v == 0
            ] + missing
            bad = [n for n, v in zip(names, norms, strict=True) if not math.isfinite(v)]
            if bad and (values or not rec.skipped):
                rec.extra["nonfinite_grads"] = bad
            if f.get("grad_zero_count") and numel:
                rec.extra["grad_zero_share"] = f["grad_zero_count"][0] / numel
            rec.extra["grad_norm_layers"] = self._layers(names, norms)
            if max(self.groups, default=0) > 0:
                sums: dict[int, float] = {}
                for i, v in zip(idx, norms, strict=True):
                    sums[self.groups[i]] = sums.get(self.groups[i], 0.0) + v * v
                rec.extra["grad_norm_groups"] = [
                    math.sqrt(sums.get(g, 0.0)) for g in range(max(self.groups) + 1)
                ]
            if values and f.get("param_value_norm"):
                vals = f["param_value_norm"]
                bad_vals = [n for n, v in zip(names, vals, strict=True) if not math.isfinite(v)]
                if bad_vals:
                    rec.extra["nonfinite_params"] = bad_vals

        return decode

    def _layers(self, names: list[str], norms: list[float]) -> dict[str, float]:
        if self.block_prefix is None:
            return {}
        sums: dict[str, float] = {}
        for name, v in zip(names, norms, strict=True):
            if not name.startswith(self.block_prefix):
                continue
            index = name[len(self.block_prefix) :].split(".", 1)[0]
            key = self.block_prefix + index
            sums[key] = sums.get(key, 0.0) + v * v
        return {k: math.sqrt(v) for k, v in sums.items()}


class Localiser:
    """Forward hooks on every module for one step, recording finiteness in call order."""

    def __init__(self, model: nn.Module, guard: Callable[..., Any]) -> None:
        self.model = model
        self.guard = guard
        self.modules = [(n, m) for n, m in model.named_modules() if m is not model]
        self.names: list[str] = []
        self.grad_names: list[str] = []
        self._handles: list[Any] = []
        self.slot: StepSlot | None = None
        self.armed_runs = 0

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        if self._handles:
            return
        self.armed_runs += 1
        for name, mod in self.modules:
            self._handles.append(mod.register_forward_hook(self._hook(name)))

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def bind(self, slot: StepSlot) -> None:
        """Record into ``slot`` (the step being run)."""
        if self.slot is not slot:
            self.slot = slot
            self.names = names = []
            self.grad_names = grad_names = []
            slot.decoders.append(lambda s, f, i, rec: self._decode(names, grad_names, f, rec))

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.guard("localise", self._record, name, args, output)

        return hook

    def _record(self, name: str, args: Any, output: Any) -> None:
        out = first_tensor(output)
        slot = self.slot
        if out is None or slot is None:
            return
        inp = first_tensor(args)
        with torch.no_grad():
            slot.add_f("mod_out_bad", (~torch.isfinite(out.detach())).any().float())
            if inp is not None:
                bad_in = (~torch.isfinite(inp.detach())).any().float()
            else:
                bad_in = out.new_zeros((), dtype=torch.float32)
            slot.add_f("mod_in_bad", bad_in)
        self.names.append(name)
        if out.requires_grad:
            grad_names = self.grad_names
            out.register_hook(
                lambda g: self.guard("localise", self._grad, slot, grad_names, name, g)
            )

    @staticmethod
    def _grad(slot: StepSlot, names: list[str], name: str, grad: torch.Tensor) -> None:
        """Backward reaches ``name``'s output: is the gradient there still finite?"""
        with torch.no_grad():
            slot.add_f("mod_grad_bad", (~torch.isfinite(grad.detach())).any().float())
        names.append(name)

    @staticmethod
    def _decode(names: list[str], grad_names: list[str], f: dict, rec: StepRecord) -> None:
        outs, ins = f.get("mod_out_bad", []), f.get("mod_in_bad", [])
        for name, o, i in zip(names, outs, ins, strict=False):
            if o:
                rec.extra["nonfinite_module"] = name
                rec.extra["nonfinite_module_input_finite"] = not i
                break
        for name, g in zip(grad_names, f.get("mod_grad_bad", []), strict=False):
            if g:
                rec.extra["nonfinite_grad_module"] = name
                break
