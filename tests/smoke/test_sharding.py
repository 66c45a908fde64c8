"""S008 over a whole epoch: every sample read by exactly one rank. The planted sharding
mistakes read disjoint samples in the first micro-batches, which a window of a few batches
cannot tell from a correct sampler; the epoch count catches them with their numbers."""

from __future__ import annotations

import pytest
import torch
from smoke_planted import (
    rank_seeded_loader,
    replicas_doubled_loader,
    sharded_loader,
    unsharded_loader,
)
from torch.utils.data import DataLoader, DistributedSampler

from sapper.smoke.batches import LoaderFactory, SyntheticTokens, fingerprints, pad_samples, take
from sapper.smoke.context import SmokeConfig, SmokeContext
from sapper.smoke.sharding import epoch_coverage, run_epoch_check
from sapper.smoke.step import DefaultTrainStep


def _s008(factory, fn) -> object:
    ctx = SmokeContext.create(factory, LoaderFactory(fn), DefaultTrainStep(), SmokeConfig())
    return run_epoch_check(ctx)


def _first_batches_disjoint(fn, k: int = 2) -> bool:
    source = LoaderFactory(fn)
    seen = [{fp for b in take(source, k, r, 2) for fp in fingerprints(b)} for r in range(2)]
    return not seen[0] & seen[1]


def test_correct_sampler_reads_every_sample_once(llama) -> None:
    s008 = _s008(llama, sharded_loader)
    assert s008.data["status"] == "pass", s008.message
    assert s008.data["whole_epoch"] is True
    assert s008.data["samples_per_rank"] == [32, 32]
    assert s008.data["dataset_size"] == 64
    assert s008.data["overlap"] == s008.data["missing"] == 0
    assert "exactly once over one epoch" in s008.message


def test_rank_seeded_shuffle_overlaps_though_the_first_batches_do_not(llama) -> None:
    assert _first_batches_disjoint(rank_seeded_loader)
    s008 = _s008(llama, rank_seeded_loader)
    assert s008.data["status"] == "fail"
    overlap, missing = s008.data["overlap"], s008.data["missing"]
    assert overlap > 0 and missing > 0
    # both ranks read 32 samples of 64: every extra read leaves one sample unread
    assert overlap == missing
    expected = {fp for b in take(LoaderFactory(rank_seeded_loader), 16) for fp in fingerprints(b)}
    ranks = [
        [fp for b in LoaderFactory(rank_seeded_loader).batches(r, 2) for fp in fingerprints(b)]
        for r in range(2)
    ]
    assert missing == len(expected - set(ranks[0]) - set(ranks[1]))
    assert f"{missing} of 64 samples read by no rank" in s008.message


def test_num_replicas_twice_the_world_leaves_half_the_epoch_unread(llama) -> None:
    assert _first_batches_disjoint(replicas_doubled_loader)
    s008 = _s008(llama, replicas_doubled_loader)
    assert s008.data["status"] == "fail"
    assert s008.data["overlap"] == 0
    assert s008.data["missing"] == 32
    assert s008.data["single_process_short"] == 32
    assert "even one process reads only 32 of the dataset's 64" in s008.message


def test_unsharded_loader_counts_every_repeat(llama) -> None:
    s008 = _s008(llama, unsharded_loader)
    assert s008.data["status"] == "fail"
    assert s008.data["overlap"] == 64 and s008.data["missing"] == 0


def _padded_sampler_loader(rank: int, world_size: int) -> DataLoader:
    data = [torch.arange(i, i + 5) for i in range(65)]  # 65 samples over 2 ranks
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=pad_samples)


def test_the_epoch_tail_of_a_correct_sampler_is_allowed() -> None:
    """DistributedSampler repeats one sample so both ranks read 33; not a sharding bug."""
    cov = epoch_coverage(LoaderFactory(_padded_sampler_loader), 2, 128, 65)
    assert cov.complete and cov.overlap == 1 and cov.missing == 0
    assert cov.overlap <= cov.tail_overlap


def test_a_stream_is_compared_over_a_window() -> None:
    cov = epoch_coverage(SyntheticTokens(512, 16, 2), 2, 8)
    assert not cov.complete
    assert cov.batches_per_rank == [8, 8] and cov.single_samples == 32
    assert cov.overlap == cov.missing == 0


class _RandomCrops:
    """A loader whose samples change between reads: no stable identity to compare."""

    def batches(self, rank: int = 0, world_size: int = 1):
        for _ in range(4):
            yield pad_samples([torch.randint(0, 100, (8,)) for _ in range(2)])


@pytest.mark.parametrize("world", [2, 3])
def test_unstable_samples_are_inconclusive_not_failed(llama, world: int) -> None:
    config = SmokeConfig(dp_world_size=world)
    ctx = SmokeContext.create(llama, _RandomCrops(), DefaultTrainStep(), config)
    s008 = run_epoch_check(ctx)
    assert s008.data["status"] == "warn"
    assert s008.data["reproducible"] is False
    assert "sharding not verified" in s008.message


def _breaks_mid_epoch(rank: int, world_size: int):
    for i, batch in enumerate(sharded_loader(rank, world_size)):
        if i == 3:
            raise OSError("shard file vanished")
        yield batch


def test_a_loader_that_fails_mid_epoch_is_reported_as_s008(llama) -> None:
    from sapper.smoke.data_parallel import _epoch

    ctx = SmokeContext.create(
        llama, LoaderFactory(_breaks_mid_epoch), DefaultTrainStep(), SmokeConfig()
    )
    s008 = _epoch(ctx)
    assert s008.code == "S008" and s008.data["status"] == "fail"
    assert "OSError: shard file vanished" in s008.message
