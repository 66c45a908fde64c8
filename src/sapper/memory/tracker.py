"""Live tensor bytes over a training step, by category, from the dispatcher.

:class:`LiveBytes` is a ``TorchDispatchMode``: every op's output storage is counted once
when it first appears and uncounted when the storage dies (a finalizer on the storage
object, which PyTorch keeps alive exactly as long as the storage). Views share their
base's storage, so nothing is counted twice. It works the same on real tensors and on
fake ones (``FakeTensorMode``), so a 7B step can be traced with no memory at all.

Categories: ``params`` / ``optimizer`` (registered before the step), ``grads`` (re-tagged
when autograd accumulates them), ``activations`` (re-tagged when autograd saves them for
backward), everything else ``temporaries``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sapper.memory.allocator import CachingAllocator

__all__ = ["LiveBytes"]

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries")


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages; remembers the peak and its breakdown."""

    def __init__(self, allocator: CachingAllocator | None = None) -> None:
        super().__init__()
        #: replays every allocation and free under the CUDA caching allocator's rules
        self.allocator = allocator
        self._live: dict[int, list[Any]] = {}  # storage key -> [nbytes, category]
        self.totals: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.peak = 0
        self.peak_breakdown: dict[str, int] = dict(self.totals)
        self.phase = "setup"
        self.peak_phase = "setup"
        #: phase -> (peak bytes in that phase, breakdown at that moment)
        self.phases: dict[str, tuple[int, dict[str, int]]] = {}
        self._casts: set[int] = set()  # low-precision copies of parameters (autocast)

    # ---- bookkeeping -----------------------------------------------------------------
    def _bump(self) -> None:
        if self.current > self.peak:
            self.peak = self.current
            self.peak_breakdown = dict(self.totals)
            self.peak_phase = self.phase
        best = self.phases.get(self.phase)
        if best is None or self.current > best[0]:
            self.phases[self.phase] = (self.current, dict(self.totals))

    def _free(self, key: int) -> None:
        self._casts.discard(key)
        entry = self._live.pop(key, None)
        if self.allocator is not None:
            self.allocator.free(key)
        if entry is not None:
            self.current -= entry[0]
            self.totals[entry[1]] -= entry[0]

    def track(self, t: torch.Tensor, category: str = "temporaries") -> None:
        """Count ``t``'s storage if it is new (or has grown)."""
        st = t.untyped_storage()
        key = st._cdata
        nbytes = st.nbytes()
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [nbytes, category]
            if self.allocator is not None:
                self.allocator.malloc(key, nbytes)
            weakref.finalize(st, self._free, key)
            self.current += nbytes
            self.totals[category] += nbytes
            self._bump()
        elif entry[0] != nbytes:  # resized in place
            if self.allocator is not None:
                self.allocator.free(key)
                self.allocator.malloc(key, nbytes)
            self.current += nbytes - entry[0]
            self.totals[entry[1]] += nbytes - entry[0]
            entry[0] = nbytes
            self._bump()

    def tag(self, t: torch.Tensor, category: str, only_from: Iterable[str] = ()) -> None:
        """Move ``t``'s storage to ``category`` (tracking it first if needed)."""
        self.track(t, category)
        key = t.untyped_storage()._cdata
        if key in self._casts:
            return
        entry = self._live[key]
        allowed = set(only_from)
        if entry[1] != category and (not allowed or entry[1] in allowed):
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.phases.setdefault(phase, (self.current, dict(self.totals)))

    def category_of(self, t: torch.Tensor) -> str | None:
        entry = self._live.get(t.untyped_storage()._cdata)
        return entry[1] if entry else None

    # ---- the dispatcher hook -----------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.track(t)
        if func is torch.ops.aten._to_copy.default and isinstance(out, torch.Tensor):
            # autocast's copy of a weight: a temporary of the step, not an activation
            if args and isinstance(args[0], torch.Tensor) and self.category_of(args[0]) == "params":
                self._casts.add(out.untyped_storage()._cdata)
        return out
