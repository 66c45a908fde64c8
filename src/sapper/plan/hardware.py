"""Built-in table of accelerators: memory, dtype support, peak throughput and links.

Peak TFLOP/s are dense (no sparsity) vendor figures for the SXM/OAM part unless the name
says otherwise; each entry names its datasheet. ``nvlink_gbps`` is the per-GPU
unidirectional bandwidth inside the NVLink (or Infinity Fabric) domain in GB/s, the PCIe
rate for cards without one; ``nvlink_domain`` is how many GPUs that domain joins;
``internode_gbps`` is a typical per-GPU network share (one 200/400 Gb/s NIC per GPU) and
can be overridden in the plan.

A name that fits more than one entry (``A100``: 40 or 80 GB) is refused with the
candidates listed, never resolved to a default: the memory and bandwidth of the two
differ by 2x, and so would every verdict.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sapper.errors import InputError

__all__ = ["AMBIGUOUS", "GPUS", "GpuSpec", "ambiguous_gpu", "find_gpu", "resolve_gpu"]


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
    nvlink_domain: int = Field(
        default=8,
        description="GPUs one NVLink/Infinity Fabric domain joins at nvlink_gbps (8 on HGX "
        "boards, 2 for bridged PCIe pairs, 1 for PCIe-only cards); larger groups inside a "
        "node go over PCIe.",
    )
    pcie_gbps: float = Field(
        default=32.0, description="Host link (PCIe) bandwidth, GB/s per direction."
    )
    sms: int = Field(
        default=108,
        description="Streaming multiprocessors (compute units on AMD): how many GEMM tiles "
        "run at once.",
    )
    interconnect: str = Field(default="", description="The GPU-to-GPU links, in words.")
    aliases: tuple[str, ...] = ()

    def peak_tflops(self, dtype: str) -> float:
        return {
            "fp32": self.tflops_fp32,
            "tf32": self.tflops_tf32,
            "fp16": self.tflops_fp16,
            "bf16": self.tflops_bf16,
            "fp8": self.tflops_fp8 or self.tflops_bf16,
        }[dtype]


# Sources, per entry: the vendor's datasheet or architecture whitepaper (dense figures; the
# datasheets print sparse tensor throughput as 2x these). GB/s are per direction.
GPUS: tuple[GpuSpec, ...] = (
    # NVIDIA Tesla V100 SXM2 datasheet (2020): 125 TFLOP/s fp16 tensor, 900 GB/s HBM2,
    # NVLink 2.0 300 GB/s total (150 per direction), 80 SMs; no bf16.
    GpuSpec(
        name="V100-16GB", memory_gib=16, bf16=False, fp8=False,
        tflops_fp32=15.7, tflops_tf32=15.7, tflops_fp16=125, tflops_bf16=0, tflops_fp8=0,
        nvlink_gbps=150, internode_gbps=12.5, hbm_gbps=900, sms=80, pcie_gbps=16,
        interconnect="NVLink 2.0 (hybrid cube mesh, 8 per node)",
        aliases=("V100-SXM2-16GB",),
    ),
    GpuSpec(
        name="V100-32GB", memory_gib=32, bf16=False, fp8=False,
        tflops_fp32=15.7, tflops_tf32=15.7, tflops_fp16=125, tflops_bf16=0, tflops_fp8=0,
        nvlink_gbps=150, internode_gbps=12.5, hbm_gbps=900, sms=80, pcie_gbps=16,
        interconnect="NVLink 2.0 (hybrid cube mesh, 8 per node)",
        aliases=("V100-SXM2-32GB",),
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s bf16/fp16, 1,555 GB/s
    # (40GB) / 2,039 GB/s (80GB SXM), NVLink 3.0 600 GB/s total, 108 SMs.
    GpuSpec(
        name="A100-40GB", memory_gib=40, bf16=True, fp8=False,
        tflops_fp32=19.5, tflops_tf32=156, tflops_fp16=312, tflops_bf16=312, tflops_fp8=0,
        nvlink_gbps=300, internode_gbps=25, hbm_gbps=1555, sms=108,
        interconnect="NVLink 3.0 via NVSwitch (8 per HGX board)",
        aliases=("A100-SXM4-40GB",),
    ),
    GpuSpec(
        name="A100-80GB", memory_gib=80, bf16=True, fp8=False,
        tflops_fp32=19.5, tflops_tf32=156, tflops_fp16=312, tflops_bf16=312, tflops_fp8=0,
        nvlink_gbps=300, internode_gbps=25, hbm_gbps=2039, sms=108,
        interconnect="NVLink 3.0 via NVSwitch (8 per HGX board)",
        aliases=("A100-SXM4-80GB",),
    ),
    # NVIDIA A10G (AWS EC2 G5; NVIDIA publishes no datasheet for this AWS part, AWS and
    # NVIDIA quote 24 GB GDDR6, 600 GB/s, 35 TFLOP/s fp32 and 70 TFLOP/s fp16/bf16 tensor
    # dense for it; the A10 it derives from is rated 125): PCIe Gen4, no NVLink, 80 SMs.
    GpuSpec(
        name="A10G", memory_gib=24, bf16=True, fp8=False,
        tflops_fp32=35, tflops_tf32=35, tflops_fp16=70, tflops_bf16=70, tflops_fp8=0,
        nvlink_gbps=32, internode_gbps=12.5, hbm_gbps=600, nvlink_domain=1, sms=80,
        interconnect="PCIe Gen4 x16, no NVLink",
        aliases=("A10G-24GB",),
    ),
    # NVIDIA L4 datasheet (2023): 24 GB GDDR6, 300 GB/s, 121 TFLOP/s bf16/fp16 and 242.5
    # fp8 tensor dense, 30.3 fp32, 60 tf32; PCIe Gen4 x16, no NVLink, 58 SMs.
    GpuSpec(
        name="L4", memory_gib=24, bf16=True, fp8=True,
        tflops_fp32=30.3, tflops_tf32=60, tflops_fp16=121, tflops_bf16=121, tflops_fp8=242.5,
        nvlink_gbps=32, internode_gbps=12.5, hbm_gbps=300, nvlink_domain=1, sms=58,
        interconnect="PCIe Gen4 x16, no NVLink",
        aliases=("L4-24GB",),
    ),
    # NVIDIA L40 datasheet (2022): 48 GB GDDR6, 864 GB/s, 181 TFLOP/s bf16/fp16 and 362
    # fp8 tensor dense, 90.5 fp32 and tf32; PCIe Gen4 x16, no NVLink, 142 SMs.
    GpuSpec(
        name="L40", memory_gib=48, bf16=True, fp8=True,
        tflops_fp32=90.5, tflops_tf32=90.5, tflops_fp16=181, tflops_bf16=181, tflops_fp8=362,
        nvlink_gbps=32, internode_gbps=25, hbm_gbps=864, nvlink_domain=1, sms=142,
        interconnect="PCIe Gen4 x16, no NVLink",
        aliases=("L40-48GB",),
    ),
    # NVIDIA L40S datasheet (2023): 48 GB GDDR6, 864 GB/s, 362 TFLOP/s bf16/fp16 and 733
    # fp8 tensor dense, 91.6 fp32, 183 tf32; PCIe Gen4 x16, no NVLink, 142 SMs.
    GpuSpec(
        name="L40S", memory_gib=48, bf16=True, fp8=True,
        tflops_fp32=91.6, tflops_tf32=183, tflops_fp16=362, tflops_bf16=362, tflops_fp8=733,
        nvlink_gbps=32, internode_gbps=25, hbm_gbps=864, nvlink_domain=1, sms=142,
        interconnect="PCIe Gen4 x16, no NVLink",
        aliases=("L40S-48GB",),
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5: 80 GB HBM3, 3.35 TB/s, 989
    # TFLOP/s bf16/fp16 and 1,979 fp8 dense, 67 fp32, 494 tf32; NVLink 4 900 GB/s total,
    # 132 SMs. "H100" alone names this part, as NVIDIA's own tables do.
    GpuSpec(
        name="H100", memory_gib=80, bf16=True, fp8=True,
        tflops_fp32=67, tflops_tf32=494, tflops_fp16=989, tflops_bf16=989, tflops_fp8=1979,
        nvlink_gbps=450, internode_gbps=50, hbm_gbps=3350, sms=132, pcie_gbps=64,
        interconnect="NVLink 4 via NVSwitch (8 per HGX board)",
        aliases=("H100-80GB", "H100-SXM", "H100-SXM5-80GB"),
    ),
    # Same datasheet, PCIe card: 80 GB HBM2e, 2.0 TB/s, 756 TFLOP/s bf16/fp16 and 1,513
    # fp8 dense, 51 fp32, 378 tf32; NVLink bridge 600 GB/s total between two cards, PCIe
    # Gen5 x16 otherwise, 114 SMs.
    GpuSpec(
        name="H100-PCIe", memory_gib=80, bf16=True, fp8=True,
        tflops_fp32=51, tflops_tf32=378, tflops_fp16=756, tflops_bf16=756, tflops_fp8=1513,
        nvlink_gbps=300, internode_gbps=25, hbm_gbps=2000, nvlink_domain=2, sms=114,
        pcie_gbps=64, interconnect="NVLink bridge pairs, PCIe Gen5 x16 between pairs",
        aliases=("H100-PCIE-80GB",),
    ),
    # Same datasheet, H100 NVL: 94 GB HBM3, 3.9 TB/s, 835 TFLOP/s bf16/fp16 and 1,671 fp8
    # dense, 60 fp32, 418 tf32; NVLink bridge 600 GB/s total between two cards, 132 SMs.
    GpuSpec(
        name="H100-NVL", memory_gib=94, bf16=True, fp8=True,
        tflops_fp32=60, tflops_tf32=418, tflops_fp16=835, tflops_bf16=835, tflops_fp8=1671,
        nvlink_gbps=300, internode_gbps=50, hbm_gbps=3900, nvlink_domain=2, sms=132,
        pcie_gbps=64, interconnect="NVLink bridge pairs, PCIe Gen5 x16 between pairs",
        aliases=("H100-NVL-94GB",),
    ),
    # NVIDIA H20 (export-compliant Hopper, 2024 product brief): 96 GB HBM3, 4.0 TB/s, 148
    # TFLOP/s bf16/fp16 and 296 fp8 dense, 44 fp32, 74 tf32; NVLink 900 GB/s total, 8 per
    # HGX board, 78 SMs.
    GpuSpec(
        name="H20", memory_gib=96, bf16=True, fp8=True,
        tflops_fp32=44, tflops_tf32=74, tflops_fp16=148, tflops_bf16=148, tflops_fp8=296,
        nvlink_gbps=450, internode_gbps=50, hbm_gbps=4000, sms=78, pcie_gbps=64,
        interconnect="NVLink 4 via NVSwitch (8 per HGX board)",
        aliases=("H20-96GB",),
    ),
    # NVIDIA H200 datasheet (2024), SXM: 141 GB HBM3e, 4.8 TB/s, compute as H100 SXM.
    GpuSpec(
        name="H200", memory_gib=141, bf16=True, fp8=True,
        tflops_fp32=67, tflops_tf32=494, tflops_fp16=989, tflops_bf16=989, tflops_fp8=1979,
        nvlink_gbps=450, internode_gbps=50, hbm_gbps=4800, sms=132, pcie_gbps=64,
        interconnect="NVLink 4 via NVSwitch (8 per HGX board)",
        aliases=("H200-141GB", "H200-SXM"),
    ),
    # NVIDIA GH200 Grace Hopper Superchip datasheet (2023/2024): the H100 die with 96 GB
    # HBM3 at 4 TB/s, or 144 GB HBM3e at 4.9 TB/s; 989 TFLOP/s bf16/fp16, 1,979 fp8; 18
    # NVLink 4 links (900 GB/s total) to other GH200s in an NVLink domain (NVL32 systems;
    # 4 per node is common), NVLink-C2C 900 GB/s to the Grace CPU.
    GpuSpec(
        name="GH200-96GB", memory_gib=96, bf16=True, fp8=True,
        tflops_fp32=67, tflops_tf32=494, tflops_fp16=989, tflops_bf16=989, tflops_fp8=1979,
        nvlink_gbps=450, internode_gbps=50, hbm_gbps=4000, nvlink_domain=4, sms=132,
        pcie_gbps=450, interconnect="NVLink 4 between superchips, NVLink-C2C to Grace",
        aliases=("GH200-HBM3",),
    ),
    GpuSpec(
        name="GH200-144GB", memory_gib=144, bf16=True, fp8=True,
        tflops_fp32=67, tflops_tf32=494, tflops_fp16=989, tflops_bf16=989, tflops_fp8=1979,
        nvlink_gbps=450, internode_gbps=50, hbm_gbps=4900, nvlink_domain=4, sms=132,
        pcie_gbps=450, interconnect="NVLink 4 between superchips, NVLink-C2C to Grace",
        aliases=("GH200-HBM3E", "GH200-141GB"),
    ),
    # NVIDIA DGX B200 / HGX B200 datasheets (2024): 180 GB HBM3e per GPU, 8 TB/s, 2,250
    # TFLOP/s bf16/fp16 and 4,500 fp8 dense (half the sparse figures printed), 1,100 tf32
    # dense, 75 fp32; NVLink 5 1.8 TB/s total, 8 per board; 148 SMs.
    GpuSpec(
        name="B200", memory_gib=180, bf16=True, fp8=True,
        tflops_fp32=75, tflops_tf32=1100, tflops_fp16=2250, tflops_bf16=2250, tflops_fp8=4500,
        nvlink_gbps=900, internode_gbps=50, hbm_gbps=8000, sms=148, pcie_gbps=64,
        interconnect="NVLink 5 via NVSwitch (8 per HGX board)",
        aliases=("B200-180GB", "B200-SXM"),
    ),
    # NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s,
    # 165 TFLOP/s fp16/bf16 and 330 fp8 tensor dense with fp32 accumulation (what training
    # uses; GeForce parts run it at half the fp16-accumulate rate), 82.6 fp32; PCIe Gen4.
    GpuSpec(
        name="RTX4090", memory_gib=24, bf16=True, fp8=True,
        tflops_fp32=82.6, tflops_tf32=82.6, tflops_fp16=165, tflops_bf16=165, tflops_fp8=330,
        nvlink_gbps=32, internode_gbps=12.5, hbm_gbps=1008, nvlink_domain=1, sms=128,
        interconnect="PCIe Gen4 x16, no NVLink",
        aliases=("RTX-4090", "4090"),
    ),
    # AMD Instinct MI250X datasheet (2021), per GCD: the OAM package holds two graphics
    # compute dies that software sees as two devices (count GCDs in hardware.num_gpus):
    # 64 GB HBM2e and 1.6 TB/s each, 191.5 TFLOP/s bf16/fp16 each (383 per package), 47.9
    # fp32 (matrix 95.7); Infinity Fabric between GCDs (4 links inside a package, 1-2 between
    # packages, 50 GB/s per link per direction), 8 GCDs per node as in Frontier (HPE Cray
    # EX235a, 4 x 200 Gb/s Slingshot per node: 12.5 GB/s per GCD); 110 CUs per GCD.
    GpuSpec(
        name="MI250X", memory_gib=64, bf16=True, fp8=False,
        tflops_fp32=47.9, tflops_tf32=47.9, tflops_fp16=191.5, tflops_bf16=191.5,
        tflops_fp8=0, nvlink_gbps=50, internode_gbps=12.5, hbm_gbps=1600, sms=110,
        interconnect="Infinity Fabric (xGMI) between GCDs, 8 GCDs per node",
        aliases=("MI250X-GCD",),
    ),
    # AMD Instinct MI300X datasheet (2023): 192 GB HBM3, 5.3 TB/s, 1,307 TFLOP/s bf16/fp16
    # and 2,615 fp8 dense, 163.4 fp32, 653.7 tf32; Infinity Fabric 128 GB/s per link, 7
    # links to the other 7 GPUs of an 8-GPU board (448 GB/s per direction in all); 304 CUs.
    GpuSpec(
        name="MI300X", memory_gib=192, bf16=True, fp8=True,
        tflops_fp32=163.4, tflops_tf32=653.7, tflops_fp16=1307, tflops_bf16=1307,
        tflops_fp8=2615, nvlink_gbps=448, internode_gbps=50, hbm_gbps=5300, sms=304,
        pcie_gbps=64, interconnect="Infinity Fabric mesh (8 per board)",
        aliases=("MI300X-192GB",),
    ),
)

#: Names that fit several entries: refused with the candidates, never guessed.
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "A100": ("A100-40GB", "A100-80GB"),
    "V100": ("V100-16GB", "V100-32GB"),
    "GH200": ("GH200-96GB", "GH200-144GB"),
    "MI300": ("MI300X",),
}


def _norm(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def find_gpu(name: str) -> GpuSpec | None:
    """Look a GPU up by name or alias, ignoring case, spaces, dashes and underscores; None
    for an unknown or ambiguous name (:func:`resolve_gpu` says which)."""
    key = _norm(name)
    for gpu in GPUS:
        if key in {_norm(gpu.name), *(_norm(a) for a in gpu.aliases)}:
            return gpu
    return None


def ambiguous_gpu(name: str) -> tuple[str, ...] | None:
    """The table entries an ambiguous name could mean (``A100``: 40 or 80 GB), or None."""
    key = _norm(name)
    for short, names in AMBIGUOUS.items():
        if key == _norm(short):
            return names
    return None


def resolve_gpu(name: str, field: str = "hardware.gpu") -> GpuSpec:
    """The table entry ``name`` means; :class:`~sapper.errors.InputError` (exit 2) for an
    ambiguous name, listing the candidates, or an unknown one, listing the table."""
    gpu = find_gpu(name)
    if gpu is not None:
        return gpu
    raise InputError(unknown_gpu_message(name), field=field, value=name,
                     expected=expected_gpu(name))


def unknown_gpu_message(name: str) -> str:
    """Why ``name`` does not resolve: ambiguous, or not in the table."""
    return "ambiguous GPU name" if ambiguous_gpu(name) is not None else "unknown GPU"


def expected_gpu(name: str) -> str:
    """What to write instead: the candidates of an ambiguous name, else the whole table."""
    names = ambiguous_gpu(name)
    if names is not None:
        return (
            f"{' or '.join(names)}: '{name}' is ambiguous (their memory and bandwidth "
            "differ, and so would every verdict)"
        )
    return "a GPU from the built-in table: " + ", ".join(g.name for g in GPUS)
