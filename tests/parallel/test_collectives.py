"""Per-rank traffic follows nccl-tests' bus-bandwidth convention (seed §4.3)."""

from __future__ import annotations

import numpy as np
import pytest

from sapper.parallel.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    P2P,
    REDUCE_SCATTER,
    bus_factor,
    collective_time,
)
from sapper.parallel.efficiency import COLLECTIVE_LATENCY_S


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_factors(n: int) -> None:
    assert bus_factor(ALL_REDUCE, n) == pytest.approx(2 * (n - 1) / n)
    for kind in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        assert bus_factor(kind, n) == pytest.approx((n - 1) / n)
    # an all-reduce is a reduce-scatter followed by an all-gather
    assert bus_factor(ALL_REDUCE, n) == pytest.approx(
        bus_factor(REDUCE_SCATTER, n) + bus_factor(ALL_GATHER, n)
    )


def test_time_is_bytes_over_bus_bandwidth_plus_latency() -> None:
    t = collective_time(ALL_REDUCE, 1e9, 8, 100.0)
    assert t == pytest.approx(2 * 7 / 8 * 1e9 / 100e9 + COLLECTIVE_LATENCY_S)
    ring = collective_time(ALL_GATHER, 1e6, 4, 100.0, calls=3)
    assert ring == pytest.approx(3 / 4 * 1e6 / 100e9 + 3 * COLLECTIVE_LATENCY_S)


def test_single_rank_costs_nothing_but_p2p_does() -> None:
    assert collective_time(ALL_REDUCE, 1e9, 1, 100.0) == 0
    assert collective_time(P2P, 1e9, 2, 100.0) == pytest.approx(1e9 / 100e9 + 20e-6)


def test_vectorized() -> None:
    t = collective_time(ALL_REDUCE, np.array([1e9, 1e9]), np.array([1, 8]), np.array([1, 1]))
    assert t[0] == 0 and t[1] > 0
