"""``estimate(plan)``: the analytic per-GPU memory of a training step, in microseconds.

The public result, :class:`MemoryEstimate`, gives the peak over pipeline stages and
phases, each stage's breakdown by category, whether it fits the plan's GPU and by how
much. Tensor bytes (what ``torch.cuda.max_memory_allocated`` measures) are kept apart
from the overheads the allocator and the CUDA runtime add on top (context, NCCL buffers,
fragmentation), which are stated and configurable (:class:`MemoryOptions`).

No torch import on this path: the planner calls it for thousands of layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from sapper.memory.inputs import Shape, shape_from_plan
from sapper.memory.phases import CATEGORIES, StagePeak, stage_peaks
from sapper.memory.pipeline import peak_candidates
from sapper.memory.units import GIB
from sapper.model import total_params
from sapper.plan.hardware import find_gpu
from sapper.plan.schema import Plan

__all__ = ["MemoryEstimate", "MemoryOptions", "StageMemory", "estimate", "estimate_shape"]


@dataclass(frozen=True)
class MemoryOptions:
    """Overheads beyond tensor bytes, and which kernels run.

    ``context_bytes``: CUDA context, cuBLAS/cuDNN workspaces (0.75 GiB is typical for
    PyTorch on an A100/H100). ``nccl_bytes``: communicator buffers when the job spans
    several GPUs. ``fragmentation``: the caching allocator's reserved-but-free share on
    top of the live tensors (5%). ``device``: ``cuda`` (bool dropout masks, GPU
    attention kernels) or ``cpu`` (the CPU kernels, for comparing with a CPU run).
    ``worst_only``: evaluate only the pipeline stages that can hold the peak (the first,
    the last, and any stage with more layers than every stage before it: see
    :func:`~sapper.memory.pipeline.peak_candidates`). The peak, its stage and breakdown,
    the fit and the offload needs are the same as with every stage; ``stages`` then lists
    only those evaluated. A layout search uses it: the cost no longer grows with the
    pipeline depth.
    """

    context_bytes: int = int(0.75 * GIB)
    nccl_bytes: int = int(0.25 * GIB)
    fragmentation: float = 0.05
    device: str = "cuda"
    worst_only: bool = False


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage on one GPU."""

    stage: int
    layers: int
    in_flight: float  # micro-batches whose activations it holds at once
    params: int  # parameter count on this GPU (elements)
    peak_phase: str
    tensor_peak_bytes: int
    peak_bytes: int  # with overheads
    breakdown: dict[str, int]  # category -> bytes at the peak (overheads included)
    phases: dict[str, dict[str, int]]  # phase -> category -> bytes
    host_bytes: int
    nvme_bytes: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory of a planned job (the worst pipeline stage decides)."""

    peak_bytes: int  # per GPU, overheads included: compare with the GPU's memory
    tensor_peak_bytes: int  # live tensor bytes only (torch.cuda.max_memory_allocated)
    #: what the caching allocator holds at the peak (torch.cuda.max_memory_reserved): the
    #: tensor peak plus its fragmentation share (CPU: the tensor peak)
    reserved_bytes: int
    stages: list[StageMemory]  # every stage (only the candidates with ``worst_only``)
    breakdown: dict[str, int]  # categories of the worst stage at its peak
    peak_stage: int
    peak_phase: str
    gpu_bytes: int | None  # the plan's GPU memory, if a GPU is named
    fits: bool | None  # None when the plan names no GPU
    headroom_bytes: int | None  # gpu_bytes - peak_bytes (negative: short by that much)
    host_bytes_per_node: int  # CPU memory needed by offload on one node
    nvme_bytes_per_node: int
    num_params: int  # whole model
    notes: list[str] = field(default_factory=list)

    @property
    def dominant(self) -> str:
        """The largest category at the peak (seed §3.1: find it before fixing OOM)."""
        cats = {k: v for k, v in self.breakdown.items() if k in CATEGORIES}
        return max(cats, key=lambda k: cats[k])

    def to_json(self) -> dict[str, object]:
        return {
            "peak_bytes": self.peak_bytes,
            "tensor_peak_bytes": self.tensor_peak_bytes,
            "reserved_bytes": self.reserved_bytes,
            "peak_gib": round(self.peak_bytes / GIB, 3),
            "gpu_bytes": self.gpu_bytes,
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "peak_stage": self.peak_stage,
            "peak_phase": self.peak_phase,
            "dominant": self.dominant,
            "breakdown": self.breakdown,
            "host_bytes_per_node": self.host_bytes_per_node,
            "nvme_bytes_per_node": self.nvme_bytes_per_node,
            "num_params": self.num_params,
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "in_flight": s.in_flight,
                    "params": s.params,
                    "peak_phase": s.peak_phase,
                    "tensor_peak_bytes": s.tensor_peak_bytes,
                    "peak_bytes": s.peak_bytes,
                    "breakdown": s.breakdown,
                    "phases": s.phases,
                    "host_bytes": s.host_bytes,
                    "nvme_bytes": s.nvme_bytes,
                }
                for s in self.stages
            ],
            "notes": self.notes,
        }


def _overheads(sh: Shape, opts: MemoryOptions, tensor_peak: int) -> int:
    world = sh.dp * sh.tp * sh.pp * sh.cp
    extra = int(tensor_peak * opts.fragmentation) + opts.context_bytes
    if world > 1:
        extra += opts.nccl_bytes
    return extra


def _stage_memory(sh: Shape, sp: StagePeak, opts: MemoryOptions) -> StageMemory:
    phase = sp.peak_phase
    tensor_peak = sp.peak
    over = _overheads(sh, opts, tensor_peak)
    breakdown = {**sp.phases[phase], "overheads": over}
    return StageMemory(
        stage=sp.stage,
        layers=sp.layers,
        in_flight=sp.in_flight,
        params=sp.param_count,
        peak_phase=phase,
        tensor_peak_bytes=tensor_peak,
        peak_bytes=tensor_peak + over,
        breakdown=breakdown,
        phases=sp.phases,
        host_bytes=sp.host_bytes,
        nvme_bytes=sp.nvme_bytes,
    )


def estimate_shape(
    sh: Shape, gpu_bytes: int | None, gpus_per_node: int, opts: MemoryOptions
) -> MemoryEstimate:
    """The estimate of an already-read :class:`Shape` (what-if variants reuse this)."""
    sh, step_note = _optimizer_step(sh, opts.device)
    which = peak_candidates(sh) if opts.worst_only else None
    stages = [_stage_memory(sh, sp, opts) for sp in stage_peaks(sh, opts.device, which)]
    worst = max(stages, key=lambda s: s.peak_bytes)
    fits = headroom = None
    if gpu_bytes is not None:
        headroom = gpu_bytes - worst.peak_bytes
        fits = headroom >= 0
    host = max(s.host_bytes for s in stages) * gpus_per_node
    nvme = max(s.nvme_bytes for s in stages) * gpus_per_node
    notes = [step_note]
    if sh.ckpt == "selective" and sh.impl == "transformers":
        notes.append("Hugging Face modules have no selective recompute: counted as none.")
    return MemoryEstimate(
        peak_bytes=worst.peak_bytes,
        tensor_peak_bytes=worst.tensor_peak_bytes,
        reserved_bytes=worst.tensor_peak_bytes
        + int(worst.tensor_peak_bytes * opts.fragmentation),
        stages=stages,
        breakdown=worst.breakdown,
        peak_stage=worst.stage,
        peak_phase=worst.peak_phase,
        gpu_bytes=gpu_bytes,
        fits=fits,
        headroom_bytes=headroom,
        host_bytes_per_node=host,
        nvme_bytes_per_node=nvme,
        num_params=total_params(sh),
        notes=notes,
    )


def _optimizer_step(sh: Shape, device: str) -> tuple[Shape, str]:
    """The optimizer step the estimate assumes, and the note that says which and why:
    ``optimizer.impl`` when given; else fused when ``optimizer.fused``, else torch's
    default for the device (multi-tensor foreach on CUDA, the per-tensor loop on CPU)."""
    if sh.optimizer_impl != "auto":
        kind = "fused" if sh.fused else "foreach" if sh.foreach else "for_loop"
        return sh, f"optimizer step: {sh.optimizer_impl} ({kind} temporaries), as given"
    if sh.fused:
        return sh, "optimizer step: fused (optimizer.fused), no temporaries"
    if device == "cpu":
        return sh.replace(foreach=False), (
            "optimizer step: for_loop, torch's default on CPU (one tensor's temporaries at a "
            "time); set optimizer.impl (--optimizer-impl) if the step runs otherwise"
        )
    return sh, (
        "optimizer step: foreach, torch's default on CUDA (temporaries over every parameter "
        "at once); set optimizer.impl (--optimizer-impl) if the step runs otherwise"
    )


def gpu_bytes_of(plan: Plan) -> int | None:
    """The plan's GPU memory in bytes (the name was validated against the table)."""
    return _gpu_bytes(plan.hardware.gpu) if plan.hardware.gpu else None


@lru_cache(maxsize=64)
def _gpu_bytes(name: str) -> int | None:
    gpu = find_gpu(name)
    return int(gpu.memory_gib * GIB) if gpu else None


def estimate(plan: Plan, options: MemoryOptions | None = None) -> MemoryEstimate:
    """Per-GPU peak memory of one training step of ``plan`` (max over pipeline stages).

    Raises :class:`~sapper.errors.InputError` when the plan lacks the model, the micro
    batch or the sequence length, or describes something impossible.
    """
    sh = shape_from_plan(plan)
    est = estimate_shape(
        sh, gpu_bytes_of(plan), plan.hardware.gpus_per_node, options or MemoryOptions()
    )
    if plan.dp_degree is None:
        est.notes.append(
            "data-parallel degree unknown (GPU count not given or not divisible by "
            "TP·PP·CP): nothing is sharded over data parallelism"
        )
    return est
