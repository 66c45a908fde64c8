"""Which ranks are supposed to agree with which: the rank grid of a TP·CP·DP·PP job.

Cross-rank checks are only meaningful between the right ranks. Data-parallel replicas
must hold identical parameters and must see *different* samples; tensor-parallel peers
hold different shards and see the *same* samples. A Plan says the degrees and the rank
order (Megatron's ``tp-cp-ep-dp-pp``, fastest-varying first), which fixes every rank's
coordinates; without a Plan every rank is taken as a data-parallel replica (DDP, FSDP,
ZeRO), which is what a plain ``torchrun`` job is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from sapper.errors import InputError
from sapper.plan.schema import Plan

__all__ = ["GRID_DIMS", "RankGrid", "ReplicaLayout"]

#: The dimensions that partition the world; expert parallelism lives inside DP.
GRID_DIMS: tuple[str, ...] = ("tp", "cp", "dp", "pp")
_ORDER_TOKENS = {*GRID_DIMS, "ep"}


@dataclass(frozen=True)
class RankGrid:
    """Degrees and rank order; ``coords(rank)`` and ``groups(dim)`` follow from them."""

    sizes: dict[str, int]
    #: Grid dimensions, fastest-varying first (adjacent ranks differ in ``order[0]``).
    order: tuple[str, ...]

    @property
    def world_size(self) -> int:
        n = 1
        for d in self.order:
            n *= self.sizes[d]
        return n

    @classmethod
    def from_plan(cls, plan: Plan, world_size: int | None = None) -> RankGrid | None:
        """The grid of ``plan``; ``dp = -1`` is inferred from ``world_size`` (or the
        plan's GPU count). None when DP cannot be inferred (it does not divide)."""
        p = plan.parallel
        tokens = [t.strip().lower() for t in p.rank_order.split("-") if t.strip()]
        unknown = [t for t in tokens if t not in _ORDER_TOKENS]
        if unknown or len(set(tokens)) != len(tokens):
            raise InputError(
                "rank order names an unknown or repeated dimension",
                field="parallel.rank_order",
                value=p.rank_order,
                expected="dimensions tp, cp, ep, dp, pp joined by '-', e.g. 'tp-cp-ep-dp-pp'",
            )
        order = [t for t in tokens if t != "ep"]
        order += [d for d in GRID_DIMS if d not in order]  # unnamed ones vary slowest
        dp = p.dp
        if dp == -1:
            mp = p.tp * p.cp * p.pp
            total = world_size if world_size is not None else plan.hardware.total_gpus
            if total is None:
                dp = 1
            elif total % mp:
                return None
            else:
                dp = total // mp
        sizes = {"tp": p.tp, "cp": p.cp, "dp": dp, "pp": p.pp}
        return cls(sizes=sizes, order=tuple(order))

    @classmethod
    def data_parallel(cls, world_size: int) -> RankGrid:
        """Every rank a data-parallel replica (DDP, FSDP, ZeRO without TP/PP)."""
        return cls(sizes={"tp": 1, "cp": 1, "dp": world_size, "pp": 1}, order=GRID_DIMS)

    def _strides(self) -> dict[str, int]:
        strides, s = {}, 1
        for d in self.order:
            strides[d] = s
            s *= self.sizes[d]
        return strides

    def coords(self, rank: int) -> dict[str, int]:
        strides = self._strides()
        return {d: (rank // strides[d]) % self.sizes[d] for d in self.order}

    def rank_of(self, coords: dict[str, int]) -> int:
        strides = self._strides()
        return sum(coords[d] * strides[d] for d in self.order)

    def groups(self, dim: str) -> list[list[int]]:
        """The ranks that differ only in ``dim`` (e.g. every TP group), sorted."""
        others = [d for d in self.order if d != dim]
        out = []
        for fixed in product(*(range(self.sizes[d]) for d in others)):
            base = dict(zip(others, fixed, strict=True))
            out.append(sorted(self.rank_of({**base, dim: i}) for i in range(self.sizes[dim])))
        return sorted(out)


@dataclass(frozen=True)
class ReplicaLayout:
    """Groups of ranks the cross-rank detectors compare."""

    #: Ranks that must be fed different samples (one DP group per TP/CP/PP position).
    data_groups: list[list[int]]
    #: Ranks that must hold identical parameters (DP replicas of the same shard).
    param_groups: list[list[int]]
    #: Tensor-parallel groups (must sit inside one node, seed §4.2).
    tp_groups: list[list[int]] = field(default_factory=list)
    #: Where the layout came from, for messages.
    source: str = "all ranks data-parallel"

    @classmethod
    def from_grid(cls, grid: RankGrid, source: str) -> ReplicaLayout:
        dp = grid.groups("dp")
        tp = grid.groups("tp") if grid.sizes["tp"] > 1 else []
        return cls(data_groups=dp, param_groups=dp, tp_groups=tp, source=source)

    def with_param_groups(self, groups: list[list[int]], source: str) -> ReplicaLayout:
        return ReplicaLayout(self.data_groups, groups, self.tp_groups, source)
