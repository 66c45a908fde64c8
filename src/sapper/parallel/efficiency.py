"""How fast real kernels run on a GPU: the few global constants of the step cost model.

The cost model is physics (FLOPs over a throughput, bytes over a bandwidth); this module
says how much of a datasheet figure real kernels sustain, and how that depends on the
shape of the work. Everything here is global: one formula for every GEMM, one value per
constant (one per GPU model where the GPUs differ), never tuned per run. The calibration
benchmark (``benchmarks/parallel_calibration.py``) checks the result against published
runs; changing a constant moves every prediction.

**GEMMs.** A GEMM of ``M x N x K`` (``M`` tokens, ``N`` output features, ``K`` the
reduction) costs (:func:`gemm_time`)::

    t = max(2·M'·N'·K / (peak · E · fill),  (M·K + K·N) · b_in / HBM)
        + M·N · b_out / HBM  +  t0

* ``E`` is the fraction of the datasheet peak the GPU's best large GEMMs sustain: the
  *maximum achievable matmul FLOP/s* (MAMF) that a shape search measures (Bekman, "Machine
  Learning Engineering", MAMF table; a datasheet peak assumes a boost clock that
  power-limited parts do not hold under dense GEMMs). It is the asymptote: no shape runs
  faster than the fastest one measured (:data:`MAMF`).
* ``M'``, ``N'`` round ``M`` and ``N`` up to the 128 x 256 output tile of the large-GEMM
  kernels (*tile quantization*), and ``fill = min(1, tiles / SMs)``: a GEMM with fewer
  tiles than SMs leaves the rest idle (*wave quantization*; beyond one wave cuBLAS's
  split-K and stream-K kernels balance the tail). NVIDIA's "Matrix Multiplication
  Background" guide documents both.
* The first ``max`` is the roofline: operands streamed from HBM (few tokens per GPU make
  weight-streaming GEMMs memory-bound).
* The output write (epilogue) is not hidden behind the K loop: every output tile is
  written once its K loop ends, at the HBM rate. Per FLOP that is
  ``peak·E / (K · HBM)``: the GPU's ridge point (its FLOP:byte ratio) over ``K``, so a
  GEMM with a short reduction (``K`` = a TP-split width, a head dimension) runs well below
  the MAMF, one with a long one close to it. This is why small models, and large TP
  splits of mid-size models, reach lower MFU than large models (Megatron-LM's weak
  scaling on H100: 41% MFU at 1.7B, 47-49% from 7B up).
* ``t0`` (:data:`KERNEL_OVERHEAD_S`): launch, pipeline fill and the last wave's tail of
  any kernel, a few microseconds; it matters for the many small kernels of small models.

**Attention.** Flash-style kernels (FlashAttention, cuDNN fused attention, PyTorch SDPA on
GPU) are limited by the softmax's exponentials and their own pipeline, not by the GEMM
roofline: they sustain :data:`ATTENTION_FRACTION` of the peak on long sequences, less on
short ones (``s / (s + ATTENTION_HALF_SEQ)``), counted over the FLOPs they execute: the
causal half of the square, and a backward that recomputes the scores (2.5 forwards'
matmuls, FlashAttention's own count). Eager attention is two batched GEMMs per pass
(``K`` = head dimension for Q·Kᵀ: far below the ridge point) through the GEMM formula.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sapper.plan.hardware import GpuSpec, find_gpu

__all__ = [
    "ATTENTION_FRACTION",
    "ATTENTION_HALF_SEQ",
    "BEST_PUBLISHED_MFU",
    "COLLECTIVE_LATENCY_S",
    "COMM_SMS",
    "DEFAULT_ATTENTION_FRACTION",
    "DEFAULT_GEMM_FRACTION",
    "FLASH_BACKWARD_FACTOR",
    "GEMM_FRACTION",
    "GEMM_TILE",
    "GEMM_TILE_K",
    "HBM_FRACTION",
    "KERNEL_OVERHEAD_S",
    "LINK_FRACTION",
    "MAMF",
    "NETWORK_FRACTION",
    "PCIE_GBPS",
    "attention_fraction",
    "best_published_mfu",
    "gemm_fraction",
    "gemm_time",
]

#: Output tile (rows x columns) of the large-GEMM kernels cuBLAS picks for training shapes
#: on Ampere and Hopper (CUTLASS's 128x256 tensor-core tiles; 256x128 is the same area).
GEMM_TILE = (128, 256)
#: Depth of one K stage of those kernels (CUTLASS's 128x256x64 tiles).
GEMM_TILE_K = 64

#: Fixed cost of one kernel beyond its FLOPs and bytes: launch (~2-4 µs on the GPU side
#: between dependent kernels), pipeline fill and the last wave's tail.
KERNEL_OVERHEAD_S = 4e-6

#: Measured maximum achievable matmul TFLOP/s (bf16, no sparsity) and the M x N x K shape
#: it was measured at, from the MAMF table of Bekman's "Machine Learning Engineering" open
#: book (compute/accelerator, 2025; torch 2.5-2.7). :data:`GEMM_FRACTION` is MAMF / peak.
MAMF: dict[str, tuple[float, tuple[int, int, int]]] = {
    "A100-40GB": (271.2, (1024, 10240, 5120)),  # A100 SXM row
    "A100-80GB": (271.2, (1024, 10240, 5120)),
    "H100": (794.5, (2048, 2048, 13312)),
    "H200": (794.5, (2048, 2048, 13312)),  # "H200 is the same" (same die, same 700 W)
    "GH200-96GB": (828.6, (1024, 15360, 4096)),  # the 900 W module holds higher clocks
    "GH200-144GB": (828.6, (1024, 15360, 4096)),
    "B200": (1745.0, (1792, 16128, 3072)),
    "MI300X": (668.4, (10240, 15360, 8192)),  # hipBLASLt with PyTorch TunableOp
}

#: The sustained large-GEMM fraction of the datasheet peak for GPUs without a MAMF
#: measurement, with the reason for each value:
#:
#: * V100 (300 W): holds its 1530 MHz boost under GEMMs; cuBLAS reached ~105-110 of 125
#:   TFLOP/s in fp16 -> 0.85.
#: * A10G, L4, L40, L40S, RTX 4090 (Ampere/Ada boards): the datasheet peak assumes the
#:   boost clock; these boards are power-limited far below it under dense GEMMs, worst for
#:   the 72 W L4 (0.60) and the 150/300/350 W data-centre cards (0.70), least for the 450 W
#:   RTX 4090 with fp32 accumulation (0.80).
#: * H100 PCIe (350 W) and H100 NVL (400 W): the SXM die at half the power, so further
#:   below its boost clock than the SXM part (0.80): the A100 PCIe loses 6% to the A100
#:   SXM in the same table -> 0.74 and 0.76.
#: * H20: compute cut to 148 TFLOP/s on a 400 W board, so the clock is never power-limited
#:   -> 0.88, as the A100 (the ridge point is so low that few GEMMs reach it anyway).
#: * MI250X (per GCD): rocBLAS/hipBLASLt on CDNA2 sustain ~0.55 of the matrix peak, below
#:   the MI300X's 0.51 of a much higher peak only in absolute terms -> 0.55.
GEMM_FRACTION_ASSUMED: dict[str, float] = {
    "V100-16GB": 0.85,
    "V100-32GB": 0.85,
    "A10G": 0.70,
    "L4": 0.60,
    "L40": 0.70,
    "L40S": 0.70,
    "RTX4090": 0.80,
    "H100-PCIe": 0.74,
    "H100-NVL": 0.76,
    "H20": 0.88,
    "MI250X": 0.55,
}

#: For a GPU missing from both tables: a conservative middle value.
DEFAULT_GEMM_FRACTION = 0.65

#: Fraction of the datasheet peak that flash-attention kernels sustain on long sequences,
#: forward and backward together, over the FLOPs they execute (see the module doc). The
#: backward runs at ~0.85 of the forward's rate (FlashAttention-2 on A100: up to 73% of
#: peak forward, 63% backward; Dao 2023), so fwd+bwd = 3.5 / (1/f + 2.5/(0.85 f)):
#:
#: * A100: FlashAttention-2 forward ~0.70 of 312 TFLOP/s at long causal sequences, head
#:   dim 128 (Dao 2023, Fig. 4-6) -> 0.63.
#: * H100/H200/GH200: the kernels of 2024 training stacks (FlashAttention-2; cuDNN's and
#:   FlashAttention-3's use of wgmma/TMA came later) run the causal forward at ~335
#:   TFLOP/s at 16K, head dim 128 (Shah et al. 2024, FlashAttention-3, Fig. 5) -> 0.31.
#:   FlashAttention-3 itself reaches ~0.55.
#: * Others: :data:`DEFAULT_ATTENTION_FRACTION` of their GEMM fraction, the ratio
#:   FlashAttention-2 keeps on Ampere and Ada.
ATTENTION_FRACTION: dict[str, float] = {
    "A100-40GB": 0.63,
    "A100-80GB": 0.63,
    "H100": 0.31,
    "H100-PCIe": 0.29,
    "H100-NVL": 0.30,
    "H200": 0.31,
    "GH200-96GB": 0.32,
    "GH200-144GB": 0.32,
    "H20": 0.55,
    "B200": 0.35,
    "MI300X": 0.25,
}
#: For GPUs missing above: this share of their GEMM fraction.
DEFAULT_ATTENTION_FRACTION = 0.6

#: Sequence length (tokens per attention call) at which a flash kernel runs at half its
#: long-sequence rate: FlashAttention-2's causal forward on H100 runs at 57%, 78%, 89%,
#: 95% and 99% of its 16K rate at 512, 1K, 2K, 4K and 8K tokens (Shah et al. 2024,
#: Fig. 5), close to s / (s + 256).
ATTENTION_HALF_SEQ = 256.0

#: Executed matmul work of a flash kernel's backward, in forwards: it recomputes Q·Kᵀ and
#: the softmax, then computes dV, dP, dQ and dK (5 matmuls against the forward's 2).
FLASH_BACKWARD_FACTOR = 2.5

#: Fraction of peak HBM bandwidth that streaming (element-wise, normalization, softmax,
#: optimizer) kernels sustain: a STREAM-style copy reaches ~85-90 % of the datasheet figure,
#: real fused kernels with reductions somewhat less.
HBM_FRACTION = 0.80

#: Bus bandwidth that NCCL collectives sustain over NVLink (or another scale-up fabric) as
#: a fraction of the link rate, in the nccl-tests convention (bus bandwidth = algorithm
#: bandwidth x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather / reduce-scatter): DGX
#: A100 all-reduce reaches ~230-240 of 300 GB/s, DGX H100 ~360-380 of 450.
LINK_FRACTION = 0.80

#: The same over the network (InfiniBand, RoCE): rings over one NIC per GPU reach ~90% of
#: the NIC rate for large messages (nccl-tests on 400 Gb/s NDR: ~45-47 of 50 GB/s).
NETWORK_FRACTION = 0.90

#: Fixed cost of one collective or point-to-point call (kernel launch, protocol
#: handshake, one network round trip), added per call on top of bytes / bandwidth.
COLLECTIVE_LATENCY_S = 20e-6

#: SMs an overlapped collective occupies while it runs (NCCL's channels, one SM each;
#: Transformer Engine's userbuffers reductions): the compute it hides behind loses this
#: share of the GPU for the collective's duration.
COMM_SMS = 16

#: Host-device bandwidth for offloaded optimizer states (PCIe Gen4 x16 sustained, GB/s).
PCIE_GBPS = 25.0

#: The highest model-FLOP utilization a published large-scale training run reached on a
#: GPU (model FLOPs / datasheet peak), and where: a prediction above it is a claim no
#: run has shown, so reports say so.
BEST_PUBLISHED_MFU: dict[str, tuple[float, str]] = {
    "A100-80GB": (
        0.642,
        "MosaicML llm-foundry benchmarks (2023): MPT-7B on 8 A100-80GB, sequence 2048, "
        "FSDP, no recomputation",
    ),
    "H100": (0.49, "Megatron-LM README (2024): GPT 16B on 192 H100s, weak-scaling table"),
}


def _spec(gpu: GpuSpec | str) -> GpuSpec | None:
    return find_gpu(gpu) if isinstance(gpu, str) else gpu


def _derived_fractions() -> dict[str, float]:
    """MAMF / datasheet peak where measured (the asymptote: no shape of the formula runs
    faster than the fastest measured one), the assumed fractions elsewhere."""
    out = dict(GEMM_FRACTION_ASSUMED)
    for name, (tflops, _shape) in MAMF.items():
        spec = find_gpu(name)
        if spec is not None and spec.tflops_bf16:
            out[name] = round(tflops / spec.tflops_bf16, 4)
    return out


def gemm_time(
    gpu: GpuSpec,
    peak_flops: float,
    m: Any,
    n: Any,
    k: Any,
    *,
    batch: Any = 1,
    in_bytes: float = 2.0,
    out_bytes: Any = 2.0,
    fraction: float | None = None,
) -> Any:
    """Seconds for ``batch`` GEMMs of ``m x n x k`` (arrays broadcast) at ``peak_flops``
    (the datasheet figure for the dtype), by the formula of the module doc. ``out_bytes``
    per output element (4 + 4 when an fp32 gradient buffer is read and written)."""
    e = gemm_fraction(gpu) if fraction is None else fraction
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    batch = np.asarray(batch, dtype=float)
    tm, tn = GEMM_TILE
    # the tile's orientation that pads least (cuBLAS ships both)
    tiles = np.minimum(np.ceil(m / tm) * np.ceil(n / tn), np.ceil(m / tn) * np.ceil(n / tm))
    tiles = tiles * batch
    fill = np.minimum(1.0, tiles / gpu.sms)
    flops = 2.0 * tiles * tm * tn * k
    hbm = gpu.hbm_gbps * 1e9
    math_s = flops / (peak_flops * e * np.maximum(fill, 1e-9))
    stream_s = (m * k + k * n) * batch * in_bytes / hbm
    # per output tile, not hidden behind its K loop: the first K-stage's operand load
    # (prologue) and the output write (epilogue)
    prologue_s = tiles * (tm + tn) * GEMM_TILE_K * in_bytes / hbm
    write_s = m * n * batch * np.asarray(out_bytes, dtype=float) / hbm
    return np.maximum(math_s, stream_s) + prologue_s + write_s + KERNEL_OVERHEAD_S


#: The asymptotic GEMM fraction per GPU: derived from :data:`MAMF` where measured, else
#: :data:`GEMM_FRACTION_ASSUMED`.
GEMM_FRACTION: dict[str, float] = _derived_fractions()


def gemm_fraction(gpu: GpuSpec | str) -> float:
    """Asymptotic GEMM fraction of the datasheet peak for this GPU."""
    spec = _spec(gpu)
    name = spec.name if spec is not None else str(gpu)
    return GEMM_FRACTION.get(name, DEFAULT_GEMM_FRACTION)


def attention_fraction(gpu: GpuSpec | str, seq: Any) -> Any:
    """Sustained fraction of the peak for flash attention over ``seq`` tokens per call."""
    spec = _spec(gpu)
    name = spec.name if spec is not None else str(gpu)
    base = ATTENTION_FRACTION.get(name, DEFAULT_ATTENTION_FRACTION * gemm_fraction(name))
    s = np.asarray(seq, dtype=float)
    return base * s / (s + ATTENTION_HALF_SEQ)


def best_published_mfu(gpu: GpuSpec | str) -> tuple[float, str] | None:
    """The best published MFU on this GPU and its source; for a GPU without one, the best
    on any GPU (no run has shown more anywhere), marked as such."""
    spec = _spec(gpu)
    name = spec.name if spec is not None else str(gpu)
    if name in BEST_PUBLISHED_MFU:
        return BEST_PUBLISHED_MFU[name]
    if name == "A100-40GB":
        return BEST_PUBLISHED_MFU["A100-80GB"]
    best = max(BEST_PUBLISHED_MFU.values(), key=lambda x: x[0])
    return best[0], f"no published run on this GPU; the best on any GPU: {best[1]}"


def _check() -> None:  # pragma: no cover - import-time sanity
    for name, frac in GEMM_FRACTION.items():
        assert 0 < frac <= 1 and math.isfinite(frac), name


_check()
