"""The live model's layout: its stack of blocks, norm placement, step-0 activation scale.

Blocks are the largest ``ModuleList`` of same-typed modules (``transformer.h``,
``model.layers``, ``encoder.layer`` ...). Norm placement is read from the residual
structure of the first block's first training forward (where its norms sit relative to
the residual adds, :mod:`sapper.monitor.residual`), not from the order its modules run
in. The hooks run once and are removed; a block that cannot be traced (a compiled or
scripted one, a failure in the tracer) gives ``unknown``, never an error in training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sapper.monitor.residual import ResidualTracer

__all__ = ["StructureProbe", "find_blocks", "first_tensor", "is_norm"]


def is_norm(module: nn.Module) -> bool:
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d)):
        return True
    rms = getattr(nn, "RMSNorm", None)
    if rms is not None and isinstance(module, rms):
        return True
    return "norm" in type(module).__name__.lower()


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The transformer's stack of blocks: the longest ModuleList of one module type."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) < 2:
            continue
        kinds = {type(m) for m in mod}
        if len(kinds) != 1 or not any(True for _ in mod[0].parameters()):
            continue
        if best is None or len(mod) > len(best[1]):
            best = (name, mod)
    return best


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first floating tensor in a module output (tensor, tuple, dict, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            t = first_tensor(v)
            if t is not None:
                return t
    return None


class StructureProbe:
    """Hooks for the first training forward only; results go to the step's slot."""

    def __init__(self, model: nn.Module, guard: Callable[..., Any]) -> None:
        self.guard = guard
        found = find_blocks(model)
        self.prefix = found[0] if found else None
        self.blocks = found[1] if found else None
        self.stds: list[torch.Tensor] = []
        self.placement = "unknown"
        self._tracer: ResidualTracer | None = None
        self._traced = False
        self._handles: list[Any] = []
        self._forward: tuple[nn.Module, Any, Any] | None = None

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks) if self.blocks is not None else 0

    def arm(self) -> None:
        if self.blocks is None or self._handles:
            return
        first = self.blocks[0]
        self._handles.append(first.register_forward_pre_hook(self._stack_in, with_kwargs=True))
        for block in self.blocks:
            self._handles.append(block.register_forward_hook(self._block_out))
        if hasattr(first, "_orig_mod") or isinstance(first, torch.jit.ScriptModule):
            return  # compiled or scripted: its forward is not run op by op
        for mod in first.modules():
            if is_norm(mod) and not any(True for _ in mod.children()):
                self._handles.append(mod.register_forward_hook(self._norm_out))
        self._wrap_forward(first)

    def _wrap_forward(self, block: nn.Module) -> None:
        """Trace the block's first forward: an instance ``forward`` (restored on disarm) so
        that the tracing mode is left even when the forward raises."""
        own = block.__dict__.get("forward")
        inner = block.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self._traced or _compiling():
                return inner(*args, **kwargs)
            self._traced = True
            tracer = self.guard("structure", self._start, args, kwargs)
            if tracer is None:
                return inner(*args, **kwargs)
            with tracer:
                out = inner(*args, **kwargs)
            self.guard("structure", self._finish, tracer, out)
            return out

        block.forward = forward
        self._forward = (block, forward, own)

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ResidualTracer | None:
        x = kwargs.get("hidden_states")
        x = x if isinstance(x, torch.Tensor) else first_tensor(args)
        if x is None:
            return None
        tracer = ResidualTracer()
        tracer.seed(x)
        self._tracer = tracer
        return tracer

    def _finish(self, tracer: ResidualTracer, out: Any) -> None:
        tracer.finish(out)
        self.placement = tracer.placement()
        self._tracer = None

    def _norm_out(self, module: nn.Module, args: Any, output: Any) -> None:
        tracer = self._tracer
        if tracer is not None:
            tracer.mark_norm(first_tensor(args), first_tensor(output))

    def _stack_in(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if not self.stds:
            self._block_out(module, (), (args, kwargs.get("hidden_states")))

    def _block_out(self, module: nn.Module, args: Any, output: Any) -> None:
        def measure() -> None:
            t = first_tensor(output)
            if t is not None:
                with torch.no_grad():
                    self.stds.append(t.detach().float().std())

        self.guard("structure", measure)

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._tracer = None
        if self._forward is not None:
            block, forward, own = self._forward
            self._forward = None
            if block.__dict__.get("forward") is forward:
                if own is None:
                    del block.__dict__["forward"]
                else:
                    block.__dict__["forward"] = own

    def result(self) -> tuple[str, list[torch.Tensor]]:
        """Placement string and the std of the stack's input followed by the std of
        each block's output (device tensors)."""
        return self.placement, list(self.stds)


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    return bool(is_compiling()) if callable(is_compiling) else False
