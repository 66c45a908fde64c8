"""The reduced exchange: three rounds of fixed-size all-reduces instead of an all-gather.

See :mod:`sapper.distributed.stats` for what each round carries. Every collective goes
through :meth:`SideChannel.all_reduce`, so it is bounded by the channel's timeout and a
lost peer closes the channel exactly as with the all-gather. The payload is
O(columns + replica groups + buckets) per rank, independent of the world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from sapper.distributed.reduce import SideChannel
from sapper.distributed.stats import (
    ColumnStats,
    JobStats,
    absent_below_zero,
    named_ranks,
)

__all__ = ["reduce_buckets", "reduce_window"]


def reduce_buckets(
    channel: SideChannel, buckets: dict[str, torch.Tensor], step: int
) -> dict[str, list[float]] | None:
    """Round A's sample buckets alone (the detail mode, which has every row already)."""
    summed = torch.cat([buckets[k].cpu() for k in ("count", "g", "g2")])
    ranks = torch.cat([buckets["hi_rank"].cpu(), buckets["lo_rank"].cpu()])
    got = channel.all_reduce([(summed, dist.ReduceOp.SUM), (ranks, dist.ReduceOp.MAX)], step)
    if got is None:
        return None
    size = buckets["count"].numel()
    s, m = (t.cpu() for t in got)
    out = {k: s[j * size : (j + 1) * size].tolist() for j, k in enumerate(("count", "g", "g2"))}
    out["hi_rank"] = m[:size].tolist()
    out["lo_rank"] = (-m[size:]).tolist()
    return out


def reduce_window(
    channel: SideChannel,
    names: Sequence[str],
    head: torch.Tensor,
    buckets: dict[str, torch.Tensor],
    *,
    step: int,
    param_group: int,
    n_groups: int,
    max_named: int,
) -> tuple[JobStats, dict[int, list[float]]] | None:
    """``head``: this rank's packed columns then the presence mask (float64, host).
    Returns the job's statistics and the rows (columns + mask) of the named ranks; None
    when the channel was lost meanwhile."""
    rank, world = channel.rank, channel.world_size
    n = len(names)
    row = head.to(torch.float64).cpu()
    vals = row[:n]
    mask = int(row[n].item())
    present = torch.tensor([bool(mask >> i & 1) for i in range(n)])
    neg_absent = torch.tensor([absent_below_zero(c) for c in names])
    present &= ~(neg_absent & (vals < 0))
    finite = present & torch.isfinite(vals)
    nonfinite = present & ~torch.isfinite(vals)
    fv = torch.where(finite, vals, 0.0)
    ninf = torch.tensor(-math.inf, dtype=torch.float64)
    # per-group checksum (NaN ranks as +inf, as in stats_from_rows)
    ck_i = list(names).index("checksum") if "checksum" in names else -1
    ck_on = ck_i >= 0 and bool(present[ck_i]) and 0 <= param_group < n_groups
    ck = float(vals[ck_i]) if ck_on else 0.0
    ck = math.inf if math.isnan(ck) else ck
    g_hi = torch.full((n_groups,), -math.inf, dtype=torch.float64)
    g_lo = g_hi.clone()
    if ck_on:
        g_hi[param_group], g_lo[param_group] = ck, -ck
    sum_a = torch.cat(
        [
            torch.stack([present.double(), fv, fv * fv, nonfinite.double()], 1).reshape(-1),
            *(buckets[k].cpu() for k in ("count", "g", "g2")),
        ]
    )
    max_a = torch.cat(
        [
            torch.stack(
                [torch.where(finite, vals, ninf), torch.where(finite, -vals, ninf)], 1
            ).reshape(-1),
            torch.stack([g_hi, g_lo], 1).reshape(-1),
            buckets["hi_rank"].cpu(),
            buckets["lo_rank"].cpu(),
        ]
    )
    got = channel.all_reduce([(sum_a, dist.ReduceOp.SUM), (max_a, dist.ReduceOp.MAX)], step)
    if got is None:
        return None
    sum_a, max_a = (t.cpu() for t in got)
    hi, lo = max_a[: 2 * n : 2], -max_a[1 : 2 * n : 2]
    big = float(world)
    r = float(rank)
    at_hi, at_lo = finite & (vals == hi), finite & (vals == lo)
    min_b = torch.stack(
        [
            torch.where(at_hi, r, big),
            torch.where(at_lo, r, big),
            torch.where(nonfinite, r, big),
        ],
        1,
    ).reshape(-1)
    gmax = max_a[2 * n : 2 * n + 2 * n_groups : 2]
    gmin = -max_a[2 * n + 1 : 2 * n + 2 * n_groups : 2]
    g_b = torch.full((n_groups, 4), big, dtype=torch.float64)
    if ck_on:
        g = param_group
        if ck == float(gmax[g]):
            g_b[g, 0], g_b[g, 1] = r, -r
        if ck == float(gmin[g]):
            g_b[g, 2], g_b[g, 3] = r, -r
    min_b = torch.cat([min_b, g_b.reshape(-1)])
    got = channel.all_reduce([(min_b, dist.ReduceOp.MIN)], step)
    if got is None:
        return None
    min_b = got[0].cpu()
    counts = torch.zeros(2 * n, dtype=torch.float64)  # filled by round C
    stats = _assemble(names, sum_a, max_a, min_b, counts, world, n_groups, buckets)
    named = named_ranks(stats, max_named)
    # round C: the named ranks' rows, and how many ranks hold each extreme (one SUM)
    rows = torch.zeros((len(named), n + 1), dtype=torch.float64)
    if rank in named:
        rows[named.index(rank)] = row[: n + 1]
    tail = torch.stack([at_hi.double(), at_lo.double()], 1).reshape(-1)
    got = channel.all_reduce([(torch.cat([rows.reshape(-1), tail]), dist.ReduceOp.SUM)], step)
    if got is None:
        return None
    flat = got[0].cpu()
    fetched = flat[: rows.numel()].reshape(rows.shape).tolist()
    held = flat[rows.numel() :].reshape(n, 2).tolist()
    for i, name in enumerate(names):
        stats.columns[name].n_max, stats.columns[name].n_min = int(held[i][0]), int(held[i][1])
    return stats, {r_: fetched[i] for i, r_ in enumerate(named)}


def _assemble(
    names: Sequence[str],
    sum_a: torch.Tensor,
    max_a: torch.Tensor,
    min_b: torch.Tensor,
    sum_b: torch.Tensor,
    world: int,
    n_groups: int,
    buckets: dict[str, torch.Tensor],
) -> JobStats:
    n = len(names)
    sa = sum_a[: 4 * n].reshape(n, 4).tolist()
    ma = max_a[: 2 * n].reshape(n, 2).tolist()
    mb = min_b[: 3 * n].reshape(n, 3).tolist()
    sb = sum_b.reshape(n, 2).tolist()

    def rank_of(v: float) -> int:
        return int(v) if v < world else -1

    cols = {}
    for i, name in enumerate(names):
        cols[name] = ColumnStats(
            count=int(sa[i][0]),
            sum=sa[i][1],
            sumsq=sa[i][2],
            nonfinite=int(sa[i][3]),
            max=ma[i][0],
            min=-ma[i][1],
            argmax=rank_of(mb[i][0]),
            argmin=rank_of(mb[i][1]),
            first_nonfinite=rank_of(mb[i][2]),
            n_max=int(sb[i][0]),
            n_min=int(sb[i][1]),
        )
    groups = []
    gm = max_a[2 * n : 2 * n + 2 * n_groups].reshape(n_groups, 2).tolist()
    gb = min_b[3 * n :].reshape(n_groups, 4).tolist()
    for g in range(n_groups):
        if math.isinf(gm[g][0]) and gm[g][0] < 0:
            groups.append({})
            continue
        groups.append(
            {
                "max": gm[g][0],
                "min": -gm[g][1],
                "max_lo": gb[g][0],
                "max_hi": -gb[g][1],
                "min_lo": gb[g][2],
                "min_hi": -gb[g][3],
            }
        )
    size = buckets["count"].numel()
    off = 4 * n
    summed = {
        k: sum_a[off + j * size : off + (j + 1) * size].tolist()
        for j, k in enumerate(("count", "g", "g2"))
    }
    moff = 2 * n + 2 * n_groups
    summed["hi_rank"] = max_a[moff : moff + size].tolist()
    summed["lo_rank"] = (-max_a[moff + size : moff + 2 * size]).tolist()
    return JobStats(world, cols, groups, summed if size else {})
