"""Where a low-precision step first goes non-finite: a module's forward, the loss, or backward.

A step that ends in NaN under fp16 can have overflowed in three places, and each has a
different fix: an activation inside the model (keep that module in fp32, S006), the loss
computation outside it (a softmax, ``exp`` or sum done in fp16 by the user's loss; no loss
scale helps), or only the backward (the gradients times the loss scale overflow: the scale
is the cause). This module runs the user's step once under a ``TorchFunctionMode`` that sees
every torch call's output, with forward hooks keeping the stack of modules being run; the
first output that is not finite is the origin, named by its module (or "loss" when no
module of the model is running) and its op. Only NaN and +inf count: -inf is how attention
masks are written, so an overflow that gives -inf alone is named where it turns into NaN.
Low-precision values produced outside the model's forward are measured too (their largest
finite |x|): they are the loss computation's fp16 headroom.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from sapper.smoke.batches import Batch
from sapper.smoke.step import Precision, StepOptions, TrainStep

__all__ = ["StepTrace", "trace_step"]

_LOW = (torch.float16, torch.bfloat16)


@dataclass
class StepTrace:
    """The first non-finite value of one step, and the loss computation's largest
    low-precision value."""

    phase: str | None = None  # "forward", "loss", "backward" or None (all finite)
    module: str | None = None  # innermost module running when it appeared (forward)
    op: str | None = None  # the torch call whose output it was
    loss_max_low: float = 0.0  # largest finite |x| of an fp16/bf16 tensor outside the model
    loss_max_op: str | None = None
    loss: float = math.nan

    def where(self) -> str:
        """One phrase naming the origin, for a message."""
        if self.phase == "forward":
            return f"the forward, in {self.module} ({self.op})"
        if self.phase == "loss":
            return f"the loss computation ({self.op}, outside the model's forward)"
        if self.phase == "backward":
            return "the backward only (forward and loss finite)"
        return "nowhere (every value finite)"


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    return name.strip("_") or name


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, tuple | list):
        for item in out:
            if isinstance(item, torch.Tensor):
                yield item


class _Watch(TorchFunctionMode):
    def __init__(self, stack: list[str], trace: StepTrace) -> None:
        super().__init__()
        self.stack = stack
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        trace = self.trace
        for t in _tensors(out):
            if not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
                continue
            t = t.detach()
            if not self.stack and t.dtype in _LOW:
                finite = t[torch.isfinite(t)]
                value = float(finite.abs().max()) if finite.numel() else 0.0
                if value > trace.loss_max_low:
                    trace.loss_max_low, trace.loss_max_op = value, _op_name(func)
            # -inf is how attention masks are written (masked_fill, additive masks): only
            # NaN and +inf mark an overflow
            if trace.phase is None and bool((torch.isnan(t) | (t == math.inf)).any()):
                trace.phase = "forward" if self.stack else "loss"
                trace.module = self.stack[-1] if self.stack else None
                trace.op = _op_name(func)
        return out


def trace_step(
    model: nn.Module,
    step: TrainStep,
    batches: list[Batch],
    precision: Precision,
    loss_scale: float | None = None,
) -> StepTrace:
    """Run ``step`` once on ``model`` and say where the first non-finite value appeared."""
    trace = StepTrace()
    stack: list[str] = []
    names = {m: n or type(model).__name__ for n, m in model.named_modules()}

    def push(module: nn.Module, *_: Any) -> None:
        stack.append(names[module])

    def pop(module: nn.Module, *_: Any) -> None:
        if stack:
            stack.pop()

    handles = []
    for module in names:
        handles.append(module.register_forward_pre_hook(push))
        handles.append(module.register_forward_hook(pop, always_call=True))
    try:
        with _Watch(stack, trace):
            res = step(model, batches, StepOptions(precision=precision, loss_scale=loss_scale))
    finally:
        for h in handles:
            h.remove()
    trace.loss = res.loss
    if trace.phase is None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if any(not bool(torch.isfinite(g).all()) for g in grads):
            trace.phase = "backward"
    return trace
