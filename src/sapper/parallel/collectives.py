"""Bytes on the wire and time of the collectives a layout issues (seed §4.3).

Per-rank traffic follows the ring algorithms NCCL uses and the bus-bandwidth convention of
nccl-tests: an all-reduce of B bytes over n ranks moves 2(n-1)/n x B through each rank's
link, an all-gather or a reduce-scatter (n-1)/n x B, an all-to-all (n-1)/n x B. Time is
that traffic over the bus bandwidth of the slowest link the group spans, plus a fixed
latency per call. Functions accept numpy arrays so the planner can cost many layouts at
once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sapper.parallel.efficiency import COLLECTIVE_LATENCY_S

__all__ = [
    "ALL_GATHER",
    "ALL_REDUCE",
    "ALL_TO_ALL",
    "P2P",
    "REDUCE_SCATTER",
    "bus_factor",
    "collective_time",
]

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
P2P = "p2p"


def bus_factor(kind: str, n: Any) -> Any:
    """Bytes through each rank's link per byte of payload: 2(n-1)/n for all-reduce,
    (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for a point-to-point send."""
    n = np.asarray(n, dtype=float)
    if kind == P2P:
        return np.ones_like(n)
    frac = np.where(n > 1, (n - 1) / np.maximum(n, 1), 0.0)
    return 2.0 * frac if kind == ALL_REDUCE else frac


def collective_time(
    kind: str, payload_bytes: Any, n: Any, bus_gbps: Any, calls: Any = 1
) -> Any:
    """Seconds for one collective of ``payload_bytes`` over ``n`` ranks whose slowest link
    sustains ``bus_gbps`` GB/s of bus bandwidth, issued as ``calls`` separate operations
    (a ring of point-to-point steps pays the fixed latency once per step); zero when the
    group has one rank."""
    n = np.asarray(n, dtype=float)
    factor = bus_factor(kind, n)
    wire = factor * np.asarray(payload_bytes, dtype=float) / (np.asarray(bus_gbps) * 1e9)
    active = (n > 1) if kind != P2P else np.ones_like(n, dtype=bool)
    return np.where(active, wire + np.asarray(calls) * COLLECTIVE_LATENCY_S, 0.0)
