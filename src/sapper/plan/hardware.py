"""Built-in table of accelerators: memory, dtype support, peak throughput and links.

Peak TFLOP/s are dense (no sparsity) vendor figures for the SXM/OAM part unless the name
says otherwise. ``nvlink_gbps`` is the per-GPU unidirectional intra-node bandwidth in GB/s
(PCIe for cards without NVLink); ``internode_gbps`` is a typical per-GPU network share
(one 200/400 Gb/s NIC per GPU) and can be overridden in the plan.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GPUS", "GpuSpec", "find_gpu"]


class GpuSpec(BaseModel):
    """One accelerator model."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Canonical name, e.g. 'A100-80GB'.")
    memory_gib: float = Field(description="Device memory in GiB.")
    bf16: bool = Field(description="Native bf16 tensor-core support.")
    fp8: bool = Field(description="Native fp8 tensor-core support.")
    tflops_fp32: float = Field(description="Peak dense fp32 TFLOP/s (non-tensor-core).")
    tflops_tf32: float = Field(description="Peak dense tf32 TFLOP/s.")
    tflops_fp16: float = Field(description="Peak dense fp16 tensor TFLOP/s.")
    tflops_bf16: float = Field(description="Peak dense bf16 tensor TFLOP/s (0 if none).")
    tflops_fp8: float = Field(description="Peak dense fp8 TFLOP/s (0 if none).")
    nvlink_gbps: float = Field(description="Intra-node GPU-to-GPU bandwidth, GB/s per direction.")
    internode_gbps: float = Field(description="Inter-node bandwidth per GPU, GB/s per direction.")
    hbm_gbps: float = Field(description="Memory bandwidth, GB/s.")
    aliases: tuple[str, ...] = ()

    def peak_tflops(self, dtype: str) -> float:
        return {
            "fp32": self.tflops_fp32,
            "tf32": self.tflops_tf32,
            "fp16": self.tflops_fp16,
            "bf16": self.tflops_bf16,
            "fp8": self.tflops_fp8 or self.tflops_bf16,
        }[dtype]


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="V100-16GB",
        memory_gib=16,
        bf16=False,
        fp8=False,
        tflops_fp32=15.7,
        tflops_tf32=15.7,
        tflops_fp16=125,
        tflops_bf16=0,
        tflops_fp8=0,
        nvlink_gbps=150,
        internode_gbps=12.5,
        hbm_gbps=900,
        aliases=("V100-SXM2-16GB",),
    ),
    GpuSpec(
        name="V100-32GB",
        memory_gib=32,
        bf16=False,
        fp8=False,
        tflops_fp32=15.7,
        tflops_tf32=15.7,
        tflops_fp16=125,
        tflops_bf16=0,
        tflops_fp8=0,
        nvlink_gbps=150,
        internode_gbps=12.5,
        hbm_gbps=900,
        aliases=("V100", "V100-SXM2-32GB"),
    ),
    GpuSpec(
        name="A100-40GB",
        memory_gib=40,
        bf16=True,
        fp8=False,
        tflops_fp32=19.5,
        tflops_tf32=156,
        tflops_fp16=312,
        tflops_bf16=312,
        tflops_fp8=0,
        nvlink_gbps=300,
        internode_gbps=25,
        hbm_gbps=1555,
        aliases=("A100-SXM4-40GB",),
    ),
    GpuSpec(
        name="A100-80GB",
        memory_gib=80,
        bf16=True,
        fp8=False,
        tflops_fp32=19.5,
        tflops_tf32=156,
        tflops_fp16=312,
        tflops_bf16=312,
        tflops_fp8=0,
        nvlink_gbps=300,
        internode_gbps=25,
        hbm_gbps=2039,
        aliases=("A100", "A100-SXM4-80GB"),
    ),
    GpuSpec(
        name="H100",
        memory_gib=80,
        bf16=True,
        fp8=True,
        tflops_fp32=67,
        tflops_tf32=494,
        tflops_fp16=989,
        tflops_bf16=989,
        tflops_fp8=1979,
        nvlink_gbps=450,
        internode_gbps=50,
        hbm_gbps=3350,
        aliases=("H100-80GB", "H100-SXM", "H100-SXM5-80GB"),
    ),
    GpuSpec(
        name="H200",
        memory_gib=141,
        bf16=True,
        fp8=True,
        tflops_fp32=67,
        tflops_tf32=494,
        tflops_fp16=989,
        tflops_bf16=989,
        tflops_fp8=1979,
        nvlink_gbps=450,
        internode_gbps=50,
        hbm_gbps=4800,
        aliases=("H200-141GB", "H200-SXM"),
    ),
    GpuSpec(
        name="L40S",
        memory_gib=48,
        bf16=True,
        fp8=True,
        tflops_fp32=91.6,
        tflops_tf32=183,
        tflops_fp16=362,
        tflops_bf16=362,
        tflops_fp8=733,
        nvlink_gbps=32,
        internode_gbps=25,
        hbm_gbps=864,
        aliases=("L40S-48GB",),
    ),
    GpuSpec(
        name="RTX4090",
        memory_gib=24,
        bf16=True,
        fp8=True,
        tflops_fp32=82.6,
        tflops_tf32=82.6,
        tflops_fp16=165,
        tflops_bf16=165,
        tflops_fp8=330,
        nvlink_gbps=32,
        internode_gbps=12.5,
        hbm_gbps=1008,
        aliases=("RTX-4090", "4090"),
    ),
    GpuSpec(
        name="MI300X",
        memory_gib=192,
        bf16=True,
        fp8=True,
        tflops_fp32=163.4,
        tflops_tf32=653.7,
        tflops_fp16=1307,
        tflops_bf16=1307,
        tflops_fp8=2615,
        nvlink_gbps=448,
        internode_gbps=50,
        hbm_gbps=5300,
        aliases=("MI300",),
    ),
)


def _norm(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def find_gpu(name: str) -> GpuSpec | None:
    """Look a GPU up by name or alias, ignoring case, spaces, dashes and underscores."""
    key = _norm(name)
    for gpu in GPUS:
        if key in {_norm(gpu.name), *(_norm(a) for a in gpu.aliases)}:
            return gpu
    return None
