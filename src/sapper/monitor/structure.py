"""The live model's layout: its stack of blocks, norm placement, step-0 activation scale.

Blocks are the largest ``ModuleList`` of same-typed modules (``transformer.h``,
``model.layers``, ``encoder.layer`` ...). Norm placement is read from the order in which
the first block runs its norms and its weight-carrying leaf modules during the first
training forward: a norm first and a weight last is Pre-LN, a weight first and a norm last
is Post-LN, norms at both ends is sandwich. The hooks run once and are removed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

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


def _placement(order: list[bool]) -> str:
    """``order``: True for a norm, False for a weight layer, in call order."""
    if not order:
        return "unknown"
    if not any(order):
        return "none"
    first, last = order[0], order[-1]
    if first and last:
        return "sandwich"
    if first:
        return "pre"
    if last:
        return "post"
    return "unknown"


class StructureProbe:
    """Hooks for the first training forward only; results go to the step's slot."""

    def __init__(self, model: nn.Module, guard: Callable[..., Any]) -> None:
        self.guard = guard
        found = find_blocks(model)
        self.prefix = found[0] if found else None
        self.blocks = found[1] if found else None
        self.order: list[bool] = []
        self.stds: list[torch.Tensor] = []
        self._handles: list[Any] = []

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks) if self.blocks is not None else 0

    def arm(self) -> None:
        if self.blocks is None or self._handles:
            return
        self._handles.append(
            self.blocks[0].register_forward_pre_hook(self._stack_in, with_kwargs=True)
        )
        for block in self.blocks:
            self._handles.append(block.register_forward_hook(self._block_out))
        for mod in self.blocks[0].modules():
            has_weights = any(True for _ in mod.parameters(recurse=False))
            if is_norm(mod) or (has_weights and not list(mod.children())):
                self._handles.append(mod.register_forward_pre_hook(self._leaf(is_norm(mod))))

    def _leaf(self, norm: bool) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self.order.append(norm)

        return hook

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

    def result(self) -> tuple[str, list[torch.Tensor]]:
        """Placement string and the std of the stack's input followed by the std of
        each block's output (device tensors)."""
        return _placement(self.order), list(self.stds)
