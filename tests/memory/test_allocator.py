"""The caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp), replayed."""

from __future__ import annotations

from sapper.memory.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    CachingAllocator,
    round_size,
    segment_size,
)

MIB = 1 << 20


def test_rounding_and_segment_sizes() -> None:
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert segment_size(round_size(4)) == K_SMALL_BUFFER
    assert segment_size(MIB) == K_SMALL_BUFFER  # up to 1 MiB: the small pool
    assert segment_size(MIB + 512) == K_LARGE_BUFFER  # 1-10 MiB: a 20 MiB segment
    assert segment_size(10 * MIB + 512) == 12 * MIB  # larger: rounded up to 2 MiB


def test_small_requests_share_a_two_mib_segment() -> None:
    a = CachingAllocator()
    for k in range(4):
        a.malloc(k, 100_000)
    assert a.reserved == K_SMALL_BUFFER
    assert a.allocated == 4 * round_size(100_000)


def test_medium_requests_split_a_twenty_mib_segment() -> None:
    a = CachingAllocator()
    for k in range(3):
        a.malloc(k, 6 * MIB)
    # two 6 MiB blocks fit one 20 MiB segment (8 MiB left, split off); the third fits too
    assert a.reserved == K_LARGE_BUFFER
    a.malloc(3, 6 * MIB)  # 2 MiB left: not enough, a new segment
    assert a.reserved == 2 * K_LARGE_BUFFER


def test_freed_blocks_are_cached_and_merged() -> None:
    a = CachingAllocator()
    a.malloc(0, 30 * MIB)
    a.free(0)
    assert a.allocated == 0 and a.reserved == 30 * MIB  # kept, not returned
    a.malloc(1, 12 * MIB)
    a.malloc(2, 12 * MIB)  # both from the cached 30 MiB segment (split)
    assert a.reserved == 30 * MIB
    a.free(1)
    a.free(2)
    a.malloc(3, 28 * MIB)  # the halves merged back into one free block
    assert a.reserved == 30 * MIB


def test_fragmentation_needs_a_new_segment() -> None:
    a = CachingAllocator()
    a.malloc(0, 12 * MIB)
    a.malloc(1, 12 * MIB)
    a.free(0)  # 12 MiB free, but a larger request cannot use it
    a.malloc(2, 14 * MIB)
    assert a.reserved == 38 * MIB
    assert a.peak_allocated == 26 * MIB
