"""X006–X008: the process group as launched vs the Plan (seed §5.1 item 6, §4.2, §4.4).

Checked once at start with every rank's node: the world size against TP·CP·DP·PP, the
number of ranks on each node, and whether each tensor-parallel group — which exchanges
activations in every layer — sits inside one node, given the rank order.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sapper.distributed.context import DistContext
from sapper.distributed.detectors._common import fmt_ranks
from sapper.distributed.layout import RankGrid
from sapper.distributed.rules import RANKS_PER_NODE, TP_ACROSS_NODES, WORLD_SIZE_MISMATCH
from sapper.plan.schema import Plan
from sapper.rules.model import Finding

__all__ = [
    "RANKS_PER_NODE",
    "TP_ACROSS_NODES",
    "WORLD_SIZE_MISMATCH",
    "check_process_groups",
    "check_world_size",
]


def _degrees(p: Any, dp: int | str) -> str:
    return f"tp {p.tp} × pp {p.pp} × cp {p.cp} × dp {dp}"


def _world_size(ctx: DistContext, plan: Plan, step: int = 0) -> list[Finding]:
    """The launched world against the plan's degrees, with the arithmetic and the step
    it was seen at (construction: nothing has trained on the wrong groups yet)."""
    p = plan.parallel
    mp = p.tp * p.cp * p.pp
    world = ctx.world_size
    at = f" (step {step})"
    if p.dp == -1:
        if world % mp:
            msg = (
                f"world {world} is not a multiple of tp {p.tp} × pp {p.pp} × cp {p.cp} = {mp}, "
                f"so dp cannot be inferred{at}"
            )
            return [
                WORLD_SIZE_MISMATCH.finding(
                    msg, step=step, value=float(world), threshold=float(mp)
                )
            ]
        planned_gpus = plan.hardware.total_gpus
        if planned_gpus is not None and planned_gpus != world:
            msg = (
                f"world {world} ≠ the plan's {planned_gpus} GPUs: "
                f"{_degrees(p, world // mp)} = {world} launched, "
                f"{_degrees(p, planned_gpus // mp)} = {planned_gpus} planned{at}"
            )
            return [
                WORLD_SIZE_MISMATCH.finding(
                    msg, step=step, value=float(world), threshold=float(planned_gpus)
                )
            ]
        return []
    planned = mp * p.dp
    if planned == world:
        return []
    msg = f"world {world} ≠ {_degrees(p, p.dp)} = {planned}{at}"
    return [
        WORLD_SIZE_MISMATCH.finding(msg, step=step, value=float(world), threshold=float(planned))
    ]


def check_world_size(ctx: DistContext, plan: Plan | None, step: int = 0) -> list[Finding]:
    """X006 alone: needs no node information, so it runs when the tracker is built."""
    return _world_size(ctx, plan, step) if plan is not None else []


def _ranks_per_node(ctx: DistContext, plan: Plan | None) -> list[Finding]:
    per_node = ctx.ranks_per_node()
    if not per_node:
        return []
    out: list[Finding] = []
    counts = {node: len(ranks) for node, ranks in per_node.items()}
    sizes = Counter(counts.values())
    problems: list[str] = []
    if len(sizes) > 1:
        listing = ", ".join(f"{n}: {c}" for n, c in sorted(counts.items()))
        problems.append(f"nodes run different numbers of ranks ({listing})")
    nodes = ctx.nodes or []
    claimed = {n.local_world_size for n in nodes if n.local_world_size > 0}
    if claimed and len(sizes) == 1:
        actual = next(iter(sizes))
        if claimed != {actual}:
            problems.append(
                f"the launcher says {sorted(claimed)} rank(s) per node (LOCAL_WORLD_SIZE) "
                f"but {actual} share each node name: node names are ambiguous (containers "
                "with one hostname?)"
            )
    scattered = [
        (node, ranks)
        for node, ranks in per_node.items()
        if ranks != list(range(ranks[0], ranks[0] + len(ranks)))
    ]
    if scattered:
        node, ranks = sorted(scattered)[0]
        problems.append(
            f"ranks are not contiguous per node ({node} holds {fmt_ranks(ranks[:8])}"
            + (" ..." if len(ranks) > 8 else "")
            + "): adjacent ranks, and so TP groups, land on different nodes"
        )
    if plan is not None and "gpus_per_node" in plan.hardware.model_fields_set and sizes:
        expected = plan.hardware.gpus_per_node
        actual = max(sizes)
        if expected != actual:
            problems.append(f"the plan says {expected} GPUs per node, the job runs {actual}")
    for text in problems:
        out.append(RANKS_PER_NODE.finding(text, value=float(len(per_node)), nodes=counts))
    return out


def _tp_groups(ctx: DistContext, grid: RankGrid | None) -> list[Finding]:
    keys = ctx.node_of()
    if grid is None or keys is None or grid.sizes["tp"] < 2:
        return []
    bad = []
    for group in grid.groups("tp"):
        hosts = sorted({keys[r] for r in group})
        if len(hosts) > 1:
            bad.append((group, hosts))
    if not bad:
        return []
    group, hosts = bad[0]
    order = "-".join(grid.order)
    msg = (
        f"{len(bad)} of {len(grid.groups('tp'))} TP group(s) span nodes, e.g. "
        f"{fmt_ranks(group)} on {', '.join(hosts[:4])} (TP={grid.sizes['tp']}, "
        f"rank order {order}, {len(ctx.ranks_per_node())} node(s))"
    )
    return [
        TP_ACROSS_NODES.finding(msg, value=float(len(bad)), threshold=0.0, group=group, nodes=hosts)
    ]


def check_process_groups(
    ctx: DistContext, plan: Plan | None = None, *, world: bool = True, step: int = 0
) -> list[Finding]:
    """The start-of-run checks over the launched process group (world > 1); ``world=False``
    leaves out X006 when :func:`check_world_size` already ran."""
    out: list[Finding] = []
    if plan is not None and world:
        out.extend(_world_size(ctx, plan, step))
    out.extend(_ranks_per_node(ctx, plan))
    out.extend(_tp_groups(ctx, ctx.grid))
    return out
