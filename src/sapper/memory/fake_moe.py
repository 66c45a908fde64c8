"""Mixture-of-experts layers on fake tensors, for the traced estimator.

transformers (5.x) runs an MoE block's experts through one of its experts
implementations (``config._experts_implementation``); each needs a different answer
before ``FakeTensorMode`` can follow it:

* ``grouped_mm`` (the default): every tensor is sized by the ``tokens × top_k`` routed
  pairs, whatever the routing; only the per-expert offsets carry data. Its memory is
  therefore routing-independent and the fake step can be exact. What stops it is
  PyTorch's shape function for ``aten._grouped_mm``, written after the CUDA kernel's
  checks: it rejects anything but bf16, while the CPU kernel (the one a CPU step runs)
  multiplies fp32 too. :class:`GroupedMMShapes` answers that op's shape itself.
* ``eager``: a Python loop over the experts that were hit, each taking the tokens
  ``torch.where`` finds for it — sizes that exist only in real data.
  :func:`balanced_routing` replaces the loop's data-dependent choices with a fixed,
  balanced routing: token ``t``'s ``j``-th choice is expert ``(t·k + j) mod E``, so
  every token goes to ``top_k`` distinct experts (when ``top_k ≤ E``) and each expert
  gets ``t·k/E`` of them. The tensors backward keeps are summed over experts (gathered
  inputs, intermediate activations, outputs: ``tokens × top_k`` rows in all), so they do
  not depend on the routing; only the largest expert's transient tensors do, and with a
  balanced load they are the expected ones. A collapsed router (every token to the same
  experts) would make one expert's temporaries ``E/k`` times larger.
* ``batched_mm`` gathers each pair's weights and runs on fake tensors unchanged.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["GroupedMMShapes", "balanced_routing", "fake_moe_support", "prepare_experts"]

_GROUPED_MM = torch.ops.aten._grouped_mm.default if hasattr(torch.ops.aten, "_grouped_mm") else None


def _grouped_mm_shape(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> list[int]:
    """The output shape of ``_grouped_mm(a, b, offs)`` (as ``_create_grouped_mm_output_tensor``
    in torch/_meta_registrations.py computes it): 2D×3D is a grouped linear (rows of ``a``
    split by ``offs``), 2D×2D the per-group weight gradient, 3D×2D its transpose, 3D×3D a
    batched matmul."""
    groups = offs.size(0) if offs is not None else 0
    if a.dim() == 2 and b.dim() == 2:
        return [groups, a.size(0), b.size(1)]
    if a.dim() == 2:
        return [a.size(0), b.size(-1)]
    if b.dim() == 2:
        return [a.size(1), b.size(1)]
    return [a.size(0), a.size(1), b.size(-1)]


class GroupedMMShapes(TorchDispatchMode):
    """Answers ``aten._grouped_mm`` for the dtypes the CPU kernel takes but PyTorch's
    shape function refuses (it checks the CUDA kernel's bf16-only rule). Entered above
    ``FakeTensorMode``: the output is an empty (fake) tensor of the right shape, dtype and
    layout; every other op passes through."""

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is _GROUPED_MM and args[0].dtype != torch.bfloat16:
            a, b = args[0], args[1]
            offs = args[2] if len(args) > 2 else kwargs.get("offs")
            dtype = kwargs.get("out_dtype") or (args[4] if len(args) > 4 else None) or a.dtype
            return torch.empty(_grouped_mm_shape(a, b, offs), dtype=dtype, device=a.device)
        return func(*args, **kwargs)


def _balanced_eager_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """transformers' eager experts loop (``MixtralExperts.forward`` and its copies) with
    the routing fixed to :func:`balanced_routing`'s: the same ops, on the same sizes a
    balanced router gives; the router's own choice is not read."""
    num_tokens, k = top_k_index.shape
    num_experts = self.num_experts
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        # what the loop computes to find the hit experts (their count is data)
        expert_mask = nn.functional.one_hot(top_k_index, num_classes=num_experts + 1)
        expert_mask = expert_mask.permute(2, 1, 0)
        torch.greater(expert_mask.sum(dim=(-1, -2)), 0)
    pairs = num_tokens * k
    for expert_idx in range(num_experts):
        if expert_idx >= pairs:
            break
        with torch.no_grad():
            flat = torch.arange(expert_idx, pairs, num_experts, device=hidden_states.device)
            token_idx, top_k_pos = flat // k, flat % k
        current_state = hidden_states[token_idx]
        if getattr(self, "has_gate", True):
            gate, up = nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(
                2, dim=-1
            )
            current = self.act_fn(gate) * up
        else:
            current = self.act_fn(nn.functional.linear(current_state, self.up_proj[expert_idx]))
        current = nn.functional.linear(current, self.down_proj[expert_idx])
        current = current * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current.to(final_hidden_states.dtype))
    return final_hidden_states


def balanced_routing(num_tokens: int, top_k: int, num_experts: int) -> list[int]:
    """Routed pairs per expert under the estimated routing: pair ``t·k + j`` goes to
    expert ``(t·k + j) mod E``."""
    pairs = num_tokens * top_k
    return [len(range(e, pairs, num_experts)) for e in range(num_experts)]


def _experts_modules(model: nn.Module) -> Iterator[nn.Module]:
    for module in model.modules():
        if hasattr(module, "_is_expert_parallel") and hasattr(module, "down_proj"):
            yield module


def prepare_experts(model: nn.Module) -> list[str]:
    """Make the model's experts runnable on fake tensors; returns notes on what was
    assumed (nothing for dense models)."""
    impls: set[str] = set()
    for module in _experts_modules(model):
        impl = getattr(getattr(module, "config", None), "_experts_implementation", None)
        impl = impl or "grouped_mm"
        impls.add(impl)
        if impl == "eager":
            module.forward = types.MethodType(_balanced_eager_forward, module)
    notes = []
    if "eager" in impls:
        notes.append(
            "MoE experts (eager loop) traced with a balanced routing: each token to top_k "
            "distinct experts, tokens·top_k/E per expert (what backward keeps does not "
            "depend on the routing; the largest expert's temporaries do)."
        )
    if impls - {"eager"}:
        notes.append(
            f"MoE experts ({', '.join(sorted(impls - {'eager'}))}): tensor sizes do not "
            "depend on the routing; traced exactly."
        )
    return notes


@contextlib.contextmanager
def fake_moe_support() -> Iterator[None]:
    """The shape rule for ``_grouped_mm`` while a fake step runs."""
    if _GROUPED_MM is None:
        yield
        return
    with GroupedMMShapes():
        yield
