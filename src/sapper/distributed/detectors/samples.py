"""X004: data-parallel ranks fed the same samples (no DistributedSampler, one shard index).

Reads the summed sample buckets of the exchange (see
:class:`sapper.distributed.stats.SampleBuckets`): a bucket that holds one sample on two or
more ranks of a data group is a shared sample; collisions of different samples are told
apart by the spread of their second hash and left out. The ranks are named from the
lowest and highest contributing rank of each shared bucket (every rank of the group
when the count says so), so the payload and the work stay fixed as the world grows.
"""

from __future__ import annotations

from sapper.distributed.detectors._common import fmt_ranks, table_of, window_text
from sapper.distributed.rules import DUPLICATE_SAMPLES_ACROSS_RANKS
from sapper.distributed.stats import SampleBuckets
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["DUPLICATE_SAMPLES_ACROSS_RANKS", "DuplicateSamplesDetector"]


class DuplicateSamplesDetector(Detector):
    """Within each data group, ranks sharing at least ``min_overlap`` of their (sampled)
    distinct samples, and at least ``min_shared`` samples, are reported once per cluster."""

    rules = (DUPLICATE_SAMPLES_ACROSS_RANKS,)

    def __init__(self, min_overlap: float = 0.5, min_shared: int = 2) -> None:
        self.min_overlap = min_overlap
        self.min_shared = min_shared
        self.reported: list[list[int]] = []

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None:
            return []
        buckets = table.job().buckets
        if not buckets:
            return []
        group_of: dict[int, int] = {}
        for g, ranks in enumerate(table.data_groups):
            for r in ranks:
                group_of[r] = g
        dup = SampleBuckets.shared(buckets)
        if not dup:  # no sample on two ranks: nothing to name (the usual exchange)
            return []
        _, where = SampleBuckets.classify(buckets)
        lo, hi, count = buckets["lo_rank"], buckets["hi_rank"], buckets["count"]
        pure = [(int(lo[i]), int(hi[i])) for i in where]
        parent: dict[int, int] = {}
        shared: dict[int, int] = {}  # root -> shared samples
        widest: dict[int, float] = {}
        for i in dup:
            a, b = int(lo[i]), int(hi[i])
            if group_of.get(a, -1) != group_of.get(b, -2):
                continue
            ra, rb = _root(parent, a), _root(parent, b)
            if ra != rb:
                parent[rb] = ra
                shared[ra] = shared.get(ra, 0) + shared.pop(rb, 0)
                widest[ra] = max(widest.get(ra, 0.0), widest.pop(rb, 0.0))
            shared[ra] = shared.get(ra, 0) + 1
            widest[ra] = max(widest.get(ra, 0.0), count[i])
        out: list[Finding] = []
        for root in sorted(shared):
            n = shared[root]
            g = group_of.get(root, -1)
            group = table.data_groups[g] if g >= 0 else []
            members = sorted(r for r in parent if _root(parent, r) == root)
            inside = set(members)
            seen = sum(1 for a, b in pure if a in inside or b in inside)
            share = n / max(seen, 1)
            if n < self.min_shared or share < self.min_overlap:
                continue
            every = bool(group) and widest[root] >= len(group)
            if every:
                members = sorted(group)
            if members in self.reported:
                continue
            self.reported.append(members)
            msg = (
                f"{fmt_ranks(members)} were fed the same samples in {window_text(table)} "
                f"(estimated overlap ≥ {share:.0%}"
                + (", every data-parallel rank" if every else "")
                + f", {len(group)} ranks expected to be disjoint)"
            )
            out.append(
                DUPLICATE_SAMPLES_ACROSS_RANKS.finding(
                    msg,
                    step=table.step,
                    rank=members[1],
                    value=min(share, 1.0),
                    threshold=self.min_overlap,
                    ranks=members,
                    group=group,
                    shared_samples=n,
                    ranks_per_sample=int(widest[root]),
                )
            )
        return out


def _root(parent: dict[int, int], r: int) -> int:
    parent.setdefault(r, r)
    while parent[r] != r:
        r = parent[r]
    return r
