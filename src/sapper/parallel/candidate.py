"""What a layout search hands on: its ranked candidates, the layout at a row of the
batch, and the memory probe it used, so that :mod:`sapper.parallel.explain` can explain
the ranking without importing the search that made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sapper.parallel.cost import LayoutBatch, StepCost
from sapper.parallel.layout import CHECKPOINTING, Layout

__all__ = ["Candidate", "MemoryProbe", "layout_at"]


class MemoryProbe(Protocol):
    """The memory checks of one search: whether the layout at a row of the batch fits
    (with its peak GiB, or a floor on it, when known), and how many estimates it ran."""

    calls: int

    def fits(self, i: int) -> tuple[bool, float | None]: ...


@dataclass
class Candidate:
    """One layout with its predicted cost, memory and the reasons it ranks where it does."""

    layout: Layout
    cost: StepCost
    fits: bool | None = None
    memory_gib: float | None = None
    warnings: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout.describe(),
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "cp": self.layout.cp,
            "dp": self.layout.dp,
            "ep": self.layout.ep,
            "zero_stage": self.layout.zero,
            "checkpointing": self.layout.checkpointing,
            "micro_batch_size": self.layout.micro_batch,
            "gradient_accumulation_steps": self.layout.grad_accum,
            "virtual_pipeline_stages": self.layout.virtual_stages,
            "first_stage_layers": self.layout.first_stage_layers,
            "last_stage_layers": self.layout.last_stage_layers,
            "sequence_parallel": self.layout.sequence_parallel,
            "fits": self.fits,
            "memory_gib": self.memory_gib,
            "cost": self.cost.to_json(),
            "warnings": self.warnings,
            "why": self.why,
        }



def layout_at(b: LayoutBatch, i: int, order: str) -> Layout:
    """Row ``i`` of a layout batch as a :class:`Layout` under rank order ``order``."""
    v = int(b.v[i])
    first = int(b.first[i]) if b.first is not None else 0
    last = int(b.last[i]) if b.last is not None else 0
    return Layout(
        tp=int(b.tp[i]), pp=int(b.pp[i]), cp=int(b.cp[i]), dp=int(b.dp[i]), ep=int(b.ep[i]),
        zero=int(b.zero[i]), checkpointing=CHECKPOINTING[int(b.ckpt[i])],
        micro_batch=int(b.micro[i]), grad_accum=int(b.ga[i]), virtual_stages=v,
        sequence_parallel=bool(b.sp[i]), schedule="interleaved" if v > 1 else "1f1b",
        rank_order=order, overlap_dp_comm=bool(b.overlap[i]),
        overlap_param_gather=bool(b.overlap_ag[i]), tp_comm_overlap=bool(b.overlap_tp[i]),
        pipeline_scatter_gather=bool(b.pp_split[i]),
        first_stage_layers=first or None, last_stage_layers=last or None,
    )
