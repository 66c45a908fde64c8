"""Checklist item 5 (seed §5.1): does the job fit, and if not, what to change first.

The verdict states the peak against the GPU, the dominant part (seed §3.1: model states
call for ZeRO or model parallelism, activations for checkpointing or a smaller batch),
and the seed's remedies in its order (§3.4: checkpointing first, then a ZeRO stage, then
offload, then tensor/pipeline parallelism), each with the memory it would give on its
own. A what-if table crosses ZeRO stage × checkpointing × micro batch, and a search
finds the largest micro batch and sequence length that fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sapper.memory.estimate import (
    MemoryEstimate,
    MemoryOptions,
    estimate_shape,
    gpu_bytes_of,
)
from sapper.memory.inputs import Shape, shape_from_plan
from sapper.plan.schema import Plan

__all__ = ["MemoryVerdict", "Remedy", "WhatIf", "largest_fitting", "verdict"]

#: Categories that make up the model states (seed §3.1).
STATES = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class Remedy:
    """One change from the seed's list, evaluated on its own."""

    name: str  # e.g. "checkpointing: full"
    change: dict[str, object]  # plan fields it sets
    peak_bytes: int
    saves_bytes: int  # current peak - new peak (per GPU)
    fits: bool | None
    note: str = ""


@dataclass(frozen=True)
class WhatIf:
    zero: int
    checkpointing: str
    micro_batch: int
    peak_bytes: int
    fits: bool | None


@dataclass
class MemoryVerdict:
    estimate: MemoryEstimate
    dominant: str  # params / grads / optimizer / activations / temporaries
    dominant_part: str  # "model states" or "activations" or "temporaries"
    states_bytes: int  # params + grads + optimizer at the peak stage
    states_exceed_gpu: bool
    remedies: list[Remedy] = field(default_factory=list)
    what_if: list[WhatIf] = field(default_factory=list)
    max_micro_batch: int | None = None  # largest that fits (None: no GPU, or not even 1)
    max_seq_len: int | None = None
    notes: list[str] = field(default_factory=list)
    #: The DeepSpeed ZeRO sizes the estimate used and where each came from (ZeRO under
    #: DeepSpeed only; memory/buckets.py).
    zero_buckets: list[dict[str, object]] | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "fits": self.estimate.fits,
            "headroom_bytes": self.estimate.headroom_bytes,
            "dominant": self.dominant,
            "dominant_part": self.dominant_part,
            "states_bytes": self.states_bytes,
            "states_exceed_gpu": self.states_exceed_gpu,
            "remedies": [r.__dict__ for r in self.remedies],
            "what_if": [w.__dict__ for w in self.what_if],
            "max_micro_batch": self.max_micro_batch,
            "max_seq_len": self.max_seq_len,
            "notes": self.notes,
            "zero_buckets": self.zero_buckets,
        }


class _Evaluator:
    def __init__(self, plan: Plan, options: MemoryOptions) -> None:
        self.plan = plan
        self.gpu = gpu_bytes_of(plan)
        self.gpn = plan.hardware.gpus_per_node
        self.opts = options

    def run(self, sh: Shape) -> MemoryEstimate:
        return estimate_shape(sh, self.gpu, self.gpn, self.opts)

    def fits(self, sh: Shape) -> bool:
        return self.gpu is not None and self.run(sh).peak_bytes <= self.gpu


def _remedies(ev: _Evaluator, sh: Shape, base: MemoryEstimate) -> list[Remedy]:
    out: list[Remedy] = []

    def add(name: str, change: dict[str, object], new: Shape, note: str = "") -> None:
        est = ev.run(new)
        out.append(
            Remedy(name, change, est.peak_bytes, base.peak_bytes - est.peak_bytes, est.fits, note)
        )

    # 1. activation checkpointing (seed §3.2): whole blocks
    if sh.ckpt != "full" or sh.ckpt_every != 1:
        add(
            "activation checkpointing: full",
            {"parallel.checkpointing.granularity": "full"},
            sh.replace(ckpt="full", ckpt_every=1),
            "≈30% more compute",
        )
    # 2. a ZeRO stage (seed §3.3): the lowest stage that fits, else stage 3
    if sh.dp * sh.cp > 1 and sh.zero < 3:
        chosen = None
        for stage in range(sh.zero + 1, 4):
            chosen = stage
            if ev.fits(sh.replace(zero=stage)):
                break
        assert chosen is not None
        note = "shards " + {1: "optimizer states", 2: "optimizer states and gradients",
                            3: "states, gradients and parameters"}[chosen]
        add(f"ZeRO stage {chosen}", {"parallel.zero_stage": chosen},
            sh.replace(zero=chosen), note)
    # 3. offload (seed §3.4: last, for speed-insensitive jobs)
    if sh.offload_optimizer == "none" and sh.zero >= 1:
        add("offload optimizer states to CPU", {"parallel.offload_optimizer": "cpu"},
            sh.replace(offload_optimizer="cpu"), "bounded by PCIe bandwidth and host memory")
    elif sh.offload_optimizer == "none" and sh.dp * sh.cp > 1:
        add("ZeRO stage 1 + offload optimizer to CPU",
            {"parallel.zero_stage": 1, "parallel.offload_optimizer": "cpu"},
            sh.replace(zero=1, offload_optimizer="cpu"), "bounded by PCIe bandwidth")
    # 4. model parallelism (seed §4.2: TP within a node, then PP)
    if sh.heads % (sh.tp * 2) == 0 and sh.tp * 2 <= ev.gpn:
        dp = sh.dp // 2 if sh.dp % 2 == 0 else sh.dp
        add(f"tensor parallel {sh.tp * 2}", {"parallel.tp": sh.tp * 2},
            sh.replace(tp=sh.tp * 2, dp=max(dp, 1)), "keep TP inside the NVLink domain")
    if sh.layers >= sh.pp * 2 * sh.vpp:
        dp = sh.dp // 2 if sh.dp % 2 == 0 else sh.dp
        # A hand-set first/last stage split was for the old depth: split evenly again.
        change: dict[str, object] = {"parallel.pp": sh.pp * 2}
        if sh.first_layers is not None or sh.last_layers is not None:
            change.update({"parallel.first_stage_layers": None,
                           "parallel.last_stage_layers": None})
        add(f"pipeline parallel {sh.pp * 2}", change,
            sh.replace(pp=sh.pp * 2, dp=max(dp, 1), first_layers=None, last_layers=None),
            "adds bubbles; more micro-batches")
    return out


def _micro_batches(mb: int) -> list[int]:
    values = {1, max(mb // 2, 1), mb, mb * 2}
    return sorted(values)


def _what_if(ev: _Evaluator, sh: Shape) -> list[WhatIf]:
    stages = [0, 1, 2, 3] if sh.dp * sh.cp > 1 else [sh.zero]
    ckpts = ["none", "full"] if sh.impl == "transformers" else ["none", "selective", "full"]
    rows = []
    for z in stages:
        for ck in ckpts:
            for mb in _micro_batches(sh.micro_batch):
                est = ev.run(sh.replace(zero=z, ckpt=ck, ckpt_every=1, micro_batch=mb))
                rows.append(WhatIf(z, ck, mb, est.peak_bytes, est.fits))
    return rows


def largest_fitting(ev: _Evaluator, sh: Shape, field_name: str, step: int, cap: int) -> int | None:
    """Largest multiple of ``step`` (≤ ``cap``) for ``field_name`` that fits, by doubling
    then bisection (the peak grows monotonically with batch and sequence)."""
    if ev.gpu is None or not ev.fits(sh.replace(**{field_name: step})):
        return None
    lo = step
    hi = step * 2
    while hi <= cap and ev.fits(sh.replace(**{field_name: hi})):
        lo, hi = hi, hi * 2
    hi = min(hi, cap + step)
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if ev.fits(sh.replace(**{field_name: mid})):
            lo = mid
        else:
            hi = mid
    return lo


def verdict(plan: Plan, options: MemoryOptions | None = None) -> MemoryVerdict:
    """Fits or not, why, and what to change first."""
    opts = options or MemoryOptions()
    sh = shape_from_plan(plan)
    ev = _Evaluator(plan, opts)
    est = ev.run(sh)
    cats = {k: v for k, v in est.breakdown.items() if k != "overheads"}
    dominant = max(cats, key=lambda k: cats[k])
    states = sum(est.breakdown.get(k, 0) for k in STATES)
    part = "model states" if states >= max(cats["activations"], cats["temporaries"]) else (
        "activations" if cats["activations"] >= cats["temporaries"] else "temporaries"
    )
    worst_states = max(
        sum(st.phases["optimizer"][k] for k in STATES) for st in est.stages
    )
    exceed = est.gpu_bytes is not None and worst_states > est.gpu_bytes
    v = MemoryVerdict(est, dominant, part, worst_states, exceed)
    if est.gpu_bytes is not None:
        v.remedies = _remedies(ev, sh, est)
        v.max_micro_batch = largest_fitting(ev, sh, "micro_batch", 1, 1 << 16)
        step = 128 * sh.cp
        v.max_seq_len = largest_fitting(ev, sh, "seq", step, 1 << 22)
    v.what_if = _what_if(ev, sh)
    if sh.dp * sh.cp == 1:
        v.notes.append("One data-parallel rank: ZeRO has nothing to shard over.")
    if sh.zero and sh.buckets.deepspeed:
        v.zero_buckets = sh.buckets.to_json()
    return v
