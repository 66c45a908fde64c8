"""A cheap parameter fingerprint to compare data-parallel replicas.

DP replicas must stay bit-identical: same initial weights (DDP broadcasts them), same
averaged gradient, same update. They drift apart silently when one rank loads a
checkpoint the others did not, skips an update the others made, or changes a weight
outside the optimizer (an EMA, a rank-0-only edit). A fixed set of a few elements per
parameter tensor (evenly spaced, the same on every rank), weighted and summed in fp64 on
the parameters' device, changes when any of them drifts — at the cost of a few small
kernels every N steps rather than a pass over all the weights.

Sharded parameters (FSDP2 DTensors, ZeRO-3) are fingerprinted by their local shard, and
the replica groups follow the device mesh: ranks that differ only along mesh dimensions
where every parameter is replicated (HSDP's replicate dimension) must agree; a fully
sharded mesh has no replicas to compare.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ParamChecksum", "mesh_replica_groups"]


def _local(p: torch.Tensor) -> torch.Tensor:
    to_local = getattr(p, "to_local", None)
    return to_local() if callable(to_local) else p


class ParamChecksum:
    """``compute()`` -> a 0-dim fp64 tensor on the parameters' device (no host sync)."""

    def __init__(self, params: Iterable[torch.Tensor], per_tensor: int = 8) -> None:
        self.params = [p for p in params if isinstance(p, torch.Tensor)]
        self.per_tensor = int(per_tensor)
        self._index: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def _build(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        out = []
        gen = torch.Generator().manual_seed(0xC0FFEE)
        for p in self.params:
            local = _local(p)
            n = local.numel()
            if n == 0:
                continue
            k = min(self.per_tensor, n)
            idx = torch.linspace(0, n - 1, k).long().to(local.device)
            w = (torch.rand(k, generator=gen, dtype=torch.float64) + 0.5).to(local.device)
            out.append((p, idx, w))
        return out

    def compute(self) -> torch.Tensor | None:
        if not self.params:
            return None
        if self._index is None:
            self._index = self._build()
        terms = []
        with torch.no_grad():
            for p, idx, w in self._index:
                flat = _local(p).detach().reshape(-1)
                terms.append((flat[idx].to(torch.float64) * w).sum())
        if not terms:
            return None
        return torch.stack([t.to(terms[0].device) for t in terms]).sum()


def mesh_replica_groups(params: Iterable[Any]) -> list[list[int]] | None:
    """Replica groups implied by DTensor parameters on one device mesh: ranks that differ
    only along dims where every parameter is ``Replicate``. None when no parameter is a
    DTensor (the layout then comes from the Plan); ``[]`` when nothing is replicated."""
    mesh = None
    replicated: set[int] | None = None
    for p in params:
        placements = getattr(p, "placements", None)
        device_mesh = getattr(p, "device_mesh", None)
        if placements is None or device_mesh is None:
            continue
        if mesh is None:
            mesh = device_mesh
        elif device_mesh != mesh:
            return []  # several meshes: no single replica relation to check
        dims = {i for i, pl in enumerate(placements) if pl.is_replicate()}
        replicated = dims if replicated is None else replicated & dims
    if mesh is None:
        return None
    if not replicated:
        return []
    grid = mesh.mesh  # ranks laid out as a tensor, one axis per mesh dim
    keep = [d for d in range(grid.dim()) if d not in replicated]
    order = keep + sorted(replicated)
    flat = grid.permute(order).reshape(
        -1, int(torch.tensor([grid.shape[d] for d in sorted(replicated)]).prod())
    )
    return sorted(sorted(int(r) for r in row) for row in flat)
