"""Sample fingerprints, bottom-k sketches and the packed per-rank row."""

from __future__ import annotations

import math

import torch

from sapper.distributed import BottomKSketch, RankTable, jaccard, sample_hashes
from sapper.distributed.sampling import MAX_POSITIONS
from sapper.distributed.table import COLUMNS, pack_row


def test_equal_samples_hash_equal_and_fit_52_bits() -> None:
    ids = torch.randint(0, 50_000, (8, 64), generator=torch.Generator().manual_seed(1))
    h = sample_hashes(ids)
    assert h is not None and h.shape == (8,) and h.dtype == torch.int64
    assert int(h.max()) < 2**52 and len(set(h.tolist())) == 8
    again = sample_hashes({"input_ids": ids.clone(), "labels": ids})
    assert again is not None and torch.equal(h, again)
    shifted = ids.roll(1, dims=1)  # same tokens, other positions: other samples
    assert not set(sample_hashes(shifted).tolist()) & set(h.tolist())


def test_other_batch_shapes() -> None:
    assert sample_hashes([3, 1, 4]).shape == (3,)  # a list of sample ids
    imgs = torch.randn(2, 3, 8, 8)
    assert sample_hashes((imgs, torch.tensor([0, 1]))).shape == (2,)
    assert sample_hashes(torch.randn(4, 16).half()).shape == (4,)
    long = torch.randint(0, 100, (2, MAX_POSITIONS * 2))
    assert sample_hashes(long).shape == (2,)
    assert sample_hashes("text") is None and sample_hashes(torch.empty(0, 4)) is None


def test_sketch_keeps_the_smallest_distinct_values() -> None:
    s = BottomKSketch(4)
    s.add(torch.tensor([50, 7, 7, 30]))
    s.add(torch.tensor([7, 5]))
    assert s.count == 6
    assert s.take().tolist() == [5.0, 7.0, 30.0, 50.0]
    assert s.take().tolist() == [-1.0] * 4  # reset


def test_jaccard_estimate_of_half_shared_sets() -> None:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 1000, (3000, 12), generator=gen)
    a, b = BottomKSketch(256), BottomKSketch(256)
    a.add(sample_hashes(ids[:2000]))
    b.add(sample_hashes(ids[1000:]))  # 1000 shared of 3000 distinct: J = 1/3
    est = jaccard(a.take().tolist(), b.take().tolist())
    assert est is not None and abs(est - 1 / 3) < 0.1
    assert jaccard([-1.0, -1.0], [1.0, 2.0]) is None


def test_row_round_trip_keeps_unknown_apart_from_nan() -> None:
    values = {"step": 9, "steps": 5, "loss": torch.tensor(float("nan")), "grad_norm": 0.5,
              "checksum": torch.tensor(1.25, dtype=torch.float64)}
    sketch = torch.tensor([3.0, 8.0, -1.0], dtype=torch.float64)
    rows = torch.stack([pack_row(values, sketch), pack_row({**values, "loss": 2.0}, sketch)])
    assert rows.shape == (2, len(COLUMNS) + 1 + 3)
    t = RankTable.from_tensor(rows, data_groups=[[0, 1]], param_groups=[[0, 1]], prev_step=4)
    assert t.step == 9 and t.world_size == 2
    assert math.isnan(t.col("loss")[0]) and t.col("loss")[1] == 2.0
    assert t.col("data_time_s") == [None, None] and t.col("checksum") == [1.25, 1.25]
    assert t.sketches[0] == [3.0, 8.0, -1.0]
    back = RankTable.from_extra(t.to_extra())
    assert back is not None and back.sketches == [[3.0, 8.0], [3.0, 8.0]]
    assert back.col("grad_norm") == [0.5, 0.5] and back.prev_step == 4
