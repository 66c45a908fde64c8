"""Dropping the pages of a memory-mapped tensor once it has been reduced.

``torch.load(mmap=True)`` maps the whole file; every page a reduction touches stays in
the process's resident set until the mapping closes, so reading a 10 GB optimizer file
tensor by tensor would still end with 10 GB resident. ``madvise(MADV_DONTNEED)`` on the
tensor's whole pages removes them from the process again (the page cache keeps them;
a later read faults them back in from the file). Only for file-backed tensors of an
unmodified private mapping: on anonymous memory the same call would zero the data, so
callers pass only tensors they loaded with ``mmap=True``. A no-op off Linux.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

__all__ = ["drop_pages"]

_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def drop_pages(tensor: torch.Tensor) -> None:
    """Release the resident whole pages under a memory-mapped ``tensor``."""
    if _libc is None or tensor.numel() == 0:
        return
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first = -(-start // _PAGE) * _PAGE
    last = end // _PAGE * _PAGE
    if last > first:
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED)
