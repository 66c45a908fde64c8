"""PyTorch's CUDA caching allocator, replayed on a step's allocations.

``torch.cuda.max_memory_allocated`` counts the blocks handed to live tensors;
``max_memory_reserved`` counts the segments the allocator took from ``cudaMalloc`` and
keeps cached. The gap between them is the allocator's policy, which is deterministic
given the order of requests. The rules below are those of
``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch), default configuration (no
``expandable_segments``, no ``max_split_size_mb``, one stream, no ``empty_cache``):

* ``round_size``: every request is rounded up to a multiple of ``kMinBlockSize`` = 512
  bytes (the allocated figure counts the rounded size);
* requests up to ``kSmallSize`` = 1 MiB come from the small pool, whose segments are
  ``kSmallBuffer`` = 2 MiB; larger ones from the large pool (``get_allocation_size``):
  1–10 MiB requests (below ``kMinLargeAlloc``) get a ``kLargeBuffer`` = 20 MiB segment,
  larger ones a segment rounded up to ``kRoundLarge`` = 2 MiB;
* a request takes the smallest cached free block that fits (best fit), else a new
  segment; the block is split when what remains is worth keeping (``should_split``:
  at least 512 bytes in the small pool, more than 1 MiB in the large one);
* a freed block merges with free neighbours of its segment and stays cached.

:class:`CachingAllocator` replays that policy; the traced estimator feeds it every
allocation and free of the step, so its reserved peak is the allocator's, not a flat
percentage.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "CachingAllocator",
    "round_size",
    "segment_size",
]

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """The block size of a request (``round_size``)."""
    if nbytes < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return -(-nbytes // K_MIN_BLOCK) * K_MIN_BLOCK


def segment_size(block: int) -> int:
    """The ``cudaMalloc`` size for a block no cached block fits (``get_allocation_size``)."""
    if block <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if block < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-block // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(eq=False)
class _Block:
    """A block of a segment; neighbours linked as in PyTorch's ``Block``."""

    size: int
    small: bool
    prev: _Block | None = None
    next: _Block | None = None
    free: bool = True

    def key(self) -> tuple[int, int]:
        return (self.size, id(self))


def _absorb(left: _Block, right: _Block) -> None:
    """Merge ``right`` into its free neighbour ``left`` (PyTorch's ``try_merge_blocks``)."""
    left.size += right.size
    left.next = right.next
    if right.next is not None:
        right.next.prev = left


class CachingAllocator:
    """Allocated and reserved bytes (current and peak) under the allocator's policy."""

    def __init__(self) -> None:
        #: free blocks of each pool sorted by (size, id): best fit is a bisect
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._by_id: dict[int, _Block] = {}
        self._live: dict[int, _Block] = {}  # request key -> its block
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    def _insert(self, block: _Block) -> None:
        block.free = True
        self._by_id[id(block)] = block
        bisect.insort(self._free[block.small], block.key())

    def _remove(self, block: _Block) -> None:
        free = self._free[block.small]
        del free[bisect.bisect_left(free, block.key())]
        del self._by_id[id(block)]

    def malloc(self, key: int, nbytes: int) -> None:
        """Serve request ``key`` of ``nbytes`` (a new key; free it with :meth:`free`)."""
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        free = self._free[small]
        i = bisect.bisect_left(free, (size, -1))
        if i < len(free):
            block = self._by_id[free[i][1]]
            self._remove(block)
        else:
            block = _Block(segment_size(size), small)
            self.reserved += block.size
        remaining = block.size - size
        if remaining >= K_MIN_BLOCK if small else remaining > K_SMALL_SIZE:
            rest = _Block(remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, key: int) -> None:
        """Return request ``key``'s block to the cache, merged with free neighbours."""
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        nxt = block.next
        if nxt is not None and nxt.free:
            self._remove(nxt)
            _absorb(block, nxt)
        prev = block.prev
        if prev is not None and prev.free:
            self._remove(prev)
            _absorb(prev, block)
            block = prev
        self._insert(block)
