"""Memory, device limits and model FLOPs: host-side reads that never touch the stream.

CUDA memory counters come from the caching allocator's host-side statistics (no sync);
on CPU the process RSS comes from ``/proc/self/statm`` (Linux) or ``getrusage`` (peak
RSS elsewhere), and the limit is the cgroup's memory limit or the physical RAM.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn

from sapper.plan.hardware import GPUS, GpuSpec, find_gpu

__all__ = ["MemoryReader", "flops_per_token", "match_gpu", "peak_flops"]

GIB = float(1 << 30)


def _cpu_limit_bytes() -> float | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return float(text)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


class MemoryReader:
    """Reads device memory (CUDA) or process RSS (CPU) in GiB."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self._statm: Any = None
        self._page = 4096
        self.limit_gib: float | None = None
        if self.cuda:
            self.limit_gib = torch.cuda.get_device_properties(device).total_memory / GIB
        else:
            limit = _cpu_limit_bytes()
            self.limit_gib = limit / GIB if limit else None
            if sys.platform.startswith("linux"):
                try:
                    self._statm = open("/proc/self/statm", "rb")
                    self._page = os.sysconf("SC_PAGE_SIZE")
                except OSError:
                    self._statm = None

    def read(self) -> dict[str, float]:
        if self.cuda:
            return {
                "memory_allocated_gib": torch.cuda.memory_allocated(self.device) / GIB,
                "memory_reserved_gib": torch.cuda.memory_reserved(self.device) / GIB,
                "memory_peak_gib": torch.cuda.max_memory_reserved(self.device) / GIB,
                "memory_limit_gib": self.limit_gib or 0.0,
            }
        out: dict[str, float] = {}
        rss = self._rss_bytes()
        if rss is not None:
            out["rss_gib"] = rss / GIB
        if self.limit_gib:
            out["memory_limit_gib"] = self.limit_gib
        return out

    def _rss_bytes(self) -> float | None:
        if self._statm is not None:
            try:
                self._statm.seek(0)
                return float(int(self._statm.read().split()[1]) * self._page)
            except (OSError, ValueError, IndexError):
                return None
        try:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return float(peak if sys.platform == "darwin" else peak * 1024)
        except (ImportError, OSError):
            return None

    def close(self) -> None:
        if self._statm is not None:
            self._statm.close()
            self._statm = None


def flops_per_token(model: nn.Module, seq_len: int | None) -> float | None:
    """Training FLOPs per token: 6·N for the weights plus 12·L·h·s for attention (the
    PaLM/nanoGPT estimate); needs an HF-style config for the attention term."""
    n = sum(p.numel() for p in model.parameters())
    if n == 0:
        return None
    cfg = getattr(model, "config", None)
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None)
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    attention = 12.0 * layers * hidden * seq_len if layers and hidden and seq_len else 0.0
    return 6.0 * n + attention


def _norm(text: str) -> str:
    return "".join(ch for ch in text.upper() if ch.isalnum())


def match_gpu(device_name: str) -> GpuSpec | None:
    """The table entry for a driver's device name ("NVIDIA H100 80GB HBM3"): the longest
    table name or alias the name starts with, once vendor words are dropped."""
    key = _norm(device_name)
    for vendor in ("NVIDIA", "GEFORCE", "AMDINSTINCT", "AMD", "TESLA"):
        key = key.removeprefix(vendor)
    best: tuple[int, GpuSpec] | None = None
    for gpu in GPUS:
        for alias in (gpu.name, *gpu.aliases):
            a = _norm(alias)
            if key.startswith(a) and (best is None or len(a) > best[0]):
                best = (len(a), gpu)
    return best[1] if best else None


def peak_flops(device: torch.device, dtype: str, gpu_name: str | None = None) -> float | None:
    """Peak dense FLOP/s of the device from sapper's GPU table, if it is known there."""
    spec = find_gpu(gpu_name) if gpu_name else None
    if spec is None and device.type == "cuda" and torch.cuda.is_available():
        spec = match_gpu(torch.cuda.get_device_name(device))
    if spec is None:
        return None
    tflops = spec.peak_tflops(dtype)
    return tflops * 1e12 if tflops else None
