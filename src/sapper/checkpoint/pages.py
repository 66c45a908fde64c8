"""Paging a memory-mapped tensor in, in bulk, and dropping its pages once reduced.

``torch.load(mmap=True)`` maps the whole file; every page a reduction touches stays in
the process's resident set until the mapping closes, so reading a 10 GB optimizer file
tensor by tensor would still end with 10 GB resident. ``madvise(MADV_DONTNEED)`` on the
tensor's whole pages removes them from the process again (the page cache keeps them;
a later read faults them back in from the file). Only for file-backed tensors of an
unmodified private mapping: on anonymous memory the same call would zero the data, so
callers pass only tensors they loaded with ``mmap=True`` (or chunks they will not read
again). A no-op off Linux.

``madvise(MADV_POPULATE_READ)`` (Linux 5.14) maps a chunk's pages in one call instead of
one page fault per 4 KB: on a 1 GB safetensors file in the page cache it took the reading
from 2.7 s to 0.2 s. Older kernels answer EINVAL and the pages fault in as usual.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["drop_pages", "drop_range", "populate", "populate_range", "streamed"]

_MADV_DONTNEED = 4
_MADV_POPULATE_READ = 22
_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _advise(tensor: torch.Tensor, advice: int, whole_pages: bool) -> None:
    if tensor.numel() == 0:
        return
    advise_range(tensor.data_ptr(), tensor.numel() * tensor.element_size(), advice, whole_pages)


def advise_range(start: int, nbytes: int, advice: int, whole_pages: bool) -> None:
    """``madvise`` the ``nbytes`` of memory at address ``start`` (a tensor's, or a numpy
    view's of a mapped file): only the pages entirely inside with ``whole_pages``."""
    if _libc is None or nbytes <= 0:
        return
    end = start + nbytes
    if whole_pages:  # only pages entirely inside the tensor: a neighbour keeps its own
        first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    else:
        first, last = start // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE
    if last > first:
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), advice)


def drop_range(start: int, nbytes: int) -> None:
    """Release the resident whole pages of the mapped memory at ``start``."""
    advise_range(start, nbytes, _MADV_DONTNEED, whole_pages=True)


def populate_range(start: int, nbytes: int) -> None:
    """Map the pages of the memory at ``start`` in one call (an error is ignored)."""
    advise_range(start, nbytes, _MADV_POPULATE_READ, whole_pages=False)


def drop_pages(tensor: torch.Tensor) -> None:
    """Release the resident whole pages under a memory-mapped ``tensor``."""
    _advise(tensor, _MADV_DONTNEED, whole_pages=True)


def populate(tensor: torch.Tensor) -> None:
    """Map the pages under ``tensor`` in one call (read-only; an error is ignored)."""
    _advise(tensor, _MADV_POPULATE_READ, whole_pages=False)


def streamed(tensor: torch.Tensor, size: int, mapped: bool) -> Iterator[torch.Tensor]:
    """``tensor`` in flat pieces of ``size`` elements; a memory-mapped one is paged in a
    piece at a time and each piece's pages are given back once the consumer moves on."""
    flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)
    for start in range(0, flat.numel(), size):
        piece = flat[start : start + size]
        if mapped:
            populate(piece)
        yield piece
        if mapped:
            drop_pages(piece)
