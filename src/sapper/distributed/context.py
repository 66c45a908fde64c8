"""Where this process sits in the job: rank, world size, node, and the replica layout.

Read once at start. Rank and world size come from the initialized process group (or the
launcher's environment); the node of every rank is gathered once over sapper's side
channel, because ranks-per-node and "is each TP group inside one node" can only be
answered with every rank's host. torchrun's ``GROUP_RANK`` (the node index) is preferred
to the hostname: containers often share one hostname across nodes.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from dataclasses import dataclass, field, replace

import torch.distributed as dist

from sapper.distributed.layout import RankGrid, ReplicaLayout
from sapper.plan.schema import Plan

__all__ = ["DistContext", "NodeInfo", "discover", "local_node_info"]


@dataclass(frozen=True)
class NodeInfo:
    """What one rank says about its node."""

    host: str
    #: torchrun's GROUP_RANK (node index), -1 when the launcher does not set it.
    group_rank: int = -1
    local_rank: int = -1
    #: The launcher's LOCAL_WORLD_SIZE (ranks on this node), -1 when unknown.
    local_world_size: int = -1


def _env_int(name: str, default: int = -1) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def local_node_info() -> NodeInfo:
    return NodeInfo(
        host=socket.gethostname(),
        group_rank=_env_int("GROUP_RANK"),
        local_rank=_env_int("LOCAL_RANK"),
        local_world_size=_env_int("LOCAL_WORLD_SIZE"),
    )


@dataclass(frozen=True)
class DistContext:
    """The process group as sapper sees it."""

    rank: int
    world_size: int
    local_rank: int
    #: Ranks per node from the launcher (LOCAL_WORLD_SIZE), None when unknown.
    local_world_size: int | None
    #: Every rank's node info, gathered once at start (None before that).
    nodes: list[NodeInfo] | None = None
    layout: ReplicaLayout = field(default_factory=lambda: ReplicaLayout([[0]], [[0]]))
    #: The grid from the Plan when it matches the world size.
    grid: RankGrid | None = None
    #: The Plan's TP·CP·DP·PP product when it disagrees with the world size.
    plan_world_size: int | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def node_of(self) -> list[str] | None:
        """A node key per rank: torchrun's node index when every rank has one, else the
        hostname."""
        if self.nodes is None:
            return None
        if all(n.group_rank >= 0 for n in self.nodes):
            return [f"node {n.group_rank} ({n.host})" for n in self.nodes]
        return [n.host for n in self.nodes]

    def ranks_per_node(self) -> dict[str, list[int]]:
        keys = self.node_of() or []
        out: dict[str, list[int]] = {}
        for rank, key in enumerate(keys):
            out.setdefault(key, []).append(rank)
        return out

    def with_nodes(self, nodes: list[NodeInfo]) -> DistContext:
        return replace(self, nodes=nodes)

    def describe(self) -> str:
        per_node = Counter(len(r) for r in self.ranks_per_node().values())
        nodes = ", ".join(f"{n} node(s) × {k} rank(s)" for k, n in sorted(per_node.items()))
        return f"rank {self.rank} of {self.world_size}" + (f"; {nodes}" if nodes else "")


def discover(plan: Plan | None = None, group: dist.ProcessGroup | None = None) -> DistContext:
    """Rank and world size of the initialized process group (world 1 when there is none),
    with the replica layout from ``plan`` when its degrees match the world size."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    else:
        rank, world = 0, 1
    local_rank = _env_int("LOCAL_RANK", rank)
    lws = _env_int("LOCAL_WORLD_SIZE")
    grid = None
    plan_world = None
    layout = ReplicaLayout.from_grid(RankGrid.data_parallel(world), "all ranks data-parallel")
    if plan is not None:
        planned = RankGrid.from_plan(plan, world)
        if planned is not None and planned.world_size == world:
            grid = planned
            p = plan.parallel
            source = f"plan TP{p.tp}·CP{p.cp}·DP{planned.sizes['dp']}·PP{p.pp}"
            layout = ReplicaLayout.from_grid(planned, source)
        else:
            plan_world = planned.world_size if planned is not None else None
            # Degrees that do not tile the world: comparing the wrong ranks would
            # raise false alarms, so only the world-size finding speaks.
            layout = ReplicaLayout([], [], [], "plan does not match the world size")
    return DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=lws if lws > 0 else None,
        layout=layout,
        grid=grid,
        plan_world_size=plan_world,
    )
