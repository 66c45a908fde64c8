"""The reduced view of an exchange: statistics, sample buckets, the sparse table."""

from __future__ import annotations

import math

import pytest
import torch

from sapper.distributed import DIST_KEY, RankTable
from sapper.distributed.detectors import DuplicateSamplesDetector, NonFiniteRankDetector
from sapper.distributed.sampling import sample_hashes
from sapper.distributed.stats import SampleBuckets, default_buckets, stats_from_rows
from sapper.distributed.table import COLUMNS
from sapper.runtime.records import StepRecord


def test_column_statistics_name_the_extreme_ranks() -> None:
    cols = {
        "step_time_s": [0.1, 0.3, 0.3, None, 0.2],
        "loss": [2.0, math.nan, 2.5, 3.0, 1.0],
        "nonfinite_loss_step": [-1.0, 7.0, -1.0, 5.0, -1.0],
    }
    s = stats_from_rows(cols, 5)
    t = s.col("step_time_s")
    assert (t.count, t.max, t.argmax, t.n_max, t.min, t.argmin) == (4, 0.3, 1, 2, 0.1, 0)
    assert t.mean_without_max() == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    loss = s.col("loss")
    assert (loss.nonfinite, loss.first_nonfinite, loss.finite, loss.argmin) == (1, 1, 4, 4)
    first = s.col("nonfinite_loss_step")  # -1 means never: left out, min = earliest
    assert (first.count, first.min, first.argmin) == (2, 5.0, 3)


def _ids(start: int, n: int = 40) -> torch.Tensor:
    out = sample_hashes(torch.arange(start, start + n).reshape(-1, 1))
    assert out is not None
    return out


def _table(world: int, hashes: list[torch.Tensor], groups: list[list[int]]) -> RankTable:
    cols = {name: [None] * world for name in COLUMNS}
    cols["step"] = [10.0] * world
    t = RankTable(step=10, columns=cols, data_groups=groups, param_groups=[], prev_step=0)
    group_of = [next(g for g, rs in enumerate(groups) if r in rs) for r in range(world)]
    sketch = SampleBuckets(default_buckets(world))
    t.job().buckets = sketch.summed(hashes, group_of)
    return t


def test_buckets_tell_shared_samples_from_collisions() -> None:
    world = 64
    disjoint = [_ids(1000 * r) for r in range(world)]  # 2,560 samples in 4,096 buckets
    everyone = [list(range(world))]
    assert DuplicateSamplesDetector().update(
        StepRecord(step=10, extra={DIST_KEY: _table(world, disjoint, everyone)})
    ) == []
    pair = list(disjoint)
    pair[37] = disjoint[5]  # rank 37 was given rank 5's shard
    [f] = DuplicateSamplesDetector().update(
        StepRecord(step=10, extra={DIST_KEY: _table(world, pair, everyone)})
    )
    assert f.data["ranks"] == [5, 37] and f.value >= 0.5
    same = [disjoint[0]] * world  # no DistributedSampler
    [g] = DuplicateSamplesDetector().update(
        StepRecord(step=10, extra={DIST_KEY: _table(world, same, everyone)})
    )
    assert g.data["ranks"] == list(range(world)) and "every data-parallel rank" in g.message
    tp = [[r for r in range(world) if r % 2 == k] for k in (0, 1)]  # TP pairs share
    peers = [disjoint[r // 2] for r in range(world)]
    assert DuplicateSamplesDetector().update(
        StepRecord(step=10, extra={DIST_KEY: _table(world, peers, tp)})
    ) == []


def test_buckets_grow_with_the_world_to_a_fixed_cap() -> None:
    assert [default_buckets(w) for w in (2, 64, 1024, 16384, 100_000)] == [
        1024, 4096, 65536, 65536, 65536,
    ]
    sk = SampleBuckets(65536)
    assert sk.stride(80, 16384) == 256 and sk.stride(80, 8) == 1  # 0.3 kept per rank


def test_sparse_table_round_trips_through_the_run_log() -> None:
    world = 1000
    rows = {}
    for r in (3, 417):
        vals = [0.0] * len(COLUMNS)
        vals[COLUMNS.index("step")] = 20.0
        vals[COLUMNS.index("nonfinite_grad_step")] = -1.0
        vals[COLUMNS.index("nonfinite_loss_step")] = 17.0 if r == 417 else -1.0
        rows[r] = [*vals, float((1 << len(COLUMNS)) - 1)]
    cols = {name: [None] * world for name in COLUMNS}
    cols["nonfinite_loss_step"] = [-1.0] * world
    cols["nonfinite_loss_step"][417] = 17.0
    cols["step"] = [20.0] * world
    stats = stats_from_rows(cols, world)
    t = RankTable.from_rows(rows, world, stats, data_groups=[], param_groups=[], prev_step=10)
    assert t.sparse and len(t.col("step")) == world and t.col("step")[417] == 20.0
    assert t.col("step")[5] is None
    live = NonFiniteRankDetector().update(StepRecord(step=20, extra={DIST_KEY: t}))
    back = RankTable.from_extra(t.to_extra())
    assert back is not None and back.sparse and back.job().col("nonfinite_loss_step").argmin == 417
    offline = NonFiniteRankDetector().update(StepRecord(step=20, extra={DIST_KEY: back}))
    assert [f.to_json() for f in offline] == [f.to_json() for f in live]
    assert live[0].rank == 417 and live[0].step == 17


@pytest.mark.parametrize("world", [1, 2, 4, 9])
def test_buckets_gathered_in_the_rows_fold_to_what_the_reduce_gives(world: int) -> None:
    # small worlds carry each rank's buckets in its gathered row and sum them there
    sketch = SampleBuckets(default_buckets(world))
    hashes: list[torch.Tensor | None] = [_ids(37 * r, 20 + 3 * r) for r in range(world)]
    if world > 2:
        hashes[-1] = None  # a rank that hashed nothing
    if world > 1:
        hashes[0] = _ids(37, 30)  # rank 0 was given rank 1's samples (one data group)
    group_of = [r // 2 for r in range(world)]
    rows = torch.stack([
        SampleBuckets.flat(sketch.local(h, group_of[r], r, world))
        for r, h in enumerate(hashes)
    ])
    got = SampleBuckets.fold_gathered(rows)
    assert got == sketch.summed(hashes, group_of)
    dup, pure = SampleBuckets.classify(got)
    assert (dup, len(pure)) == SampleBuckets.duplicates(got)
    assert SampleBuckets.shared(got) == dup and (world == 1 or dup)
    assert pure == torch.nonzero(SampleBuckets.pure(got)).reshape(-1).tolist()
