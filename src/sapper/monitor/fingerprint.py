"""Per-sample fingerprints computed where the batch lives, read at the log interval.

A fingerprint is a 64-bit linear hash of a sample's values: ``sum(x_i · P_i)`` with ``P``
a fixed vector of odd random 64-bit multipliers, in int64 arithmetic that wraps, plus the
sample length (:func:`finish_fingerprint`, on the host, so that samples of different
lengths differ). It is one multiply and one sum per batch, runs on the GPU without a host
sync, and two
different token sequences collide with probability about 2⁻⁴⁵ (token ids are below 2²⁰);
it is not cryptographic, and need not be. Floating-point samples are hashed through their
bit patterns.
"""

from __future__ import annotations

import torch

__all__ = ["fingerprint_rows", "finish_fingerprint"]

_MULTIPLIERS: dict[tuple[torch.device, int], torch.Tensor] = {}
_SEED = 0x5A9_9E4


def _multipliers(device: torch.device, length: int) -> torch.Tensor:
    key = (device, length)
    p = _MULTIPLIERS.get(key)
    if p is None:
        gen = torch.Generator().manual_seed(_SEED)
        hi = torch.randint(0, 2**31, (length,), generator=gen, dtype=torch.int64)
        lo = torch.randint(0, 2**31, (length,), generator=gen, dtype=torch.int64)
        p = ((hi << 32) | (lo << 1) | 1).to(device)
        if len(_MULTIPLIERS) > 64:
            _MULTIPLIERS.clear()
        _MULTIPLIERS[key] = p
    return p


def _as_int64(x: torch.Tensor) -> torch.Tensor:
    if x.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        return x.to(torch.int64)
    if x.dtype in (torch.float32,):
        return x.contiguous().view(torch.int32).to(torch.int64)
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.contiguous().view(torch.int16).to(torch.int64)
    if x.dtype == torch.float64:
        return x.contiguous().view(torch.int64)
    return x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)


def fingerprint_rows(x: torch.Tensor) -> torch.Tensor:
    """One raw int64 fingerprint per sample (first dimension) of ``x``, on its device;
    :func:`finish_fingerprint` completes it on the host.

    This runs on every micro-batch, so the usual case, a 2-D int64 batch of token ids,
    takes one kernel: an integer matrix-vector product on the CPU (the same wrapping
    sum as multiply-then-sum, bit for bit; CUDA has no int64 matmul, so it keeps the
    two kernels there). Integer tensors never carry autograd history: nothing to
    detach."""
    if x.dtype == torch.int64 and x.dim() == 2:
        p = _multipliers(x.device, x.shape[1])
        return torch.mv(x, p) if x.device.type == "cpu" else (x * p).sum(dim=1)
    with torch.no_grad():
        rows = x.detach().reshape(x.shape[0], -1) if x.dim() > 1 else x.detach().reshape(1, -1)
        v = _as_int64(rows)
        return (v * _multipliers(v.device, v.shape[1])).sum(dim=1)


def finish_fingerprint(raw: int, length: int) -> str:
    """The sample's fingerprint as 16 hex digits: raw hash mixed with the length."""
    h = (raw + length * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"
