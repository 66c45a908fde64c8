"""Group placement: the exact span (only a group's first rank within a node is placed)
matches placing every rank of every group, for degrees that do not tile the nodes."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

from sapper.parallel.layout import GroupSpan, _exact_span

NAMES = ("tp", "cp", "ep", "dp", "pp")


def _every_group(order: tuple[str, ...], deg: dict[str, int], dims: frozenset[str],
                 gpn: int) -> GroupSpan:
    """Rank r has coordinate (r // stride_d) % deg_d along d; a group is the ranks that
    agree on every coordinate outside ``dims``."""
    strides, s = {}, 1
    for d in order:
        strides[d] = s
        s *= deg[d]
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(s):
        key = tuple((rank // strides[d]) % deg[d] for d in order if d not in dims)
        groups.setdefault(key, []).append(rank // gpn)
    size = len(next(iter(groups.values())))
    nodes = max(len(set(g)) for g in groups.values())
    fewest = min(min(Counter(g).values()) for g in groups.values())
    return GroupSpan(size, nodes, fewest)


def test_exact_span_matches_placing_every_group() -> None:
    rng = random.Random(0)
    checked = 0
    while checked < 400:
        order = tuple(rng.sample(NAMES, 5))
        deg = {d: rng.choice([1, 1, 2, 3, 4, 5, 6, 8, 12]) for d in NAMES}
        dims = frozenset(rng.sample(NAMES, rng.randint(1, 3)))
        if math.prod(deg.values()) > 4096 or math.prod(deg[d] for d in dims) <= 1:
            continue
        gpn = rng.choice([1, 2, 4, 6, 8, 16])
        assert _exact_span(order, deg, dims, gpn) == _every_group(order, deg, dims, gpn)
        checked += 1


def test_exact_span_on_a_large_job() -> None:
    order = ("tp", "cp", "pp", "dp")  # + ep of 1
    for tp, cp, pp in itertools.product((4, 8), (3, 6), (12, 16)):
        deg = {"tp": tp, "cp": cp, "pp": pp, "ep": 1, "dp": 6144 // (tp * cp * pp) or 1}
        if tp * cp * pp * deg["dp"] != 6144:
            continue
        full = (*order[:2], "ep", *order[2:])
        for dims in (frozenset({"cp"}), frozenset({"cp", "ep", "dp"}), frozenset({"pp"})):
            assert _exact_span(full, deg, dims, 8) == _every_group(full, deg, dims, 8)
