"""Sample fingerprints: did two data-parallel ranks get the same samples? (seed §5.3)

A loader built without a ``DistributedSampler`` (or with the same shard index on every
rank) feeds every replica the same batches: no error, N GPUs doing one GPU's work, a loss
that falls too fast. To see it, every sample is hashed on its own device (a polynomial
hash of its token ids modulo two Mersenne-prime moduli: exact integer arithmetic, no
overflow, the same on CPU and GPU) and each rank keeps a bottom-k sketch of the hashes it
saw in the current window: the k smallest distinct values. Two ranks' sketches estimate
how much their sample sets overlap (the classic k-minimum-values Jaccard estimate) with a
fixed, tiny payload, and keeping the sketch needs no host sync.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["BottomKSketch", "jaccard", "sample_hashes", "sample_ids"]

#: Keys under which a loop's batch dict carries its samples' own ids.
ID_KEYS = ("sample_ids", "sample_id", "ids", "idx", "index", "indices")

_P = (1 << 31) - 1
#: Hashes fit 52 bits so they survive a float64 round trip exactly.
_BITS_LOW = 21
_SENTINEL = 1 << 62
#: At most this many positions of a sample are hashed (evenly spaced).
MAX_POSITIONS = 4096
_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    w = _WEIGHTS.get(key)
    if w is None:
        gen = torch.Generator().manual_seed(0x5A99E2)  # same on every rank and run
        w = torch.randint(1, _P, (2, n), generator=gen, dtype=torch.int64).to(device)
        _WEIGHTS[key] = w
    return w


def _as_samples(batch: Any) -> torch.Tensor | None:
    """The part of a batch that identifies its samples, as ``(batch, features)`` int64."""
    if isinstance(batch, Mapping):
        for key in ("input_ids", "sample_ids", "ids", "idx", "index", "pixel_values"):
            if isinstance(batch.get(key), torch.Tensor):
                return _as_samples(batch[key])
        tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
        return _as_samples(tensors[0]) if tensors else None
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        if batch and isinstance(batch[0], torch.Tensor):
            return _as_samples(batch[0])
        if batch and all(isinstance(v, int) for v in batch):
            return torch.tensor(batch, dtype=torch.int64).reshape(-1, 1)
        return None
    if not isinstance(batch, torch.Tensor) or batch.dim() == 0 or batch.numel() == 0:
        return None
    t = batch.detach()
    if t.dim() == 1:  # one id per sample
        t = t.reshape(-1, 1)
    t = t.reshape(t.shape[0], -1)
    if t.is_floating_point() or t.is_complex():
        t = t.contiguous()
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
        if width is None or t.is_complex():
            return None
        t = t.view(width)  # the bit patterns: equal samples, equal hashes
    elif t.dtype == torch.bool:
        t = t.to(torch.int64)
    return t.to(torch.int64)


def sample_ids(batch: Any) -> torch.Tensor | list[Any] | None:
    """The samples' own ids when the loop hands them over: a dict batch with an
    integer ``sample_ids``/``ids``/``idx``/``index`` tensor (one id per sample) or list.
    Kept as it is (a device tensor is not read here). None when the batch has none."""
    if not isinstance(batch, Mapping):
        return None
    for key in ID_KEYS:
        v = batch.get(key)
        if isinstance(v, torch.Tensor) and not v.is_floating_point() and v.dim() == 1:
            return v.detach()
        if isinstance(v, list | tuple) and v and all(isinstance(x, int | str) for x in v):
            return list(v)
    return None


def sample_hashes(batch: Any) -> torch.Tensor | None:
    """One 52-bit hash per sample of ``batch`` (a tensor ``(B, ...)``, a dict with
    ``input_ids``/sample ids, a tuple whose first item is the inputs, or a list of integer
    sample ids), on the batch's device. None when nothing in it identifies samples."""
    t = _as_samples(batch)
    if t is None or t.shape[0] == 0:
        return None
    if t.shape[1] > MAX_POSITIONS:
        idx = torch.linspace(0, t.shape[1] - 1, MAX_POSITIONS, device=t.device).long()
        t = t[:, idx]
    x = torch.remainder(t, _P)  # in [0, P)
    w = _weights(t.shape[1], t.device)
    # Each term < 2^62 reduced mod P before summing: sums stay far below 2^63.
    h1 = torch.remainder(torch.remainder(x * w[0], _P).sum(dim=1), _P)
    h2 = torch.remainder(torch.remainder(x * w[1], _P).sum(dim=1), _P)
    return (h1 << _BITS_LOW) | (h2 & ((1 << _BITS_LOW) - 1))


class BottomKSketch:
    """The ``k`` smallest distinct sample hashes seen since the last :meth:`take`."""

    def __init__(self, k: int = 16) -> None:
        self.k = int(k)
        self._values: torch.Tensor | None = None
        self.count = 0  # samples seen this window (host-side: from shapes, no sync)

    def add(self, hashes: torch.Tensor) -> None:
        self.count += int(hashes.numel())
        cur = (
            hashes
            if self._values is None
            else torch.cat([self._values, hashes.to(self._values.device)])
        )
        s, _ = torch.sort(cur)
        dup = torch.zeros_like(s, dtype=torch.bool)
        dup[1:] = s[1:] == s[:-1]
        s = torch.where(dup, torch.full_like(s, _SENTINEL), s)
        self._values = torch.sort(s).values[: self.k]

    def take(self) -> torch.Tensor:
        """The sketch as ``k`` float64 values (-1 for empty slots), on the device it was
        kept on (no sync); resets the window."""
        if self._values is None:
            out = torch.full((self.k,), -1.0, dtype=torch.float64)
        else:
            v = self._values
            pad = torch.full((self.k,), _SENTINEL, dtype=v.dtype, device=v.device)
            v = torch.cat([v, pad])[: self.k]
            out = torch.where(v >= _SENTINEL, -1.0, v.to(torch.float64))
        self._values = None
        self.count = 0
        return out


def jaccard(a: Sequence[float], b: Sequence[float], k: int | None = None) -> float | None:
    """Estimated overlap |A∩B| / |A∪B| of two windows' sample sets from their sketches
    (None when either is empty)."""
    sa = {int(v) for v in a if v >= 0}
    sb = {int(v) for v in b if v >= 0}
    if not sa or not sb:
        return None
    k = k or max(len(a), len(b))
    union = sorted(sa | sb)[:k]
    return sum(1 for v in union if v in sa and v in sb) / len(union)
