"""Count host–device synchronisation points in a block of code.

Every way a tensor's value reaches Python (``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, ``bool(t)``, ``float(t)``, ``int(t)``) waits for the device on an
accelerator. :class:`HostSyncCounter` patches those entry points while it is active and
counts the calls, on any device, so a CPU run already shows where a GPU run would stall.
The sapper benchmark and tests use it to prove the monitor adds none per step; it works
for any training loop.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

__all__ = ["HostSyncCounter"]

_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


class HostSyncCounter:
    """``with HostSyncCounter() as c: ...``; then ``c.total`` and ``c.by_method``."""

    def __init__(self) -> None:
        self.by_method: Counter[str] = Counter()
        self._saved: dict[str, Any] = {}

    @property
    def total(self) -> int:
        return sum(self.by_method.values())

    def reset(self) -> None:
        self.by_method.clear()

    def __enter__(self) -> HostSyncCounter:
        for name in _METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counting(name, original))
        return self

    def _counting(self, name: str, original: Any) -> Any:
        counts = self.by_method

        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(tensor, *args, **kwargs)

        method.__name__ = name
        return method

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
