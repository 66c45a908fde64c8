"""A full-tensor parameter checksum to compare data-parallel replicas bit for bit.

DP replicas must stay bit-identical: same initial weights (DDP broadcasts them), same
averaged gradient, same update. They drift apart silently when one rank loads a
checkpoint the others did not, skips an update the others made, changes a weight outside
the optimizer (an EMA, a rank-0-only edit) or suffers a flipped bit in memory. Sampling a
few elements per tensor misses a single changed element forever, so every element counts.

The checksum is integer arithmetic on the parameters' bits, on their device, with no host
sync until the exchange reads it: each tensor is viewed as 32-bit words (16-bit for bf16 and
fp16, 8-bit for fp8; an fp64 element is two words), cut into rows of :data:`ROW` words; the
rows are summed in int64 (one read pass, no full-size temporary), and the row sums are mixed
with per-row even weights::

    c = Σ_j r_j · (1 + w_j)        (w_j even, wrapping modulo 2**64)
    C = Σ_t c_t · p_t              (p_t odd, one per tensor, or per chunk of tensors)

A single element changed by a word difference ``δ`` (0 < |δ| < 2**32) moves ``C`` by ``δ``
times an odd number, which is never 0 modulo 2**52 — the 52 bits that travel exactly in the
float64 exchange. So any one-element difference between replicas is caught, whatever its
size, and integer sums (unlike float ones) do not depend on the reduction order. Rows make it
position-dependent: elements moved between rows change it too (a swap within one row of
1024 words does not). At the exchange the small tensors are checksummed concatenated, in
chunks (:class:`ParamChecksum`): a few kernels for the whole model, the same guarantee.

Sharded parameters (FSDP2 DTensors, ZeRO-3) are summed over their local shard, and the
replica groups follow the device mesh: ranks that differ only along mesh dimensions where
every parameter is replicated (HSDP's replicate dimension) must agree; a fully sharded mesh
has no replicas to compare. Measured cost: ``benchmarks/replica_checksum.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["MASK52", "ROW", "ParamChecksum", "mesh_replica_groups", "tensor_checksum"]

#: Words per row (the position mix works between rows).
ROW = 1024
#: The checksum's bits that survive the float64 exchange exactly.
MASK52 = (1 << 52) - 1
_WORD = {1: torch.int8, 2: torch.int16}


def _s64(x: int) -> int:
    """``x`` modulo 2**64 as a signed int64 (what wrapping tensor arithmetic holds)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


_ROW_EVEN = _s64(2 * 0x9E3779B97F4A7C15)  # even row weights w_j = j · this
_TENSOR_ODD = _s64(0xC2B2AE3D27D4EB4F)
_TENSOR_EVEN = _s64(2 * 0xC2B2AE3D27D4EB4F)


def _local(p: torch.Tensor) -> torch.Tensor:
    to_local = getattr(p, "to_local", None)
    return to_local() if callable(to_local) else p


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as a flat integer tensor of words (a view when contiguous)."""
    t = t.detach()
    if t.dtype == torch.bool:
        return t.reshape(-1).to(torch.int8)
    if t.is_complex():
        t = torch.view_as_real(t)
    flat = t.reshape(-1)
    size = flat.element_size()
    if size in _WORD:
        return flat.view(_WORD[size])
    return flat.view(torch.int32)  # 4-byte elements as one word, 8-byte ones as two


def _row_weights(rows: int, device: torch.device) -> torch.Tensor:
    """1 + w_j with w_j even: an odd multiplier per row (wrapping int64 arithmetic)."""
    j = torch.arange(1, rows + 1, dtype=torch.int64, device=device)
    return j * _ROW_EVEN + 1


def tensor_checksum(t: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``c`` for one tensor: a 0-dim int64 on its device (no host sync)."""
    w = _words(t)
    n = w.numel()
    full = n - n % ROW
    rows = full // ROW
    total = torch.zeros((), dtype=torch.int64, device=w.device)
    if rows:
        sums = w[:full].view(rows, ROW).sum(dim=1, dtype=torch.int64)
        if weights is None or weights.numel() != rows:
            weights = _row_weights(rows, w.device)
        total = (sums * weights).sum()
    if full < n:  # the tail is row number rows + 1
        tail = w[full:].sum(dtype=torch.int64)
        total = total + tail * _s64((rows + 1) * _ROW_EVEN + 1)
    return total


class ParamChecksum:
    """``compute()`` -> a 0-dim float64 tensor on the parameters' device (no host sync):
    the 52-bit full-tensor checksum of every parameter; ``per_param()`` -> one per tensor,
    to name the parameter that differs.

    ``compute`` runs at every exchange, so it takes a few kernels for the whole model
    rather than a few per tensor (a model of hundreds of tensors would otherwise launch
    over a thousand small kernels each time): consecutive tensors of one device and word
    size are concatenated into chunks of up to :attr:`CHUNK_WORDS` words (a copy of the
    small tensors only; a tensor that size or larger is summed where it is) and each
    chunk is checksummed as one tensor, the chunks mixed with odd multipliers as tensors
    are. A single changed word still moves the result by an odd multiple of its
    difference, so any one-element difference between replicas shows. ``per_param`` (the
    once-per-run drill-down) keeps one checksum per tensor."""

    #: Words concatenated into one chunk at most (16 MiB of 32-bit words).
    CHUNK_WORDS = 1 << 22

    def __init__(
        self, params: Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        named: list[tuple[str, torch.Tensor]] = []
        for i, item in enumerate(params):
            name, p = item if isinstance(item, tuple) else (f"parameter {i}", item)
            if isinstance(p, torch.Tensor):
                named.append((name, p))
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._weights: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _weights_for(self, rows: int, device: torch.device) -> torch.Tensor | None:
        if not rows:
            return None
        key = (rows, device)
        w = self._weights.get(key)
        if w is None:
            if len(self._weights) > 4096:  # shapes that keep changing: do not grow
                self._weights.clear()
            w = self._weights[key] = _row_weights(rows, device)
        return w

    def _checksum(self, words: torch.Tensor) -> torch.Tensor:
        return tensor_checksum(words, self._weights_for(words.numel() // ROW, words.device))

    def _sums(self) -> torch.Tensor | None:
        terms = []
        with torch.no_grad():
            for p in self.params:
                local = _local(p)
                if local.numel() == 0:
                    terms.append(torch.zeros((), dtype=torch.int64))
                    continue
                terms.append(self._checksum(_words(local)))
        if not terms:
            return None
        return _stack(terms)

    def _chunks(self) -> list[list[torch.Tensor]]:
        """The parameters' words in checksum chunks (consecutive, one device and word
        type each, at most :attr:`CHUNK_WORDS` words unless a single tensor is more)."""
        chunks: list[list[torch.Tensor]] = []
        key: tuple[torch.device, torch.dtype] | None = None
        size = 0
        for p in self.params:
            local = _local(p)
            if local.numel() == 0:
                continue
            w = _words(local)
            n = w.numel()
            k = (w.device, w.dtype)
            if chunks and k == key and size + n <= self.CHUNK_WORDS:
                chunks[-1].append(w)
                size += n
            else:
                chunks.append([w])
                key, size = k, n
        return chunks

    def per_param(self) -> torch.Tensor | None:
        """Each tensor's ``c`` cut to 52 bits, as float64 (exact)."""
        sums = self._sums()
        return None if sums is None else (sums & MASK52).to(torch.float64)

    def compute(self) -> torch.Tensor | None:
        if not self.params:
            return None
        with torch.no_grad():
            terms = [
                self._checksum(words[0] if len(words) == 1 else torch.cat(words))
                for words in self._chunks()
            ]
        if not terms:  # every parameter is empty
            terms = [torch.zeros((), dtype=torch.int64)]
        sums = _stack(terms)
        t = torch.arange(len(sums), dtype=torch.int64, device=sums.device)
        mixed = (sums * (t * _TENSOR_EVEN + _TENSOR_ODD)).sum()  # odd p_t per chunk
        return (mixed & MASK52).to(torch.float64)


def _stack(terms: list[torch.Tensor]) -> torch.Tensor:
    """0-dim int64 terms as one vector on the first accelerator among them."""
    dev = next((t.device for t in terms if t.device.type != "cpu"), terms[0].device)
    return torch.stack([t.to(dev) for t in terms])


def mesh_replica_groups(params: Iterable[Any]) -> list[list[int]] | None:
    """Replica groups implied by DTensor parameters on one device mesh: ranks that differ
    only along dims where every parameter is ``Replicate``. None when no parameter is a
    DTensor (the layout then comes from the Plan); ``[]`` when nothing is replicated."""
    mesh = None
    replicated: set[int] | None = None
    for p in params:
        placements = getattr(p, "placements", None)
        device_mesh = getattr(p, "device_mesh", None)
        if placements is None or device_mesh is None:
            continue
        if mesh is None:
            mesh = device_mesh
        elif device_mesh != mesh:
            return []  # several meshes: no single replica relation to check
        dims = {i for i, pl in enumerate(placements) if pl.is_replicate()}
        replicated = dims if replicated is None else replicated & dims
    if mesh is None:
        return None
    if not replicated:
        return []
    grid = mesh.mesh  # ranks laid out as a tensor, one axis per mesh dim
    keep = [d for d in range(grid.dim()) if d not in replicated]
    order = keep + sorted(replicated)
    flat = grid.permute(order).reshape(
        -1, int(torch.tensor([grid.shape[d] for d in sorted(replicated)]).prod())
    )
    return sorted(sorted(int(r) for r in row) for row in flat)
