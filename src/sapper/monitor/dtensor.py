"""Sharded values (DTensors) made readable, and their global statistics.

Under FSDP2 (``fully_shard``), HSDP and tensor parallelism, parameters, gradients and
some losses are DTensors: each rank holds a shard, and a DTensor cannot be concatenated
with plain tensors, nor copied to the host with ``tolist()``. Every value the monitor
keeps is therefore *localised* when it is stored (:func:`local_value`), and the
statistics that must describe the whole tensor (the gradient norm, per-parameter norms,
the largest magnitude, zero counts) are computed on the local shards and combined across
the mesh with a single reduction per mesh (:class:`Shards`):

* a sum (squared norms, counts) is an all-reduce over every dimension of the tensor's
  mesh, each rank's part divided by the number of copies it has along the mesh
  dimensions where the tensor is replicated (HSDP's replicate dimension, a TP-replicated
  bias): the copies then add up to the value once, not once per replica;
* a maximum is an all-reduce with MAX over the same ranks (copies change nothing).

Reductions are collectives: they happen only where every rank of the mesh computes the
same value at the same point of the step (the optimizer step pre-hook, on steps chosen
by the step number), never at read time, since reads are due by time and differ between
ranks. Nothing here copies to the host.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch
import torch.distributed as dist

from sapper.distributed import gradnorm
from sapper.distributed.gradnorm import is_dtensor

__all__ = ["Shards", "acc_dtype", "global_norm", "is_dtensor", "local_value", "shard_of"]


def local_value(t: torch.Tensor) -> torch.Tensor:
    """What the monitor stores for ``t``: a plain tensor as it is; a DTensor's local
    tensor, except a pending sum (``Partial``, e.g. a norm or a loss not yet reduced),
    which becomes the full value (a collective, at the point every rank produces it)."""
    if not is_dtensor(t):
        return t
    if any(p.is_partial() for p in t.placements):  # type: ignore[attr-defined]
        return t.full_tensor()  # type: ignore[attr-defined]
    return t.to_local()  # type: ignore[attr-defined]


def shard_of(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``, never a collective (for checks each rank makes on its
    own, such as finiteness in a forward hook armed on one rank only)."""
    return t.to_local() if is_dtensor(t) else t  # type: ignore[attr-defined]


def acc_dtype(device: torch.device) -> torch.dtype:
    """float64 for sums of squares (the square of a finite fp32 value can overflow fp32:
    1e20² = inf), float32 where the device has no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


class Shards:
    """The local parts of a list of tensors, each with its mesh (None: a plain tensor,
    the whole value on this rank) and its replica count, to reduce per-tensor statistics.

    ``settle``: reduce pending (``Partial``) gradients first; a collective, so only where
    every rank builds the same ``Shards`` at the same point.
    """

    def __init__(self, tensors: list[torch.Tensor], settle: bool = False) -> None:
        self.locals: list[torch.Tensor] = []
        #: Index into :attr:`meshes` per tensor (-1: plain).
        self.owner: list[int] = []
        self.copies: list[int] = []
        self.meshes: list[Any] = []
        for t in tensors:
            if not is_dtensor(t):
                self.locals.append(t)
                self.owner.append(-1)
                self.copies.append(1)
                continue
            if settle:
                t = gradnorm.settle(t)
            mesh = t.device_mesh  # type: ignore[attr-defined]
            try:
                index = self.meshes.index(mesh)
            except ValueError:
                index = len(self.meshes)
                self.meshes.append(mesh)
            copies = math.prod(
                mesh.size(d) for d, p in enumerate(t.placements) if p.is_replicate()  # type: ignore[attr-defined]
            )
            self.locals.append(t.to_local())  # type: ignore[attr-defined]
            self.owner.append(index)
            self.copies.append(copies)

    @property
    def sharded(self) -> bool:
        return bool(self.meshes)

    def reduce(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Per-tensor statistics (``values[i]`` of tensor ``i``; a column per tensor if
        2-D: ``values[:, i]``) made global: entries of plain tensors as they are, the
        others summed (``"sum"``) or maximised (``"max"``) over their mesh, one all-reduce
        per mesh dimension (one in all when the mesh spans the whole job)."""
        if not self.meshes:
            return values
        owner, copies = _layout(tuple(self.owner), tuple(self.copies), values.device)
        out = torch.where(owner == -1, values, torch.zeros_like(values))
        if op == "sum":
            values = values / copies.to(values.dtype)
        for index, mesh in enumerate(self.meshes):
            part = torch.where(owner == index, values, torch.zeros_like(values))
            _all_reduce(part, mesh, dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
            out = out + part
        return out

    def norms(self, ord: float = 2.0) -> torch.Tensor:
        """Local per-tensor norms (``ord`` 2: in :func:`acc_dtype`; ``inf``: the largest
        magnitude, NaN if any element is NaN), fused per device and dtype; an empty shard
        (more ranks than rows) counts 0."""
        return _grouped_norms(self.locals, ord)


def global_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``tensors`` together as a 0-dim tensor in :func:`acc_dtype`
    (a finite total stays finite: 1e30 gradients give 1e30, not fp32's Inf). With
    DTensors it is global (a collective on their meshes); no host sync."""
    if not any(is_dtensor(t) for t in tensors):  # the usual case: no mesh to reduce over
        return _grouped_norms(tensors).square().sum().sqrt()
    shards = Shards(tensors, settle=True)
    squares = shards.norms().square()
    return shards.reduce(squares).sum().sqrt()


@cache
def _layout(
    owner: tuple[int, ...], copies: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The owner and replica-count vectors on ``device``, made once per layout (not a
    host-to-device copy every step)."""
    return torch.tensor(owner, device=device), torch.tensor(copies, device=device)


def _all_reduce(t: torch.Tensor, mesh: Any, op: Any) -> None:
    if mesh.size() == dist.get_world_size():
        dist.all_reduce(t, op=op)  # the mesh is the whole job: one collective
        return
    for d in range(mesh.ndim):  # a reduction over a product of dims is one per dim
        dist.all_reduce(t, op=op, group=mesh.get_group(d))


def _grouped_norms(tensors: list[torch.Tensor], ord: float = 2.0) -> torch.Tensor:
    """Per-tensor norms as one vector in :func:`acc_dtype` (fused per device and dtype)."""
    device = tensors[0].device
    dtype = acc_dtype(device)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel():
            groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for (dev, _), idx in groups.items():
        norms = _norms([tensors[i] for i in idx], ord)
        if len(idx) == len(tensors) and dev == device:
            return norms  # one device and dtype, no empty shard
        for i, n in zip(idx, norms, strict=True):
            out[i] = n
    zero = torch.zeros((), device=device, dtype=dtype)
    return torch.stack([zero if n is None else n.to(device=device, dtype=dtype) for n in out])


def _norms(tensors: list[torch.Tensor], ord: float) -> torch.Tensor:
    """Norms (``ord`` 2 or ``inf``) of same-device, same-dtype, non-empty tensors as one
    vector in :func:`acc_dtype`, without a host sync. L2: one fused kernel accumulating
    in float64 (on the CPU about twice the fp32 cost; on a GPU the pass is memory-bound
    and costs the same). ``inf`` on the CPU: per-tensor ``aminmax``, five times faster
    there than the fused inf norm; NaN stays NaN either way."""
    dtype = acc_dtype(tensors[0].device)
    if ord == math.inf and tensors[0].device.type == "cpu":
        ends = [torch.aminmax(t) for t in tensors]
        low = torch.stack([e.min for e in ends]).to(dtype)
        high = torch.stack([e.max for e in ends]).to(dtype)
        return torch.maximum(-low, high)
    kw = {"dtype": dtype} if ord == 2.0 else {}
    return torch.stack(torch._foreach_norm(tensors, ord, **kw)).to(dtype)
