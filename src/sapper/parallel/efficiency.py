"""The few global constants of the step cost model, each with the reason for its value.

The cost model is physics (FLOPs over a throughput, bytes over a bandwidth); these
constants say how much of a datasheet figure real kernels sustain. They are global: one
value per constant (one per GPU model for the GEMM fraction), never tuned per run. The
calibration benchmark (``benchmarks/parallel_calibration.py``) checks them against
published runs; changing one moves every prediction.
"""

from __future__ import annotations

from sapper.plan.hardware import GpuSpec

__all__ = [
    "COLLECTIVE_LATENCY_S",
    "DEFAULT_GEMM_FRACTION",
    "GEMM_FRACTION",
    "HBM_FRACTION",
    "LINK_FRACTION",
    "OPTIMIZER_BYTES_PER_PARAM",
    "PCIE_GBPS",
    "gemm_fraction",
]

#: Fraction of the datasheet dense tensor-core peak that the large matrix multiplies of a
#: transformer layer sustain during training, per GPU model. A100's 312 TFLOP/s is quoted
#: at its 1410 MHz boost clock, which it holds under load at 400 W, and cuBLAS reaches
#: ~85-90 % of it on large GEMMs; the training kernels (TP-split shapes, fused epilogues,
#: the attention kernels) land near 80 %. H100 SXM's 989 TFLOP/s is quoted at 1830 MHz, a
#: clock it does not hold at its 700 W limit under dense GEMMs (~1.5-1.6 GHz sustained), so
#: large bf16 GEMMs reach ~70 % of the datasheet figure and training kernels ~65 %; H200
#: shares the die and power limit. V100, L40S, RTX 4090 and MI300X use the same reasoning
#: (clock held or not under load, and how mature the GEMM libraries are).
GEMM_FRACTION: dict[str, float] = {
    "V100-16GB": 0.75,
    "V100-32GB": 0.75,
    "A100-40GB": 0.80,
    "A100-80GB": 0.80,
    "H100": 0.65,
    "H200": 0.65,
    "L40S": 0.60,
    "RTX4090": 0.60,
    "MI300X": 0.50,
}

#: For a GPU missing from the table: a conservative middle value.
DEFAULT_GEMM_FRACTION = 0.65

#: Fraction of peak HBM bandwidth that streaming (element-wise, normalization, softmax,
#: optimizer) kernels sustain: a STREAM-style copy reaches ~85-90 % of the datasheet figure,
#: real fused kernels with reductions somewhat less.
HBM_FRACTION = 0.80

#: Bus bandwidth that NCCL collectives sustain as a fraction of the link rate, in the
#: nccl-tests convention (bus bandwidth = algorithm bandwidth x 2(n-1)/n for all-reduce,
#: x (n-1)/n for all-gather / reduce-scatter). DGX A100 all-reduce reaches ~230-240 GB/s of
#: 300 GB/s NVLink per direction; InfiniBand/RoCE rings reach ~80-90 % of the NIC rate.
LINK_FRACTION = 0.80

#: Fixed cost of one collective or point-to-point call (kernel launch, protocol
#: handshake, one network round trip), added per call on top of bytes / bandwidth.
COLLECTIVE_LATENCY_S = 20e-6

#: Host-device bandwidth for offloaded optimizer states (PCIe Gen4 x16 sustained, GB/s).
PCIE_GBPS = 25.0

#: HBM traffic of one optimizer update per parameter (bytes): Adam-family reads and
#: writes the fp32 master weight, both moments (3 x 4 B x 2), reads the gradient (4 B)
#: and writes the low-precision weight copy (2 B); momentum-free optimizers about half.
OPTIMIZER_BYTES_PER_PARAM = {"adam": 30.0, "other": 16.0}


def gemm_fraction(gpu: GpuSpec) -> float:
    """Sustained GEMM fraction of the datasheet peak for this GPU."""
    return GEMM_FRACTION.get(gpu.name, DEFAULT_GEMM_FRACTION)
