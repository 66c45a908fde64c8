"""The global gradient norm, right for replicated and sharded gradients alike.

Seed §2.3 clips and reads the *global* norm. Under DDP every rank holds the full,
all-reduced gradient, so the local norm is the global one. Under FSDP2 (``fully_shard``)
and tensor parallelism gradients are DTensors: each rank holds a shard, and the norm of
the local shard is not the norm of anything — the squares of the local shards must be
summed across the mesh dimensions the gradient is sharded on (and not across the ones it
is replicated on, which would count it twice). A DeepSpeed engine computes the global norm
itself (across ZeRO partitions) and exposes it as ``get_global_grad_norm()``.

All functions return a 0-dim tensor on the gradients' device and never call ``.item()``:
no host sync. With DTensor gradients the computation is a collective on the training
mesh, so every rank must call it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "engine_grad_norm",
    "global_grad_norm",
    "is_deepspeed_engine",
    "is_dtensor",
    "settle",
    "to_global",
]


def is_deepspeed_engine(obj: Any) -> bool:
    """Duck-typed: a DeepSpeed engine has ``get_global_grad_norm`` and wraps ``module``."""
    return callable(getattr(obj, "get_global_grad_norm", None)) and hasattr(obj, "module")


def engine_grad_norm(engine: Any) -> torch.Tensor | None:
    """The norm a DeepSpeed engine computed in its last ``step()`` (None before the first
    step, or when the engine does not track it)."""
    value = engine.get_global_grad_norm()
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return to_global(value).detach().float().reshape(())
    return torch.tensor(float(value))


def to_global(norm: Any) -> torch.Tensor:
    """A norm as returned by ``clip_grad_norm_``: a DTensor norm (FSDP2/TP) becomes the
    full value (a collective); a plain tensor or number is already global."""
    full = getattr(norm, "full_tensor", None)
    if callable(full):
        return full()
    if isinstance(norm, torch.Tensor):
        return norm
    return torch.tensor(float(norm))


@cache
def _dtensor() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.4 keeps it private
        try:
            from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
        except ImportError:
            return None
    return DTensor


def is_dtensor(t: Any) -> bool:
    """``t`` is a DTensor (cheap for plain tensors: an exact type check first)."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return False
    kind = _dtensor()
    return kind is not None and isinstance(t, kind)


def _local_power(tensors: list[torch.Tensor], p: float) -> torch.Tensor:
    """Sum of |g|^p (or max |g| for p = inf) over plain tensors, in float64 (float32 on
    MPS): finite 1e30 gradients have a finite norm, which fp32's squares would not."""
    dtype = torch.float32 if tensors[0].device.type == "mps" else torch.float64
    norms = torch.stack(
        [torch.linalg.vector_norm(t.detach(), p, dtype=dtype) for t in tensors]
    )
    return norms.max() if math.isinf(p) else norms.pow(p).sum()


def global_grad_norm(source: Any, norm_type: float = 2.0) -> torch.Tensor | None:
    """The global ``norm_type`` norm of the gradients of ``source``: a DeepSpeed engine,
    an ``nn.Module`` (DDP/FSDP2-wrapped or not) or an iterable of parameters.

    None when no parameter has a gradient (or the engine has no norm yet).
    """
    if is_deepspeed_engine(source):
        return engine_grad_norm(source)
    params: Iterable[Any] = source.parameters() if hasattr(source, "parameters") else source
    grads = [p.grad for p in params if getattr(p, "grad", None) is not None]
    if not grads:
        return None
    p = float(norm_type)
    plain = [g for g in grads if not is_dtensor(g)]
    sharded: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = {}
    for g in grads:
        if is_dtensor(g):
            g = settle(g)
            dims = tuple(i for i, pl in enumerate(g.placements) if pl.is_shard())
            sharded.setdefault((g.device_mesh, dims), []).append(g.to_local())
    parts: list[torch.Tensor] = []
    device = grads[0].device if not plain else plain[0].device
    if plain:
        parts.append(_local_power(plain, p))
    for (mesh, dims), locals_ in sharded.items():
        acc = _local_power(locals_, p)
        op = dist.ReduceOp.MAX if math.isinf(p) else dist.ReduceOp.SUM
        for dim in dims:  # a sum over a product of mesh dims is a sum over each in turn
            dist.all_reduce(acc, op=op, group=mesh.get_group(dim))
        parts.append(acc.to(device))
    total = torch.stack([t.to(device) for t in parts])
    if math.isinf(p):
        return total.max()
    return total.sum().pow(1.0 / p)


def settle(g: Any) -> Any:
    """A DTensor still pending a sum (``Partial``) is reduced first (a collective): a
    norm of pending partial sums means nothing."""
    if any(pl.is_partial() for pl in g.placements):
        from torch.distributed.tensor import Replicate

        placements = [Replicate() if pl.is_partial() else pl for pl in g.placements]
        return g.redistribute(g.device_mesh, placements)
    return g
