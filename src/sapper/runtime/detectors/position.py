"""Position overflow (seed §5.3): sequences longer than the positions the model has.

A learned position table indexed past its end raises (CPU) or trips a device-side assert
(CUDA) in the middle of a step; some code paths clamp or wrap instead, and RoPE models
simply extrapolate past the context they were trained at. Either way the model sees
positions it never learned. The live monitor checks every micro-batch's length and
position ids *before* the forward pass and records ``extra["max_position"]`` (largest
position index used, 0-based), ``extra["position_limit"]`` (table size or trained
context) and ``extra["position_kind"]`` (``learned`` / ``rope``).
"""

from __future__ import annotations

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector
from sapper.runtime.records import StepRecord

__all__ = ["POSITION_OVERFLOW", "PositionDetector"]

POSITION_OVERFLOW = register(
    Rule(
        code="R090",
        name="position-overflow",
        check="data",
        severity=Severity.ERROR,
        title="Positions beyond the model's position table or trained context",
        why="""\
A learned position table has max_position_embeddings rows: a longer sequence indexes past
it (a crash, or silent clamping/wrapping in some kernels); RoPE models run past the context
they were trained at and attend with rotations they never saw. Either way the model is fed
positions it cannot represent, silently degrading it.

Frameworks: any model with learned or RoPE positions that the live monitor watches (the
position indices it sees); not readable from a log.""",
        signs="""\
Sequence length or position ids ≥ max_position_embeddings; a loss that is worse on long
samples; a device-side assert in an embedding lookup.""",
        fix="""\
Truncate or pack sequences to the model's context; or extend the context on purpose
(RoPE scaling with the right original_max_position_embeddings, a resized position
table) and fine-tune on long data.""",
        seed="§5.3",
    )
)


class PositionDetector(RuleDetector):
    """R090 over ``extra["max_position"]`` and the model's limit."""

    name = "position"
    rules = (POSITION_OVERFLOW,)
    cooldown = None

    def __init__(self, *, limit: int | None = None, kind: str | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.kind = kind
        self.positions_seen = False

    def unevaluated(self) -> list[str]:
        """R090 reads the largest position index per step, which only the live monitor
        records."""
        if self.positions_seen:
            return []
        return [
            "R090 position overflow: not evaluated — needs the live monitor's position "
            "indices (max_position per step)"
        ]

    def update(self, record: StepRecord) -> list[Finding]:
        pos = record.extra.get("max_position")
        self.positions_seen = self.positions_seen or isinstance(pos, int)
        limit = record.extra.get("position_limit") or self.limit
        if not isinstance(pos, int) or not isinstance(limit, int) or pos < limit:
            return []
        kind = record.extra.get("position_kind") or self.kind
        what = {
            "learned": "the learned position table has",
            "rope": "RoPE was trained on",
        }.get(kind or "", "the model supports")
        return self.fire(
            POSITION_OVERFLOW,
            record.step,
            f"position index {pos} used at step {record.step} (sequence of {pos + 1}+ tokens); "
            f"{what} {limit} positions",
            value=pos,
            threshold=limit - 1,
        )
