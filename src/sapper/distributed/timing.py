"""Per-rank forward time: where a compute straggler shows under DDP.

Under DDP every rank's step time is the same — the gradient all-reduce makes the fast
ranks wait for the slowest — so step time cannot name the straggler. The forward pass of
the unwrapped module runs no collective (DDP's buffer broadcast happens in the wrapper,
before it), so its duration is the rank's own compute: the slow GPU, the thermally
throttled one, the rank with the longer sequences. Timed with forward hooks: host clocks
on CPU, CUDA events on GPU (read every N steps, when the events have long completed, so
there is no extra sync).

Under FSDP/ZeRO-3 the forward all-gathers parameters layer by layer, so it contains the
waits too; there, data-wait time remains the rank-local signal.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

__all__ = ["ForwardTimer", "unwrap_module"]


def unwrap_module(model: Any) -> nn.Module | None:
    """The user's module inside DDP / a DeepSpeed engine / ``torch.compile``."""
    seen = 0
    while seen < 8:
        seen += 1
        inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
            continue
        break
    return model if isinstance(model, nn.Module) else None


class ForwardTimer:
    """Seconds spent in ``module``'s forward since the last :meth:`take`."""

    #: CUDA event pairs kept per window at most (grad accumulation × N steps).
    MAX_EVENTS = 4096

    def __init__(self, module: nn.Module) -> None:
        self._host_total = 0.0
        self._t0: float | None = None
        self._events: list[tuple[Any, Any]] = []
        self._open: Any = None
        self._handles = [
            module.register_forward_pre_hook(self._pre),
            module.register_forward_hook(self._post),
        ]

    def _cuda(self) -> bool:
        # is_initialized() first: a flag read, where is_available() asks the driver
        # (microseconds, twice a forward)
        return torch.cuda.is_initialized() and torch.cuda.is_available()

    def _pre(self, *_: Any) -> None:
        if self._cuda():
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._t0 = time.perf_counter()

    def _post(self, *_: Any) -> None:
        if self._open is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            if len(self._events) < self.MAX_EVENTS:
                self._events.append((self._open, end))
            self._open = None
        elif self._t0 is not None:
            self._host_total += time.perf_counter() - self._t0
            self._t0 = None

    def take(self) -> float:
        """Total forward seconds this window; resets. Call at the exchange only (it waits
        for the recorded CUDA events, long finished by then)."""
        total = self._host_total
        for start, end in self._events:
            end.synchronize()
            total += start.elapsed_time(end) / 1000.0
        self._host_total = 0.0
        self._events = []
        return total

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
